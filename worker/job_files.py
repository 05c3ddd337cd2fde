"""The worker's own files in a job folder, opened so that no path a trainer can change is followed.

A job folder `jobs/<id>/` and each `attempt-<N>/` in it belong to the worker (root, mode 0755): the
trainer may read them, never create, rename or replace anything in them. What the trainer writes
goes to descriptors the worker opened for it (its log as stdout and stderr, its events as fd 3) or
into `output/` and `cache/`, which are the trainer's. Every open here is relative to a directory
descriptor, with O_NOFOLLOW, and takes regular files only (a FIFO would block a read, a device
would be a device); what is read back is bounded in size. A folder that is not the worker's, or a
symlink where a folder should be, is refused: an older layout gave `attempt-<N>` to the trainer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO is refused at fstat, not waited on


class UnsafeJobFile(OSError):
    """A name in a job folder is not what the worker made it (a symlink, a FIFO, someone else's)."""


def worker_dir(path: Path, *, parent_fd: int | None = None) -> int:
    """A descriptor of folder `path` (made if missing), which is the worker's: owned by its uid, writable
    by no one else. An existing folder of a trainer's (an older layout) is taken back."""
    name = path.name if parent_fd is not None else str(path)
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as err:
        raise UnsafeJobFile(f"{path} is not a folder of the worker's ({err.strerror})") from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, 0o755)
    return fd


def attempt_dir(job_dir: Path, attempt_name: str) -> int:
    """`jobs/<id>/<attempt_name>` as a descriptor, both folders the worker's."""
    job_dir.parent.mkdir(parents=True, exist_ok=True)  # `jobs/`: the worker's, like the storage root
    job_fd = worker_dir(job_dir)
    try:
        return worker_dir(job_dir / attempt_name, parent_fd=job_fd)
    finally:
        os.close(job_fd)


def _regular(fd: int, name: str) -> int:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeJobFile(f"{name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """`name` in the folder `dir_fd`, never through a symlink, a regular file only."""
    try:
        fd = os.open(name, flags | _FILE, mode, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == 40:  # ELOOP: the name is a symlink
            raise UnsafeJobFile(f"{name} is a symlink") from None
        raise
    return _regular(fd, name)


def write_file(dir_fd: int, name: str, data: bytes) -> None:
    """Replace `name` by a file holding `data` (written beside it, then renamed over it). The file beside
    it has a name of this call's own: the workers of a multi-node job on one host write the same names
    into one attempt folder at once, and a shared name let one remove the other's before its rename."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = open_file(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def read_file(dir_fd: int, name: str, limit: int) -> bytes:
    """At most the first `limit` bytes of `name`."""
    fd = open_file(dir_fd, name, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_tail(path: Path, limit: int) -> bytes:
    """At most the last `limit` bytes of the file `path` in a folder of the worker's; b'' if it cannot be read."""
    try:
        dir_fd = os.open(path.parent, _DIR)
    except OSError:
        return b""
    try:
        fd = open_file(dir_fd, path.name, os.O_RDONLY)
    except OSError:
        return b""
    finally:
        os.close(dir_fd)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit))
    finally:
        os.close(fd)


def touch(dir_fd: int, name: str) -> None:
    """Create `name` (empty) unless it is there."""
    os.close(open_file(dir_fd, name, os.O_WRONLY | os.O_CREAT))


def remove(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


@contextlib.contextmanager
def opened_dir(path: Path) -> Iterator[int]:
    """An existing folder of the worker's, as a descriptor for the block."""
    fd = os.open(path, _DIR)
    try:
        yield fd
    finally:
        os.close(fd)
