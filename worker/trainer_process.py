"""One trainer subprocess: its folder, launch, event tail, stop and exit.

The worker is the truth about processes. Each trainer runs in its own session (process group)
with its own devices, log file and events file; the worker never runs a shell.

The job folder and its `attempt-<N>/` folders are the worker's (worker/job_files.py): the trainer
writes its log and events through descriptors the worker opened there for it (stdout and stderr,
ADC_EVENTS_FD), reads its config and the stop request there, and writes only `output/` and `cache/`.
What the worker reads back is bounded: event lines (MAX_EVENT_LINE) and the log's tail (LOG_TAIL_BYTES).
The trainer dies with its worker: bwrap's `--die-with-parent`, or without bwrap PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import resource
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from shared.contracts.messages import Device
from shared.contracts.outcomes import ExitOutcome
from shared.specs.tenant_paths import path_keys, placed_in_job_folder
from worker import job_files
from worker.sandbox import SandboxPlan, own_folders, sandbox_view, trainer_environment, tuning_env
from worker.serving import socket_file
from worker.trainer.checkpoints import checkpoint_step, latest_complete_checkpoint
from worker.trainer.fence import raise_fence
from worker.trainer.interpreter import trainer_python
from worker.trainer_network import TrainerNetwork, rank_address

if TYPE_CHECKING:
    from worker.standby import Standby

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_EVENT_LINE = 1 << 20  # a longer event line is skipped, unread
EVENTS_TAIL_BYTES = 4 << 20  # how much of an events file is read for the last event of a trainer not ours
LOG_TAIL_BYTES = 64 << 10  # how much of a trainer's log an exit event may quote (its last lines)
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child between fork and exec only calls it


@dataclass
class JobFolder:
    """Where a job's files live: shared by every attempt, so a checkpoint outlives its node."""

    root: Path

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    def newest_checkpoint(self) -> tuple[str | None, int | None]:
        """The newest complete checkpoint of the job (any attempt's), and its step."""
        found = latest_complete_checkpoint(self.output_dir)
        return (str(found), checkpoint_step(found)) if found else (None, None)

    def resume_point(self, asked: str | None) -> str | None:
        """Where a new attempt resumes: the checkpoint the executor names, unless this job's own folder
        holds a newer complete one. That happens when the last attempt was cut off from the bus: it
        checkpoint-stopped by itself (agent.check_cut_off) but could not report it before its node was
        called lost. Ask only once the fence is raised: from then on no older attempt can publish one."""
        newest = latest_complete_checkpoint(self.output_dir)
        if newest is None:
            return asked
        if asked is not None:
            own = Path(asked).resolve().parent == self.output_dir.resolve()
            if not own or checkpoint_step(newest) <= (checkpoint_step(asked) or 0):
                return asked  # another job's checkpoint (a spec's resume), or already the newest
        return str(newest)

    def config(self, attempt: int) -> Path:
        return self.root / f"attempt-{attempt}" / "train.yaml"

    def log(self, attempt: int, node_rank: int = 0) -> Path:
        name = "trainer.log" if node_rank == 0 else f"trainer-node{node_rank}.log"
        return self.root / f"attempt-{attempt}" / name

    def events(self, attempt: int) -> Path:
        return self.root / f"attempt-{attempt}" / "events.jsonl"

    def stop_file(self, attempt: int) -> Path:
        return self.root / f"attempt-{attempt}" / "stop"

    def go_file(self, attempt: int) -> Path:
        """A warm trainer's go (worker/trainer/warm_start.py): the checkpoint to resume from, written by the worker."""
        return self.root / f"attempt-{attempt}" / "go"

    @property
    def tokenized_cache(self) -> Path:
        """The job's tokenized datasets (worker/trainer/tokenized_cache.py), written by its trainers."""
        return self.cache / "tokenized"

    @property
    def cache(self) -> Path:
        """The trainer's HOME and caches (Hugging Face, Triton, DeepSpeed ops), kept across attempts."""
        return self.root / "cache"

    @property
    def fence(self) -> Path:
        """The job's current attempt, written by workers; a trainer of an older one publishes no checkpoint."""
        return self.root / "fence"

    @property
    def team_file(self) -> Path:
        """Which team the job belongs to (a resume from its checkpoints is allowed to that team only)."""
        return self.root / "team"


EventSink = Callable[[str, int, int, dict[str, Any]], Awaitable[None]]  # (job, attempt, seq, event)


@dataclass
class TrainerProcess:
    job_id: str
    attempt: int
    gpus: list[int]
    folder: JobFolder
    process: asyncio.subprocess.Process | None = None
    cancelled: bool = False
    events_seen: int = 0
    last_event: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    adopted_pid: int | None = None  # a trainer found after a worker restart: not our child
    # Multi-node jobs: this node's share of the ranks, and where rank 0 listens.
    node_rank: int = 0
    rank_offset: int = 0
    world_size: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    rank_nodes: list[str] = field(default_factory=list)  # the node of each global rank
    memory_limit_bytes: int | None = None  # the node's cap on the trainer's address space (RLIMIT_AS)
    threads_per_rank: int = 1  # each rank's share of the node's cores (inventory.threads_per_rank)
    cut_off: bool = False  # stopped by its worker, cut off from the bus (agent.check_cut_off)
    network: TrainerNetwork | None = None  # a multi-node trainer's namespace, made by the worker
    died_with_worker: bool = False  # a leftover found dead without a last word: it ended with its worker
    # A warm trainer (prepared, not yet told to go): it waits before loading a checkpoint, the job's fence is
    # not its attempt yet, and its events and exit are not the job's.
    warm: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # a warm trainer said `prepared`
    spec_resume: str | None = None  # the checkpoint the job's own spec resumes from, if any
    standby: bool = False  # a standby trainer became this one (worker/standby.py)
    _events_fd: int | None = None  # the worker's own read descriptor of the events file
    serve_socket: socket.socket | None = None  # a serving job's listening socket, until handed to its trainer

    @property
    def log_path(self) -> Path:
        return self.folder.log(self.attempt, self.node_rank)

    @property
    def outcome(self) -> ExitOutcome:
        """How it ended: its exit code, or, for one that is not our child, its last event."""
        if self.adopted_pid is not None and self.process is None:
            if self.cancelled:
                return ExitOutcome.CANCELLED
            # Killed with its worker: the job is not at fault, it resumes from its newest complete checkpoint.
            return ExitOutcome.STOPPED if self.died_with_worker else ExitOutcome.of_last_event(self.read_last_event())
        return ExitOutcome.of_exit(self.exit_code, self.cancelled)

    # --- the node's registry of live trainers ----------------------------------------

    def register(self, registry: Path) -> None:
        registry.mkdir(parents=True, exist_ok=True)
        record = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "pid": self.pid,
            "gpus": self.gpus,
            "job_dir": str(self.folder.root),
            "node_rank": self.node_rank,
            "standby": self.standby,
        }
        tmp = registry / f".{self.job_id}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.rename(registry / f"{self.job_id}.json")

    def unregister(self, registry: Path) -> None:
        record = registry / f"{self.job_id}.json"
        try:
            if json.loads(record.read_text()).get("attempt") == self.attempt:
                record.unlink()
        except (OSError, ValueError):
            pass

    @classmethod
    def from_record(cls, path: Path) -> TrainerProcess | None:
        try:
            r = json.loads(path.read_text())
            trainer = cls(r["job_id"], int(r["attempt"]), list(r["gpus"]), JobFolder(Path(r["job_dir"])))
            trainer.adopted_pid = int(r["pid"])
            trainer.node_rank = int(r.get("node_rank", 0))
            trainer.standby = bool(r.get("standby", False))
            return trainer
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        pid = self.adopted_pid or self.pid
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A recycled pid belongs to some other program: only ours carries our job id (a standby's bwrap was
        # launched before its job: it carries the standby's command line).
        try:
            if self.standby:
                return b"worker.trainer.standby" in Path(f"/proc/{pid}/cmdline").read_bytes()
            return f"ADC_JOB_ID={self.job_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return True

    async def wait_gone(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.alive():
            if asyncio.get_running_loop().time() > deadline:
                try:
                    os.killpg(self.adopted_pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return
            await asyncio.sleep(0.2)

    def read_last_event(self) -> dict[str, Any]:
        lines = job_files.read_tail(self.folder.events(self.attempt), EVENTS_TAIL_BYTES).splitlines()
        for line in reversed(lines):
            try:
                return json.loads(line)
            except ValueError:
                continue
        return {}

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def launch(
        self,
        train: dict[str, Any],
        devices: list[Device],
        resume_from: str | None,
        extra_env: dict[str, str],
        sandbox: SandboxPlan,
        standby: Standby | None = None,
    ) -> None:
        """Start the trainer as `sandbox` says: its uid, and with bwrap its view of the files.
        `extra_env` holds only NCCL tuning keys by now (the agent refuses any other). With `standby` (a
        single-node, single-device job), that standby trainer becomes this one (worker/standby.py); if it
        cannot, a fresh one is launched."""
        attempt_dir = self.folder.config(self.attempt).parent
        attempt_fd = job_files.attempt_dir(self.folder.root, attempt_dir.name)  # the worker's, not the trainer's
        try:
            await self._launch(train, devices, resume_from, extra_env, sandbox, attempt_fd, standby)
        except BaseException:
            self._release()
            raise
        finally:
            os.close(attempt_fd)

    async def _launch(
        self,
        train: dict[str, Any],
        devices: list[Device],
        resume_from: str | None,
        extra_env: dict[str, str],
        sandbox: SandboxPlan,
        attempt_fd: int,
        standby: Standby | None = None,
    ) -> None:
        self.folder.output_dir.mkdir(parents=True, exist_ok=True)
        if self.warm:  # the source still trains: the fence and the checkpoint wait for the go
            asked = None
        else:
            raise_fence(self.folder.fence, self.attempt)
            asked, resume_from = resume_from, self.folder.resume_point(resume_from)
        if resume_from != asked:
            log.info(
                "job %s attempt %d resumes from %s, newer than the %s it was sent",
                self.job_id,
                self.attempt,
                resume_from,
                asked or "start",
            )
        train = dict(train, output_dir=str(self.folder.output_dir))
        for name, how in path_keys(train).items():  # what LLaMA-Factory writes goes inside the job's folder
            if name != "output_dir" and placed_in_job_folder(how, train[name]):
                train[name] = str(self.folder.output_dir / train[name])
        if resume_from:
            train["resume_from_checkpoint"] = resume_from
        self.spec_resume = train.get("resume_from_checkpoint") if self.warm else None
        job_files.write_file(attempt_fd, "train.yaml", yaml.safe_dump(train, sort_keys=False).encode())
        job_files.remove(attempt_fd, "stop")  # a stale one would stop it after step 1
        job_files.remove(attempt_fd, self.folder.go_file(self.attempt).name)  # only this worker's go counts
        identity = sandbox.identity
        own_folders(identity, [self.folder.output_dir, self.folder.cache])
        extra_env = tuning_env(extra_env)
        if self.world_size and self.network is not None:
            await asyncio.to_thread(self.network.create)
            self.master_addr = rank_address(0)  # rank 0's trainer on the job's switch
        argv = [trainer_python(), "-m", "worker.trainer", "--config", str(self.folder.config(self.attempt))]
        world = self.world_size or len(self.gpus)
        if world > 1:
            # ADC's launcher rather than torchrun: it keeps the trainer's exit codes (75, 76).
            argv = [
                trainer_python(),
                "-m",
                "worker.trainer.launch",
                f"--nproc-per-node={len(self.gpus)}",
                f"--world-size={world}",
                f"--rank-offset={self.rank_offset}",
                f"--node-rank={self.node_rank}",
                f"--master-addr={self.master_addr}",
                "--config",
                str(self.folder.config(self.attempt)),
            ]
            if self.master_port:
                argv.append(f"--master-port={self.master_port}")
        # What was launched, and with which settings from the command (e.g. NCCL tuning), for people and audits.
        launch_record = "launch.json" if self.node_rank == 0 else f"launch-node{self.node_rank}.json"
        network = (
            ("namespace " + self.network.name if self.network else "host")
            if self.world_size
            else ("own" if sandbox.bwrap else "host")
        )
        launch = {
            "argv": argv[1:],
            "env": extra_env,
            "gpus": self.gpus,
            "resume_from": resume_from,
            "resume_asked": asked,
            "uid": identity.uid,
            "bubblewrap": sandbox.bwrap is not None,
            "network": network,
            "warm": self.warm,
        }
        switch = (
            {"user": identity.uid, "group": identity.gid, "extra_groups": []}
            if identity.switch and sandbox.bwrap is None
            else {}
        )  # with bwrap, setpriv drops inside it
        # A single-node trainer gets a network namespace of its own from bwrap; a multi-node one runs in
        # the namespace made for it, or, where the worker cannot make one, on the host's network.
        wrapped = sandbox.wrap(argv, self.folder.root, own_network=not self.world_size)
        if self.network is not None:
            wrapped = self.network.enter() + wrapped
        try:
            if train.get("adc_serve"):  # a serving job answers on the worker's socket (worker/serving/socket_file.py)
                self.serve_socket = socket_file.listen(attempt_fd)
            if standby is None or not await self._hand_to(standby, sandbox, devices, extra_env, attempt_fd):
                await self._start(wrapped, devices, extra_env, attempt_fd, switch)
        finally:
            launch["standby"] = self.standby
            job_files.write_file(attempt_fd, launch_record, json.dumps(launch, indent=1).encode())

    async def _hand_to(
        self, standby: Standby, sandbox: SandboxPlan, devices: list[Device], tuning: dict[str, str], attempt_fd: int
    ) -> bool:
        """Make `standby` this attempt's trainer, with the view, environment and descriptors a fresh one
        would get; False if it could not be (it is ended, and the caller launches a fresh trainer)."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        view = sandbox_view(
            sandbox.identity, writable=self.folder.root, readable=sandbox.readable, hidden=sandbox.hidden
        )
        logfile = job_files.open_file(attempt_fd, self.log_path.name, flags)
        events = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, flags)
        try:
            env = self._environment(devices, tuning, events)
            await standby.handoff(view, env, self.folder.config(self.attempt), logfile, events)
        except Exception as err:  # noqa: BLE001 - a standby's failure is never the job's: it starts fresh
            log.warning(
                "job %s attempt %d: standby trainer not used (%s); launching one", self.job_id, self.attempt, err
            )
            await standby.end()
            return False
        finally:
            os.close(logfile)
            os.close(events)
        self._events_fd = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, os.O_RDONLY)
        self.process = standby.process
        self.standby = True
        log.info("job %s attempt %d: handed to standby trainer %s", self.job_id, self.attempt, self.process.pid)
        return True

    async def _start(
        self, argv: list[str], devices: list[Device], tuning: dict[str, str], attempt_fd: int, switch: dict
    ) -> None:
        """Run the sandboxed trainer as the worker's child, its log and events on descriptors opened here.
        Another backend runs it elsewhere (worker/slurm/trainer.py)."""
        attempt_dir = self.folder.config(self.attempt).parent
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        logfile = job_files.open_file(attempt_fd, self.log_path.name, flags)
        events = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, flags)
        self._events_fd = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, os.O_RDONLY)
        env = self._environment(devices, tuning, events)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(attempt_dir),
                env=env,
                stdout=logfile,
                stderr=logfile,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(events, *([self.serve_socket.fileno()] if self.serve_socket else [])),
                preexec_fn=self._in_child,
                **switch,
            )
        finally:
            os.close(logfile)
            os.close(events)
            if self.serve_socket is not None:  # the trainer's now: the worker connects by its name
                self.serve_socket.close()
                self.serve_socket = None

    def _in_child(self) -> None:
        """In the child, before exec: it dies with the worker (bwrap renews this for what runs inside it),
        and an allocation past the memory cap fails, so the trainer exits 76."""
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if self.memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (self.memory_limit_bytes, self.memory_limit_bytes))

    def _release(self) -> None:
        """What the worker holds for a trainer that has ended: its namespace, its events descriptor."""
        if self._events_fd is not None:
            os.close(self._events_fd)
            self._events_fd = None
        if self.network is not None:
            self.network.remove()

    def _environment(self, devices: list[Device], tuning: dict[str, str], events_fd: int) -> dict[str, str]:
        """Built from an allowlist (worker/sandbox.py): no credential of the worker reaches a trainer."""
        by_index = {d.index: d for d in devices}
        real = [i for i in self.gpus if by_index[i].kind == "gpu" and not by_index[i].simulated]
        adc = {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, real)),  # empty: no GPU for CPU slots and simulated ones
            "ADC_JOB_ID": self.job_id,
            "ADC_ATTEMPT": str(self.attempt),
            "ADC_EVENTS_FD": str(events_fd),  # the worker's file, opened for it: no path to swap
            "ADC_STOP_FILE": str(self.folder.stop_file(self.attempt)),
            "ADC_FENCE_FILE": str(self.folder.fence),
            "ADC_DEVICES": ",".join(map(str, self.gpus)),
            "ADC_TOKENIZED_CACHE": str(self.folder.tokenized_cache),
            # Its share of the cores, not all of them: trainers side by side would otherwise oversubscribe them.
            "OMP_NUM_THREADS": str(self.threads_per_rank),
        }
        if self.network is not None:
            adc |= self.network.environment
        if self.serve_socket is not None:
            adc["ADC_SERVE_FD"] = str(self.serve_socket.fileno())
        if self.warm:
            adc["ADC_GO_FILE"] = str(self.folder.go_file(self.attempt))
        return trainer_environment(
            job_dir=self.folder.root,
            python=trainer_python(),
            repo_root=REPO_ROOT,
            inherited=dict(os.environ),
            adc=adc,
            tuning=tuning,
        )

    async def follow(self, sink: EventSink, poll_s: float = 0.2) -> None:
        """Forward the trainer's events until it exits, then record the exit code."""
        assert self._events_fd is not None
        fd, buffer, skipping = self._events_fd, b"", False

        async def drain() -> bool:
            """Read what is new, at most 4 MiB a poll (a trainer writing without end cannot hold the worker);
            True if there may be more."""
            nonlocal buffer, skipping
            for _ in range(64):
                if not (chunk := os.read(fd, 1 << 16)):
                    return False
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if skipping:  # the rest of a line too long to read
                        skipping = False
                        continue
                    await self._event_line(line, sink)
                if len(buffer) > MAX_EVENT_LINE:
                    log.warning("job %s: event line over %d bytes skipped", self.job_id, MAX_EVENT_LINE)
                    buffer, skipping = b"", True
            return True

        wait = asyncio.ensure_future(self._exited())
        try:
            while not wait.done():
                await drain()
                await asyncio.wait({wait}, timeout=poll_s)
            while await drain():
                pass
        finally:
            self.exit_code = wait.result() if wait.done() else None
            self._release()
        self.done.set()

    async def _exited(self) -> int | None:
        """The trainer's exit code once it has ended."""
        assert self.process is not None
        return await self.process.wait()

    @property
    def backend_job(self) -> str | None:
        """The id another backend runs this attempt under (a Slurm job); None for the worker's own child."""
        return None

    @property
    def ended_by(self) -> str | None:
        """Who ended it, when that was not the trainer nor ADC (a person's scancel); None if it ended itself."""
        return None

    async def _event_line(self, line: bytes, sink: EventSink) -> None:
        if not line.strip():
            return
        self.events_seen += 1
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("job %s: unreadable event line skipped", self.job_id)
            return
        if not isinstance(event, dict):
            log.warning("job %s: event line that is not an object skipped", self.job_id)
            return
        self.last_event = event
        await sink(self.job_id, self.attempt, self.events_seen, event)

    def go(self, asked: str | None) -> str | None:
        """Let a warm trainer train: the job's fence raised to its attempt (the source has stopped), then
        the go file, naming the checkpoint to resume from (the job's newest if newer, as for any start)."""
        raise_fence(self.folder.fence, self.attempt)
        resume = self.folder.resume_point(asked) or self.spec_resume
        attempt_fd = job_files.attempt_dir(self.folder.root, self.folder.go_file(self.attempt).parent.name)
        try:
            name = self.folder.go_file(self.attempt).name
            job_files.write_file(attempt_fd, name, json.dumps({"resume_from": resume}).encode())
        finally:
            os.close(attempt_fd)
        self.warm = False
        return resume

    def request_stop(self) -> None:
        """Checkpoint-stop: the trainer checkpoints at the next step boundary and exits 75.

        A file, not a signal: torchrun's agent would die of SIGUSR1, and every rank can see a file. The
        worker's, in the worker's attempt folder: the trainer can see it, not move or replace it.
        """
        attempt_fd = job_files.attempt_dir(self.folder.root, self.folder.stop_file(self.attempt).parent.name)
        try:
            job_files.touch(attempt_fd, self.folder.stop_file(self.attempt).name)
        finally:
            os.close(attempt_fd)

    async def terminate(self, grace_s: float = 10.0) -> None:
        """Stop now, no checkpoint: SIGTERM the group, SIGKILL what is left after the grace."""
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.done.wait(), grace_s)
        except TimeoutError:
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
