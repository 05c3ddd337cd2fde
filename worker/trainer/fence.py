"""The attempt fence: a job's current attempt number, in `jobs/<id>/fence`, that checkpoints obey.

When a node is lost, its partitioned trainer may still run while the job's next attempt starts
elsewhere on the same shared folder. Each worker raises the fence to the attempt it launches
(never lowers it); a trainer publishes, replaces or prunes checkpoints only while holding the
fence's lock and only if the fence still names its own attempt. So once a newer attempt has
started, an older one cannot touch `output/`: it stops with `Superseded` instead.

The lock is flock(2) on the fence file (NFSv4 and local file systems honour it). The file is the
worker's (the trainer's uid can read and lock it, not write it). Importable without torch.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

FENCE_FILE_ENV = "ADC_FENCE_FILE"
ATTEMPT_ENV = "ADC_ATTEMPT"


class Superseded(RuntimeError):
    """A newer attempt of the job has started: this one may not write checkpoints."""


def _read(fd: int) -> int:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode(errors="replace").strip()
    return int(text) if text.isdigit() else 0


def raise_fence(path: Path, attempt: int) -> int:
    """The worker, before it launches `attempt`: the fence names at least that attempt from now on."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for a publish in progress to finish
        current = _read(fd)
        if attempt > current:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{attempt}\n".encode(), 0)
            os.fsync(fd)
            current = attempt
        return current
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding(path: str | os.PathLike | None, attempt: int | None) -> Iterator[None]:
    """Run the body only while `attempt` is the job's current one, with the fence locked.
    No fence (a trainer run by hand) means no check."""
    if not path or attempt is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = _read(fd)
        if current > attempt:
            raise Superseded(f"attempt {attempt} was superseded by attempt {current}: its checkpoint is not published")
        yield
    finally:
        os.close(fd)


def from_environment() -> tuple[str | None, int | None]:
    attempt = os.environ.get(ATTEMPT_ENV)
    return os.environ.get(FENCE_FILE_ENV) or None, int(attempt) if attempt and attempt.isdigit() else None
