"""The worker's opens in a job folder (worker/job_files.py) and the bounds on what it reads back, on real
files, FIFOs and processes (light). A hostile trainer trying them is test_trainer_confinement.py."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from worker import job_files
from worker.agent import _log_tail
from worker.trainer_process import LOG_TAIL_BYTES, MAX_EVENT_LINE, JobFolder, TrainerProcess

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root owns folders a trainer's uid cannot write")


@root_only
def test_an_attempt_folder_a_trainer_owned_is_taken_back(tmp_path):
    attempt = tmp_path / "jobs" / "j" / "attempt-1"
    attempt.mkdir(parents=True)
    os.chown(attempt, 65534, 65534)  # an older layout gave it to the trainer
    attempt.chmod(0o777)
    os.close(job_files.attempt_dir(tmp_path / "jobs" / "j", "attempt-1"))
    info = attempt.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755)


def test_a_symlink_or_a_fifo_is_refused_at_once_never_followed_or_waited_on(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("token")
    (tmp_path / "trainer.log").symlink_to(secret)
    os.mkfifo(tmp_path / "events.jsonl")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(job_files.UnsafeJobFile, match="symlink"):
            job_files.open_file(fd, "trainer.log", os.O_RDONLY)
        with pytest.raises(job_files.UnsafeJobFile, match="symlink"):
            job_files.touch(fd, "trainer.log")  # root would have created or touched the target
        started = time.monotonic()
        with pytest.raises(job_files.UnsafeJobFile, match="not a regular file"):
            job_files.read_file(fd, "events.jsonl", 100)
        assert time.monotonic() - started < 5  # no writer on the FIFO, and no wait for one
    finally:
        os.close(fd)
    assert _log_tail(tmp_path / "trainer.log") == ""  # an exit event quotes nothing through the link
    assert secret.read_text() == "token"


def test_the_log_tail_an_exit_event_quotes_is_bounded(tmp_path):
    (tmp_path / "trainer.log").write_bytes(b"x" * (3 * LOG_TAIL_BYTES) + b"\nlast line\n")
    tail = _log_tail(tmp_path / "trainer.log")
    assert tail.endswith("last line") and len(tail) <= LOG_TAIL_BYTES


async def test_an_event_line_over_the_limit_is_skipped_and_the_next_one_read(tmp_path):
    folder = JobFolder(tmp_path / "jobs" / "j")
    trainer = TrainerProcess("j", 1, [0], folder)
    fd = job_files.attempt_dir(folder.root, "attempt-1")
    try:
        events = job_files.open_file(fd, "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        trainer._events_fd = job_files.open_file(fd, "events.jsonl", os.O_RDONLY)
    finally:
        os.close(fd)
    huge = json.dumps({"event": "progress", "step": 1, "padding": "p" * (2 * MAX_EVENT_LINE)})
    os.write(events, (huge + "\n" + json.dumps({"event": "progress", "step": 2}) + "\n").encode())
    os.close(events)
    trainer.process = await asyncio.create_subprocess_exec("sleep", "0.5")  # a process to follow until it ends
    seen = []

    async def sink(job_id, attempt, seq, event):
        seen.append(event)

    await trainer.follow(sink, poll_s=0.05)
    assert [e["step"] for e in seen] == [2], [len(json.dumps(e)) for e in seen]
    assert trainer.exit_code == 0 and trainer._events_fd is None  # released once it ended
