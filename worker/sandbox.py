"""The trainer's sandbox: which uid it runs as, the environment it gets, the files it can see.

A trainer runs code the job chose (LLaMA-Factory with the job's config, and a trusted model
folder's own Python), so it gets nothing it does not need:

- an unprivileged uid (`tenancy.sandbox`: one `user` for all, one uid per team, or one per job);
  uid 0 is refused unless `allow_root` is set for development. Only a worker running as root can
  switch uids; one that is not runs its trainers as itself (and says so once);
- an environment built from scratch (`trainer_environment`): no DATABASE_URL, no bus credentials,
  no LD_PRELOAD/PYTHONPATH-style keys from anyone; NCCL tuning keys from a command only if they
  are in `NCCL_TUNING_KEYS`, which lives here, in code, so no policy or config can widen it;
- with bubblewrap (`bwrap`, Debian's `bubblewrap`): its own pid namespace and /proc (no other
  process, so no other trainer's environment or file view through /proc/<pid>/root), its own network
  namespace (worker/trainer_network.py: loopback only, or for a multi-node job its peers only), bound
  to the worker's life (`--die-with-parent`), a read-only
  view of the root file system, a private /tmp and /dev/shm, the storage root, every team's folders and `hidden_paths` replaced by
  empty folders, then only this job's folder (writable), its team's readable folders and ADC's code
  put back. bwrap runs as root to build that view (it must read the folders it binds), then execs
  `setpriv` to drop to the trainer's uid with no capabilities and no_new_privs before any
  trainer code runs. Without bwrap the uid and environment still hold; the job folder is owned
  by the trainer's uid and everything else is left to file permissions.

A standby trainer (worker/standby.py) is launched with the same arguments for no job (`writable` None:
nothing writable but its /tmp); when it is handed a job, `handoff_mounts` says which folders to mount
into its namespace (worker/mounts.py) so that its view is exactly the one `bwrap_argv` would build for
that job, or that none can make it so (the job then gets a fresh trainer).
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.infra.config import SandboxConfig

log = logging.getLogger(__name__)

# NCCL settings a command may carry (the comm_jitter rule's tuning): performance knobs only. Never
# NCCL_DEBUG_FILE, NCCL_TOPO_FILE, NCCL_NET_PLUGIN and the like, which name files or libraries.
NCCL_TUNING_KEYS = frozenset(
    {
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MAX_CTAS",
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_DISABLE",
        "NCCL_SHM_DISABLE",
        "NCCL_IB_DISABLE",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_CROSS_NIC",
        "NCCL_SOCKET_NTHREADS",
        "NCCL_NSOCKS_PERTHREAD",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
    }
)
_TUNING_VALUE = re.compile(r"^[A-Za-z0-9_.,:-]{1,64}$")
# Keys of a command's env the worker itself reads (rendezvous of a multi-node job); never passed on.
WORKER_KEYS = frozenset({"ADC_MASTER_ADDR", "ADC_MASTER_PORT"})
# What a trainer takes from the worker's own environment: locale and time zone, nothing else.
_INHERITED = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxError(RuntimeError):
    """The trainer cannot be started as configured (the start command is refused with this)."""


def command_env_problems(env: dict[str, str]) -> list[str]:
    """Keys of a start command's env that a trainer may not get."""
    problems = []
    for key, value in env.items():
        if key in WORKER_KEYS:
            continue
        if key not in NCCL_TUNING_KEYS:
            problems.append(
                f"{key} is not an NCCL tuning key this worker passes on "
                f"(allowed: {', '.join(sorted(NCCL_TUNING_KEYS))})"
            )
        elif not isinstance(value, str) or not _TUNING_VALUE.match(value):
            problems.append(f"{key}={value!r} is not a plain tuning value")
    return problems


def tuning_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in NCCL_TUNING_KEYS}


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int

    @property
    def switch(self) -> bool:
        """Whether the worker runs as someone else (only root can switch)."""
        return os.geteuid() == 0 and self.uid != os.geteuid()


def trainer_identity(config: SandboxConfig, team: str, job_id: str) -> Identity:
    """The uid and gid a job's trainer runs as."""
    if os.geteuid() != 0:
        _warn_not_root()
        return Identity(os.geteuid(), os.getegid())
    if config.uid_mode == "per_team":
        if team not in config.team_uids:
            raise SandboxError(f"team {team!r} has no uid in tenancy.sandbox.team_uids")
        uid = config.team_uids[team]
        identity = Identity(uid, uid)
    elif config.uid_mode == "per_job":
        first, count = config.uid_range
        uid = first + zlib.crc32(job_id.encode()) % count
        identity = Identity(uid, uid)
    else:
        identity = _named(config.user)
    if identity.uid == 0 and not config.allow_root:
        raise SandboxError("trainers may not run as root (tenancy.sandbox.allow_root is for development only)")
    return identity


def _named(user: str | int) -> Identity:
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        if isinstance(user, int):
            return Identity(user, user)
        raise SandboxError(f"tenancy.sandbox.user {user!r} does not exist on this node") from None
    return Identity(entry.pw_uid, entry.pw_gid)


@functools.cache
def _warn_not_root() -> None:
    log.warning(
        "the worker is not root: trainers run as its own uid %d (tenancy.sandbox cannot switch uids)", os.geteuid()
    )


def trainer_environment(
    *,
    job_dir: Path,
    python: str,
    repo_root: Path,
    inherited: dict[str, str],
    adc: dict[str, str],
    tuning: dict[str, str],
) -> dict[str, str]:
    """The whole environment of a trainer: nothing from the worker beyond locale and time zone."""
    cache = job_dir / "cache"
    env = {k: inherited[k] for k in _INHERITED if k in inherited}
    env |= {
        "PATH": f"{Path(python).parent}:{_SYSTEM_PATH}",
        "HOME": str(cache / "home"),
        "XDG_CACHE_HOME": str(cache),
        "HF_HOME": str(cache / "huggingface"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "MPLCONFIGDIR": str(cache / "matplotlib"),
        "TMPDIR": "/tmp",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(repo_root),  # ADC's trainer package, nothing from outside
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return env | adc | tuning


def own_folders(identity: Identity, folders: Iterable[Path]) -> None:
    """Make the trainer's folders its own (recursively when a folder was someone else's)."""
    if not identity.switch:
        return
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        info = os.lstat(folder)
        if (info.st_uid, info.st_gid) == (identity.uid, identity.gid):
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise SandboxError(f"{folder} is not a folder")
        os.chown(folder, identity.uid, identity.gid, follow_symlinks=False)
        # Relative to each folder's descriptor, never through a symlink: a trainer still running (an older
        # attempt on a lost node) may swap a folder for a link while root walks it.
        for _, dirnames, filenames, dir_fd in os.fwalk(folder, follow_symlinks=False):
            for name in dirnames + filenames:
                os.chown(name, identity.uid, identity.gid, dir_fd=dir_fd, follow_symlinks=False)


@functools.cache
def bubblewrap() -> str | None:
    """The bwrap binary if it works here (a container may forbid the namespaces it needs)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = subprocess.run(
        [
            path,
            "--unshare-pid",
            "--unshare-net",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "true",
        ],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        log.warning(
            "bwrap does not work here (%s); trainers run without a file-system sandbox",
            probe.stderr.decode(errors="replace").strip()[:300],
        )
        return None
    return path


def _traversable(path: Path, identity: Identity) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    if info.st_uid == identity.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


@dataclass(frozen=True)
class SandboxPlan:
    """How one trainer is confined: its identity, and with bwrap what it sees."""

    identity: Identity
    bwrap: str | None
    readable: tuple[Path, ...] = ()  # besides its job folder: team folders, a resumed checkpoint, ADC's code
    hidden: tuple[Path, ...] = ()  # storage root, every team's folders, hidden_paths

    def wrap(self, argv: list[str], job_dir: Path, *, own_network: bool = True) -> list[str]:
        """`own_network`: bwrap makes the trainer a network namespace of its own (loopback only); False
        when the worker runs it in one it made (worker/trainer_network.py)."""
        if self.bwrap is None:
            return argv
        return bwrap_argv(
            self.bwrap,
            self.identity,
            argv,
            writable=job_dir,
            readable=self.readable,
            hidden=self.hidden,
            own_network=own_network,
        )


@dataclass(frozen=True)
class View:
    """What a sandbox shows: empty folders (`masks`, tmpfs), folders bound back (`visible`, the writable
    one read-write, the others read-only), hidden files (`files`, read as empty)."""

    writable: Path | None
    masks: frozenset[Path]
    visible: frozenset[Path]
    files: frozenset[Path]

    @property
    def emptied_files(self) -> frozenset[Path]:
        """The hidden files bound to /dev/null: those not inside an empty folder already."""
        return frozenset(f for f in self.files if self.container(f) not in self.masks)

    def container(self, path: Path) -> Path | None:
        """The innermost mask or visible folder `path` lies in (None: the read-only root)."""
        folders = self.masks | self.visible
        return max((t for t in folders if t != path and _under(path, t)), key=lambda t: len(t.parts), default=None)


def sandbox_view(
    identity: Identity, *, writable: Path | None, readable: Iterable[Path], hidden: Iterable[Path]
) -> View:
    """The view bwrap builds for a trainer (see `bwrap_argv`); `writable` None: no folder of a job."""
    visible = {Path(os.path.realpath(p)) for p in readable if Path(p).exists()}
    if writable is not None:  # its own checkpoints stay writable
        visible = {p for p in visible if not _under(p, writable)} | {writable}
    hidden = {Path(os.path.realpath(h)) for h in hidden}
    files = {h for h in hidden if h.is_file()}  # a hidden file reads as empty
    masks = {Path("/tmp")} | {h for h in hidden - files if h.is_dir()}  # what does not exist needs no hiding
    for path in visible:  # a folder the trainer's uid cannot pass through is replaced too, then refilled
        for ancestor in reversed(path.parents):
            if ancestor != Path("/") and not _traversable(ancestor, identity):
                masks.add(ancestor)
                break
    # A mask inside another one is redundant unless a visible folder it lies in puts its content back.
    masks = {
        m
        for m in masks - visible
        if not any(m != o and _under(m, o) for o in masks) or any(_under(m, v) for v in visible)
    }
    return View(writable, frozenset(masks), frozenset(visible), frozenset(files))


def bwrap_argv(
    bwrap: str,
    identity: Identity,
    argv: list[str],
    *,
    writable: Path | None,
    readable: Iterable[Path],
    hidden: Iterable[Path],
    own_network: bool = True,
    view: View | None = None,
) -> list[str]:
    """bwrap's arguments for a view where only `writable` may be written and `hidden` folders are empty,
    except for the `readable` folders (and `writable`) put back inside them; with `own_network`, in a
    network namespace of its own. The sandbox dies with its parent, the worker: bwrap's init (pid 1 of
    the trainer's pid namespace) gets SIGKILL when the worker ends, and with it every process inside,
    whatever session or process group a trainer put itself in. `writable` None: a standby trainer's
    sandbox (worker/standby.py), which is given its job's folders later; it starts in its private /tmp."""
    if view is None:  # `view`: one computed before (a standby's, which its handoff compares with its job's)
        view = sandbox_view(identity, writable=writable, readable=readable, hidden=hidden)
    masks, visible, files = set(view.masks), set(view.visible), set(view.files)

    def made(path: Path) -> tuple[Path | None, list[str]]:
        """The innermost folder op `path` lies in, and the parents to create when that is an empty one."""
        container = view.container(path)
        if container not in masks:
            return container, []
        return container, [
            arg
            for parent in reversed(path.parents)
            if len(parent.parts) > len(container.parts)
            for arg in ("--perms", "0755", "--dir", str(parent))
        ]

    ops: list[tuple[int, list[str]]] = []
    for mask in masks:
        mode = "1777" if mask == Path("/tmp") else "0755"  # the private /tmp is writable, like a real one
        ops.append((len(mask.parts), [*made(mask)[1], "--perms", mode, "--tmpfs", str(mask)]))
    for path in visible:
        bind = "--bind" if path == writable else "--ro-bind"
        ops.append((len(path.parts), [*made(path)[1], bind, str(path), str(path)]))
    for file in files:
        container, _ = made(file)
        if container not in masks:  # inside an empty folder it is gone already
            ops.append((len(file.parts), ["--ro-bind", "/dev/null", str(file)]))
    ordered = [arg for _, op in sorted(ops, key=lambda o: o[0]) for arg in op]
    drop = []
    if identity.switch:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxError("setpriv (util-linux) is needed to drop to the trainer's uid inside bwrap")
        drop = [
            setpriv,
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    # Its own pid namespace and /proc: trainers often share a uid, and through another one's
    # /proc/<pid>/root a trainer would read that trainer's view (its team's data, its job folder).
    network = ["--unshare-net"] if own_network else []
    return [
        bwrap,
        "--unshare-pid",
        *network,
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev-bind",
        "/dev",
        "/dev",
        "--proc",
        "/proc",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        *ordered,
        "--chdir",
        str(writable) if writable is not None else "/tmp",
        *drop,
        *argv,
    ]


def handoff_mounts(standby: View, job: View) -> list[tuple[Path, str]] | None:
    """What to mount into a standby trainer's view (worker/standby.py) so that it is exactly the view a
    fresh trainer of the job would get: (folder, how) pairs in order, `how` one of "empty" (a tmpfs, as
    bwrap's mask), "writable" or "readonly" (the folder itself). None when mounts cannot make that view,
    and the job gets a fresh trainer: the standby hides a folder the job's view would show, sees a folder
    it would not, or the hidden files bound to /dev/null differ (one inside an empty folder is gone in both).

    The job's view may empty more folders than the standby's: one that did not exist when the standby was
    launched (a team's folder made since), a folder its uid cannot pass through above one of its readable
    folders. Each is masked with an empty tmpfs first. Then each folder visible to the job that lies in an
    empty folder, or in a folder mounted before it, is mounted there; one that lies in the read-only root
    or in a read-only folder both see needs nothing (bwrap's bind of it over itself shows the same). The
    job's own folder must be writable, so it is always mounted."""
    if (
        job.emptied_files != standby.emptied_files
        or not standby.visible <= job.visible
        or not standby.masks <= job.masks
    ):
        return None
    ops: list[tuple[int, int, Path, str]] = []
    for mask in job.masks - standby.masks:
        ops.append((len(mask.parts), 0, mask, "empty"))
    for path in job.visible - standby.visible:
        ops.append((len(path.parts), 1, path, "writable" if path == job.writable else "readonly"))
    mounts: list[tuple[Path, str]] = []
    for _, _, path, how in sorted(ops, key=lambda o: (o[0], o[1], str(o[2]))):
        container = job.container(path)
        if how == "empty" or container in job.masks or container in {m for m, _ in mounts}:
            mounts.append((path, how))
        elif how == "writable":
            return None
    if job.writable is not None and (job.writable, "writable") not in mounts:
        return None
    return mounts
