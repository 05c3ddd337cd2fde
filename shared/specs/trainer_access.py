"""Whether a job's trainer will be able to read a model folder, judged at submission.

The trainer runs as an unprivileged uid (tenancy.sandbox: one user for all, one uid per team, or
one per job) with no supplementary groups; the api runs as another. A folder the api could read
but the trainer could not was queued, and the job failed seconds into its start with "No such
file or directory". Here the folder and each file in it (a symlink judged by what it points to,
as the trainer's open is) are checked by their mode bits against the trainer's uid and gid, from
the team root that holds the folder downwards: the sandbox shows each root at its own path, so
the folders above a root do not matter. POSIX ACLs are not read: a folder shared by an ACL only
is refused (give it mode bits).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.infra.config import SandboxConfig

MAX_ENTRIES = 10_000  # entries of a model folder looked at
READ, SEARCH = 4, 1


@dataclass(frozen=True)
class Reader:
    """Who the trainer runs as. uid None: a uid not known before the job exists (per-job mode), so
    only what every user may read counts."""

    uid: int | None
    gid: int | None
    who: str

    def may(self, info: os.stat_result, bits: int) -> bool:
        if self.uid is not None and info.st_uid == self.uid:
            return (info.st_mode >> 6) & bits == bits
        if self.gid is not None and info.st_gid == self.gid:
            return (info.st_mode >> 3) & bits == bits
        return info.st_mode & bits == bits


def trainer_reader(sandbox: SandboxConfig, team: str) -> Reader | None:
    """The trainer of a job of `team`, as the worker's sandbox will run it; None where no check is
    possible or needed (a uid the worker refuses anyway, or root)."""
    if sandbox.uid_mode == "per_team":
        uid = sandbox.team_uids.get(team)
        return Reader(uid, uid, f"uid {uid} (tenancy.sandbox.team_uids)") if uid else None
    if sandbox.uid_mode == "per_job":
        return Reader(None, None, "a uid of its own (tenancy.sandbox per_job), so only what every user may read")
    try:
        entry = pwd.getpwuid(sandbox.user) if isinstance(sandbox.user, int) else pwd.getpwnam(sandbox.user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if not isinstance(sandbox.user, int):
            return None  # unknown here: the worker names it
        uid, gid = sandbox.user, sandbox.user
    return None if uid == 0 else Reader(uid, gid, f"uid {uid} ({sandbox.user}, tenancy.sandbox.user)")


def within(path: Path, roots: Iterable[Path]) -> bool:
    """`path` is one of `roots` or lies under one, compared part by part as `PurePath.is_relative_to`
    does. On their strings: pathlib's comparison built two paths per root, the largest part of checking
    a spec's paths against a team's roots."""
    s = str(path)
    for root in roots:
        r = str(root)
        if s[:1] != "/" or r[:1] != "/" or s[:2] == "//" or r[:2] == "//":  # relative, or POSIX's "//" root
            if path == root or path.is_relative_to(root):
                return True
        elif s == r or s.startswith(r if r == "/" else r + "/"):
            return True
    return False


def _why(path: Path, info: os.stat_result, reader: Reader, what: str) -> str:
    return (
        f"{str(path)!r} is not {what} by the trainer, which runs as {reader.who}: mode "
        f"{stat.filemode(info.st_mode)}, owner uid {info.st_uid}, group {info.st_gid}"
    )


def unreadable(folder: Path, root: Path, reader: Reader) -> str | None:
    """Why the trainer could not read model `folder` (resolved, inside `root`), or None."""
    chain = [folder, *(p for p in folder.parents if within(p, (root,)))]
    for directory in reversed(chain):
        info = directory.stat()
        bits = READ | SEARCH if directory == folder else SEARCH
        if not reader.may(info, bits):
            return _why(directory, info, reader, "readable" if directory == folder else "searchable")
    with os.scandir(folder) as entries:
        for n, entry in enumerate(entries):
            if n >= MAX_ENTRIES:
                break
            try:
                info = entry.stat()  # followed: what the trainer opens
            except OSError:
                continue  # a dangling link: the model check or the load names it
            if stat.S_ISREG(info.st_mode) and not reader.may(info, READ):
                return _why(Path(entry.path), info, reader, "readable")
            if entry.is_symlink() and stat.S_ISREG(info.st_mode):
                target = Path(os.path.realpath(entry.path)).parent  # a hub cache's blobs/ folder
                if target != folder and not reader.may(target.stat(), SEARCH):
                    return _why(target, target.stat(), reader, "searchable")
    return None
