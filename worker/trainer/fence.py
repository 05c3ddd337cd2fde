"""The attempt fence: a job's current attempt number, in `jobs/<id>/fence`, that checkpoints obey.

When a node is lost, its partitioned trainer may still run while the job's next attempt starts
elsewhere on the same shared folder. Each worker raises the fence to the attempt it launches
(never lowers it); a trainer publishes, replaces or prunes checkpoints only while holding the
fence's lock and only if the fence still names its own attempt. So once a newer attempt has
started, an older one cannot touch `output/`: it stops with `Superseded` instead. The same holds
for the final model: what transformers' Trainer writes into the run's own output folder at the
end (`_save`: the weights or adapter, config and tokenizer; `save_state`: trainer_state.json;
`save_metrics`: the results files) is written under the lock, or refused (`guard_final_output`),
and so is the final model ADC copies from a checkpoint already at max_steps (`holding`).

The lock is flock(2) on the fence file (NFSv4 and local file systems honour it). The file is the
worker's (the trainer's uid can read and lock it, not write it). Importable without torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

FENCE_FILE_ENV = "ADC_FENCE_FILE"
ATTEMPT_ENV = "ADC_ATTEMPT"


class Superseded(RuntimeError):
    """A newer attempt of the job has started: this one may not write checkpoints."""


def _read(fd: int) -> int:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode(errors="replace").strip()
    return int(text) if text.isdigit() else 0


def raise_fence(path: Path, attempt: int) -> int:
    """The worker, before it launches `attempt`: the fence names at least that attempt from now on.
    Never through a symlink, a regular file only: the worker is root, the job folder is its own."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
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
            raise Superseded(
                f"attempt {attempt} was superseded by attempt {current}: it writes nothing more in output/"
            )
        yield
    finally:
        os.close(fd)


def from_environment() -> tuple[str | None, int | None]:
    attempt = os.environ.get(ATTEMPT_ENV)
    return os.environ.get(FENCE_FILE_ENV) or None, int(attempt) if attempt and attempt.isdigit() else None


def guard_final_output() -> None:
    """Fence what transformers' Trainer writes into `args.output_dir` itself (the final model and its
    state and results; a checkpoint's own folder is fenced when it is published). Only the ranks that
    write check, with the lock held while they write. No fence in the environment: nothing changes."""
    path, attempt = from_environment()
    if not path or attempt is None:
        return
    from transformers import Trainer

    def fenced(original, target_dir):
        def wrapper(trainer, *args, **kwargs):
            target = target_dir(trainer, args, kwargs)
            if not trainer.args.should_save or os.path.realpath(target) != os.path.realpath(trainer.args.output_dir):
                return original(trainer, *args, **kwargs)
            with holding(path, attempt):
                return original(trainer, *args, **kwargs)

        return wrapper

    def save_dir(trainer, args, kwargs):  # _save(output_dir=None, state_dict=None)
        return (args[0] if args else kwargs.get("output_dir")) or trainer.args.output_dir

    def output_dir(trainer, args, kwargs):
        return trainer.args.output_dir

    Trainer._save = fenced(Trainer._save, save_dir)
    Trainer.save_state = fenced(Trainer.save_state, output_dir)
    Trainer.save_metrics = fenced(Trainer.save_metrics, output_dir)
