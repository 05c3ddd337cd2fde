"""Standby trainers: a sandboxed trainer per trainer identity, its imports done, waiting for a job.

Most of a trainer's start is Python importing torch, transformers, datasets, peft, trl and
LLaMA-Factory, which no job decides. So a worker keeps, per trainer identity (the uid of
`tenancy.sandbox`: one in `fixed` mode, one per team in `per_team`; none in `per_job`, where no uid is
known before its job), `worker.standby_trainers` standbys (worker/trainer/standby.py) that have done
that and wait. A start or a prepare of a single-node, single-device job whose identity has one is
handed to it instead of launching a fresh trainer, and a replacement is launched in the background.

Confinement, by construction the same as a fresh trainer's (worker/sandbox.py):
- a standby is launched exactly as a trainer is: bwrap with its own pid, mount and network namespaces,
  `--die-with-parent`, the worker's PR_SET_PDEATHSIG and RLIMIT_AS before exec, and `setpriv` dropping
  to the identity's uid with no capabilities and no_new_privs before any Python runs. Its view is a
  trainer's with no job: the read-only root with the storage root, every team's folders and
  `hidden_paths` empty, ADC's code and trainer env readable; nothing writable but its private /tmp;
- when it is handed a job, the worker computes the view a fresh trainer of that job would get, and
  mounts into the standby's namespace exactly what that view has beyond the standby's: the job's folder
  read-write, its readable folders (team folders, granted jobs' outputs, a resumed checkpoint's folder)
  read-only (worker/mounts.py: opened with no symlink followed, copied with open_tree, attached with
  move_mount from a single-threaded child in that namespace). Where mounts cannot make that view
  (`sandbox.handoff_mounts`: the job's view hides a folder the standby's does not), the job gets a
  fresh trainer, and that standby is replaced by one launched now;
- the job's environment (HOME, the caches, ADC_*, CUDA_VISIBLE_DEVICES, the thread count) and its log
  and events descriptors (SCM_RIGHTS) come in one message on a socketpair made at launch, whose other
  end only the worker holds: the trainer cannot be told of another job by anyone but its worker. The
  standby's own environment is that of a job folder in its private /tmp (STANDBY_ROOT), so whatever a
  library computed from it at import points into /tmp, and is re-pointed to the job's folder at the
  handoff; the thread count (OMP_NUM_THREADS, read when OpenMP loads) is the node's per-rank share, as
  for every single-device trainer here;
- the standby runs at nice 10 while it waits (a replacement importing beside a job slows it less) and
  is put back to 0 at the handoff. One that dies, answers wrongly or too late, or loaded CUDA while
  importing (the job's CUDA_VISIBLE_DEVICES could not hold) is dropped: the job starts fresh.
"""

from __future__ import annotations

import array
import asyncio
import json
import logging
import os
import resource
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

from shared.infra.clock import Clock, SystemClock
from shared.infra.retry import fixed, retrying
from worker import job_files, mounts
from worker.sandbox import (
    Identity,
    SandboxError,
    SandboxPlan,
    View,
    bwrap_argv,
    handoff_mounts,
    sandbox_view,
    trainer_environment,
    trainer_identity,
)
from worker.trainer.interpreter import trainer_python
from worker.trainer.standby import ENV_ROOM, ENV_ROOM_KEY, STANDBY_ROOT

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
STANDBY_NICE = 10
HANDOFF_TIMEOUT_S = 30.0  # the standby's answer to a handoff: its environment swapped, its folder changed
_PR_SET_PDEATHSIG = 1


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


class StandbyUnfit(RuntimeError):
    """This standby cannot become the job's trainer (the job starts fresh)."""


@dataclass
class Standby:
    identity: Identity
    plan: SandboxPlan  # its sandbox: no job's folder, ADC's code readable
    view: View
    process: asyncio.subprocess.Process | None = None
    sock: socket.socket | None = None
    namespace: tuple[int, int, int] | None = None  # bwrap's init: its pid, its mount namespace's st_dev, st_ino
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    unusable: str | None = None  # why it can never be used (it said so)
    handed: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def launch(self, log_fd: int, memory_limit: int | None, threads: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self.sock = ours
        argv = [trainer_python(), "-m", "worker.trainer.standby", "--socket-fd", str(theirs.fileno())]
        assert self.plan.bwrap is not None
        wrapped = bwrap_argv(
            self.plan.bwrap,
            self.identity,
            argv,
            writable=None,
            readable=self.plan.readable,
            hidden=self.plan.hidden,
            view=self.view,  # exactly the view its handoffs compare with the job's
        )
        env = trainer_environment(
            job_dir=Path(STANDBY_ROOT),
            python=trainer_python(),
            repo_root=REPO_ROOT,
            inherited=dict(os.environ),
            # The node's per-rank thread count, as every single-device trainer's; NVML, not the CUDA driver,
            # answers torch.cuda.is_available() during the imports (the driver would fix the visible devices).
            adc={
                "OMP_NUM_THREADS": str(threads),
                "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                ENV_ROOM_KEY: "." * ENV_ROOM,  # overwritten by the job's environment at the handoff
            },
            tuning={},
        )

        def in_child() -> None:  # as TrainerProcess._in_child, and niced while it waits
            import ctypes

            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if memory_limit:
                resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
            os.nice(STANDBY_NICE)

        try:
            self.process = await asyncio.create_subprocess_exec(
                *wrapped,
                cwd="/",
                env=env,
                stdout=log_fd,
                stderr=log_fd,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
                preexec_fn=in_child,
            )
        finally:
            theirs.close()

    async def wait_ready(self) -> bool:
        """Until it says ready (True) or unusable, or ends (False)."""
        assert self.sock is not None
        loop = asyncio.get_running_loop()
        try:
            data = await loop.sock_recv(self.sock, 4096)
            answer = json.loads(data) if data else {}
        except (OSError, ValueError):
            answer = {}
        if answer.get("standby") != "ready":
            self.unusable = str(answer.get("why")) if answer.get("standby") == "unusable" else None
            await self.end()
            return False
        try:
            pid = self._init_pid()
            ns = os.stat(f"/proc/{pid}/ns/mnt")
            self.namespace = (pid, ns.st_dev, ns.st_ino)
        except (OSError, StandbyUnfit) as err:
            log.warning("standby trainer %s: no mount namespace to hand jobs to (%s)", self.pid, err)
            await self.end()
            return False
        self.ready.set()
        return True

    def _init_pid(self) -> int:
        """bwrap's init in the sandbox (root's, ADC's code): the outer bwrap's only child, in another mount
        namespace than the worker's."""
        assert self.process is not None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        if len(children) != 1:
            raise StandbyUnfit(f"bwrap has {len(children)} children")
        pid = int(children[0])
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise StandbyUnfit("bwrap's init shares the worker's mount namespace")
        if os.stat(f"/proc/{pid}").st_uid != 0:
            raise StandbyUnfit("bwrap's init is not root's")
        return pid

    async def handoff(self, job_view: View, env: dict[str, str], config: Path, log_fd: int, events_fd: int) -> None:
        """Make it the job's trainer: the job's folders into its view, then the message. StandbyUnfit if it
        cannot be (nothing of the job reached it), any other error once something may have: the caller
        ends it."""
        if not self.ready.is_set() or not self.alive() or self.sock is None or self.namespace is None:
            raise StandbyUnfit("the standby is not ready")
        wanted = handoff_mounts(self.view, job_view)
        if wanted is None:
            mine, theirs = self.view, job_view
            raise StandbyUnfit(
                "its view cannot be made the job's by mounts (emptied only by the standby: "
                f"{sorted(map(str, mine.masks - theirs.masks))}, seen only by it: "
                f"{sorted(map(str, mine.visible - theirs.visible))}, hidden files differing: "
                f"{sorted(map(str, mine.emptied_files ^ theirs.emptied_files))})"
            )
        passed = [_identity(fd) for fd in (log_fd, events_fd)]
        self.handed = True  # from here on it is the job's, or it ends
        await asyncio.to_thread(self._mount, self.namespace, wanted)
        # The descriptors go to hostile code: still the job's files, not a number other code of the worker's
        # process closed and reused while the mounts were made.
        if [_identity(fd) for fd in (log_fd, events_fd)] != passed:
            raise OSError("the job's log or events descriptor changed during the handoff")
        message = json.dumps({"env": env, "config": str(config), "cwd": str(job_view.writable)}).encode()
        fds = array.array("i", [log_fd, events_fd])
        loop = asyncio.get_running_loop()
        self.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), HANDOFF_TIMEOUT_S)
        answer = json.loads(data) if data else {}
        if answer.get("standby") != "handed":
            raise StandbyUnfit(f"the standby did not take the job (answered {data[:200]!r})")
        self.sock.close()
        self.sock = None
        try:
            os.setpriority(os.PRIO_PGRP, self.process.pid, 0)  # a trainer now: the priority of a fresh one
        except OSError as err:
            log.warning("standby trainer %s not reniced: %s", self.pid, err)

    def _mount(self, namespace: tuple[int, int, int], wanted: list[tuple[Path, str]]) -> None:
        trees: list[tuple[int, Path]] = []
        try:
            for path, how in wanted:
                tree = mounts.empty_tmpfs() if how == "empty" else mounts.clone_tree(path, writable=how == "writable")
                trees.append((tree, path))
            mounts.attach(namespace, trees)
        finally:
            for tree, _ in trees:
                os.close(tree)

    async def end(self) -> None:
        """Kill it (its whole sandbox), release what the worker holds for it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            await self.process.wait()


class StandbyPool:
    """A node's standby trainers: `count` per identity, replaced as they are used or die."""

    def __init__(
        self,
        node: str,
        storage_root: Path,
        launch_check,
        *,
        count: int,
        memory_limit: int | None,
        threads: int,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self.clock = clock or SystemClock()
        self.storage_root = storage_root
        self.launch_check = launch_check
        self.count = count
        self.memory_limit = memory_limit
        self.threads = threads
        self.standbys: list[Standby] = []
        self.disabled: set[int] = set()  # identities whose standbys said they are unusable
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.count > 0 and os.geteuid() == 0 and self.launch_check.standby_plan(None) is not None

    def identities(self) -> list[Identity]:
        sandbox = self.launch_check.tenancy.sandbox
        if sandbox.uid_mode == "per_job":
            return []
        teams = sorted(set(sandbox.team_uids)) if sandbox.uid_mode == "per_team" else [""]
        found = []
        for team in teams:
            try:
                identity = trainer_identity(sandbox, team, "")
            except SandboxError:
                continue
            if identity not in found:
                found.append(identity)
        return found

    def start(self) -> None:
        """Fill the pool (in the background)."""
        if not self.enabled:
            return
        for identity in self.identities():
            for _ in range(self.count):
                self._spawn(self._launch(identity))

    def take(self, plan: SandboxPlan) -> Standby | None:
        """A ready standby of the plan's identity and sandbox, out of the pool; a replacement is launched."""
        for standby in self.standbys:
            if (
                standby.ready.is_set()
                and standby.alive()
                and standby.identity == plan.identity
                and standby.plan.bwrap == plan.bwrap
            ):
                self.standbys.remove(standby)
                self._spawn(self._launch(standby.identity))
                self._note()
                return standby
        return None

    async def discard(self, standby: Standby) -> None:
        """A standby taken but not used: ended (its replacement is already on its way)."""
        await standby.end()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=15)
        for standby in list(self.standbys):
            await standby.end()
        self.standbys.clear()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _note(self) -> None:
        """`nodes/<node>/standbys.json`: how many standbys are ready and launching (for people and benches)."""
        ready = sum(1 for s in self.standbys if s.ready.is_set() and s.alive())
        try:
            node_fd = job_files.worker_dir(self.storage_root / "nodes" / self.node)
            try:
                note = {"ready": ready, "launching": len(self.standbys) - ready, "disabled_uids": sorted(self.disabled)}
                job_files.write_file(node_fd, "standbys.json", json.dumps(note).encode())
            finally:
                os.close(node_fd)
        except OSError as err:
            log.warning("standbys.json not written: %s", err)

    def _log_fd(self) -> int:
        """The standbys' own log (their imports' output): the worker's file under storage/nodes/<node>/."""
        nodes = self.storage_root / "nodes"
        nodes.mkdir(parents=True, exist_ok=True)
        node_fd = job_files.worker_dir(nodes / self.node)
        try:
            return job_files.open_file(node_fd, "standby.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        finally:
            os.close(node_fd)

    async def _launch(self, identity: Identity, retry_s: float = 5.0) -> None:
        """One standby of `identity` into the pool, ready; launched again while it dies getting ready."""
        await retrying(self.clock, wait=fixed(retry_s), again_if=lambda again: again)(self._launch_once, identity)

    async def _launch_once(self, identity: Identity) -> bool:
        """One try at a ready standby; True if it ended before it was ready and another should follow."""
        if self._closed or identity.uid in self.disabled:
            return False
        plan = self.launch_check.standby_plan(identity)
        if plan is None:
            return False
        log_fd = self._log_fd()  # makes the storage root, which its view must empty, if it is new
        view = sandbox_view(identity, writable=None, readable=plan.readable, hidden=plan.hidden)
        standby = Standby(identity, plan, view)
        try:
            await standby.launch(log_fd, self.memory_limit, self.threads)
        except (OSError, SandboxError) as err:
            log.warning("standby trainer for uid %d not launched: %s", identity.uid, err)
            return False
        finally:
            os.close(log_fd)
        self.standbys.append(standby)
        try:
            ok = await standby.wait_ready()
        except asyncio.CancelledError:
            await standby.end()
            raise
        self._note()
        if ok:
            log.info("standby trainer for uid %d ready (pid %s)", identity.uid, standby.pid)
            self._spawn(self._watch(standby))
            return False
        if standby in self.standbys:
            self.standbys.remove(standby)
        if standby.unusable:
            log.warning("standby trainers for uid %d disabled: %s", identity.uid, standby.unusable)
            self.disabled.add(identity.uid)
            return False
        log.warning("standby trainer for uid %d ended before it was ready; launching another", identity.uid)
        return True

    async def _watch(self, standby: Standby) -> None:
        """A ready standby that dies while it waits is replaced."""
        assert standby.process is not None
        await standby.process.wait()
        if standby in self.standbys and not standby.handed:
            self.standbys.remove(standby)
            await standby.end()
            self._note()
            if not self._closed:
                log.warning("standby trainer %s ended while waiting; launching another", standby.pid)
                self._spawn(self._launch(standby.identity))
