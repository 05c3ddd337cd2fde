"""The UNIX socket of a serving job's attempt: `jobs/<id>/attempt-<N>/serve.sock`.

The worker binds and listens; the sandboxed trainer gets only the listening descriptor (inherited, as
its events descriptor is) and accepts on it: it needs no network, and no path it could change is
followed. The attempt folder is the worker's (worker/job_files.py), so the trainer cannot put anything
else at that name. Paths are reached through the folder's descriptor (`/proc/self/fd/<fd>/serve.sock`),
never through a path a trainer could swap, and so stay within AF_UNIX's 108 bytes however deep the
storage root is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from worker import job_files

SOCKET_NAME = "serve.sock"
BACKLOG = 64


def _via(dir_fd: int) -> str:
    return f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"


def listen(attempt_fd: int) -> socket.socket:
    """A listening socket at `serve.sock` in the attempt folder (a stale one is replaced), owner-only."""
    job_files.remove(attempt_fd, SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(_via(attempt_fd))
        os.chmod(SOCKET_NAME, 0o600, dir_fd=attempt_fd)  # just made, in a folder only the worker writes
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def address(attempt_dir: Path) -> Iterator[str]:
    """For the block, an address to connect to the attempt's socket: through a descriptor of the worker's
    attempt folder, which must hold a socket by that name (never a symlink to one elsewhere)."""
    with job_files.opened_dir(attempt_dir) as dir_fd:
        info = os.stat(SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
            raise job_files.UnsafeJobFile(f"{attempt_dir / SOCKET_NAME} is not the worker's socket")
        yield _via(dir_fd)
