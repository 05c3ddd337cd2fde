"""Folders put into a running sandbox's mount namespace, with the new mount API (Linux 5.2+, x86_64).

A standby trainer (worker/standby.py) is a sandbox built before its job is known; when it is handed a
job, the job's folders appear in its view as bwrap would have bound them at a fresh start:

1. the worker (root, in its own mount namespace) opens each folder with `openat2(RESOLVE_NO_SYMLINKS)`
   (a path with a symlink anywhere in it is refused: nothing a trainer planted is followed), then
   `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy of the mounts there, which it marks
   nosuid and nodev, and read-only unless it is the job's own folder (`mount_setattr`), as bwrap does;
2. a short-lived child of the worker opens the mount namespace of bwrap's own init process, checks it
   is the one that process had when the standby got ready, and enters it. `setns` on a mount namespace
   demands file-system attributes shared with no other thread, and a library's at-fork hook may start
   one in any forked child (OpenTelemetry's batch span processor does), so the child first takes its
   own (`unshare(CLONE_FS)`). It creates
   the mountpoint inside the sandbox's empty tmpfs (root's, mode 0755: the trainer cannot write there)
   one component at a time without following a symlink, and attaches the copy there with `move_mount`.

Nothing else of the worker's view crosses, and the trainer itself never holds a capability: only
root in the worker's namespace can do this.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_setns = _libc.setns
_unshare = _libc.unshare

# x86_64 syscall numbers and the flags used (linux/mount.h, linux/openat2.h).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_FSOPEN = 430
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
SYS_OPENAT2 = 437
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_NO_MAGICLINKS = 0x02
CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200
FSOPEN_CLOEXEC = 1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 1
_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MountError(OSError):
    """A folder could not be put into the sandbox."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")
    return int(result)


def open_no_symlinks(path: Path) -> int:
    """An O_PATH descriptor of folder `path`, an absolute path with no symlink anywhere in it."""
    how = struct.pack("QQQ", _PATH_DIR & ~os.O_NOFOLLOW, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    buf = ctypes.create_string_buffer(how, len(how))
    return _check(_syscall(SYS_OPENAT2, AT_FDCWD, os.fsencode(str(path)), buf, len(how)), f"open {path}")


def clone_tree(path: Path, *, writable: bool) -> int:
    """A detached copy of the mounts at folder `path`, nosuid and nodev, read-only unless `writable`."""
    fd = open_no_symlinks(path)
    try:
        tree = _check(
            _syscall(SYS_OPEN_TREE, fd, b"", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH),
            f"open_tree {path}",
        )
    finally:
        os.close(fd)
    flags = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (0 if writable else MOUNT_ATTR_RDONLY)
    attr = ctypes.create_string_buffer(struct.pack("QQQQ", flags, 0, 0, 0), 32)
    try:
        _check(_syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, attr, 32), f"mount_setattr {path}")
    except BaseException:
        os.close(tree)
        raise
    return tree


def empty_tmpfs() -> int:
    """A detached empty tmpfs (root's, mode 0755, nosuid, nodev): bwrap's `--tmpfs` mask of a folder."""
    fs = _check(_syscall(SYS_FSOPEN, b"tmpfs", FSOPEN_CLOEXEC), "fsopen tmpfs")
    try:
        _check(_syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, b"mode", b"0755", 0), "fsconfig mode")
        _check(_syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        return _check(_syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV), "fsmount tmpfs")
    finally:
        os.close(fs)


def _mountpoint(path: Path) -> int:
    """In the child, inside the sandbox's namespace: folder `path`, created where missing (root's, mode
    0755, as bwrap's `--dir`), walked one component at a time from `/`, never through a symlink. A
    folder on the way that the trainer could have made or changed (not root's, on a writable mount, such
    as its private /tmp) is refused."""
    fd = os.open("/", _PATH_DIR)
    try:
        for part in path.parts[1:]:
            try:
                nxt = os.open(part, _PATH_DIR, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _PATH_DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if os.fstat(fd).st_uid != 0 and not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
                raise MountError(0, f"{path}: {part} on the way is not root's")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _attach(namespace: tuple[int, int, int], mounts: list[tuple[int, Path]]) -> None:
    pid, dev, ino = namespace
    ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    info = os.fstat(ns_fd)
    if (info.st_dev, info.st_ino) != (dev, ino):
        raise MountError(0, f"process {pid} is no longer in the mount namespace it had")
    _check(_unshare(CLONE_FS), "unshare CLONE_FS")
    _check(_setns(ns_fd, CLONE_NEWNS), "setns")
    os.close(ns_fd)
    for tree, path in mounts:
        target = _mountpoint(path)
        try:
            _check(
                _syscall(SYS_MOVE_MOUNT, tree, b"", target, b"", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
                f"move_mount {path}",
            )
        finally:
            os.close(target)


def attach(namespace: tuple[int, int, int], mounts: list[tuple[int, Path]]) -> None:
    """Attach each detached tree at its path inside the mount namespace `namespace` (the pid of a process
    in it, and the namespace's st_dev and st_ino), in order (outermost first), from a forked child;
    MountError if any step failed (what was attached stays: the caller ends that sandbox)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: syscalls only, then _exit
        code = 0
        try:
            os.close(read)
            _attach(namespace, mounts)
        except BaseException as err:  # noqa: BLE001 - reported to the parent through the pipe
            code = 1
            try:
                os.write(write, str(err).encode()[:2000])
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)
    os.close(write)
    try:
        message = b""
        while chunk := os.read(read, 4096):
            message += chunk
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise MountError(0, message.decode(errors="replace") or f"mount child ended with status {status}")
