"""The node agent: registers the node's devices, heartbeats, runs trainers on command.

It answers commands over request/reply and reports what its trainers do as job events.
It never decides anything: the executor tells it what to run, and it says what happened.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from shared.contracts.messages import (
    Command,
    CommandError,
    CommandResult,
    Device,
    FinishedTrainer,
    Heartbeat,
    JobEvent,
    RunningTrainer,
)
from shared.contracts.outcomes import ExitOutcome
from shared.infra import tracing
from shared.infra.bus import Bus
from shared.infra.clock import Clock, SystemClock
from shared.infra.command_auth import SignatureVerifier
from shared.infra.config import TenancyConfig
from shared.infra.rejections import rejected
from shared.infra.retry import retrying, steps
from shared.specs.tenant_paths import safe_component
from worker import job_files, trainer_spans
from worker.backend import Backend, LocalBackend
from worker.command_gate import CommandGate
from worker.inventory import node_cores, threads_per_rank
from worker.launch_check import LaunchCheck, LaunchRefused
from worker.serving.relay import ChatRelay
from worker.standby import StandbyPool
from worker.trainer_network import multi_node_network, sweep
from worker.trainer_process import LOG_TAIL_BYTES, JobFolder, TrainerProcess

log = logging.getLogger(__name__)

# Trainer events the bus carries as they are; the others become part of the exit event.
_FORWARDED = {"started", "progress", "checkpointed", "evaluated"}
FINISHED_KEPT = 64  # ended attempts each heartbeat lists
# Of worker.node_timeout: a worker this long without the bus stops its trainers, so they have checkpointed
# before the executor calls the node lost (as a leader steps down before its lease can expire).
SELF_STOP_SHARE = 0.5
# A checkpoint-stop not honoured this long (a hung or hostile trainer) ends with the trainer killed.
STOP_TIMEOUT_S = 300.0
# A warm trainer (a move's target, worker/trainer/warm_start.py) not ready this long is given up; one
# ready but not told to go this long (its move ended elsewhere, its executor gone) is stopped.
PREPARE_TIMEOUT_S = 240.0
PREPARED_TTL_S = 900.0


class NodeAgent:
    def __init__(
        self,
        bus: Bus,
        node: str,
        devices: list[Device],
        storage_root: Path,
        *,
        rack: str = "",
        address: str = "127.0.0.1",
        heartbeat_interval: float = 2.0,
        clock: Clock | None = None,
        trainer_memory_limit: int | None = None,
        tenancy: TenancyConfig | None = None,
        data_root: Path | None = None,
        node_timeout: float | None = None,
        commands: SignatureVerifier | None = None,
        cores: int | None = None,
        backend: Backend | None = None,
        standby_trainers: int = 0,
    ) -> None:
        self.bus = bus
        self.backend = backend or LocalBackend()  # what runs the trainers: the worker itself, or Slurm
        self.node = node
        self.devices = devices
        self.storage_root = storage_root
        self.rack = rack
        self.address = address
        self.heartbeat_interval = heartbeat_interval
        self.trainer_memory_limit = trainer_memory_limit
        self.threads_per_rank = threads_per_rank(cores or node_cores(), len(devices))
        self.clock = clock or SystemClock()
        self.started_at = self.clock.now()
        self.gate = CommandGate(bus, node, commands, self.clock)  # only what the executor signed is carried out
        self.last_contact = self.started_at  # the last round trip to the bus server
        self.cut_off = False  # no round trip for worker.node_timeout
        self.launch_check = LaunchCheck(
            tenancy or TenancyConfig(), Path(data_root or Path.cwd()).resolve(), storage_root
        )
        self.node_timeout = node_timeout  # cut off from the bus this long: stop our trainers ourselves
        self.stop_timeout_s = STOP_TIMEOUT_S
        self.trainers: dict[str, TrainerProcess] = {}
        self.leftovers: dict[str, TrainerProcess] = {}  # found from a previous run, being stopped
        self.prepared: dict[str, TrainerProcess] = {}  # warm trainers of moves, waiting for their go
        self.prepare_timeout_s = PREPARE_TIMEOUT_S
        self.finished: dict[tuple[str, int], FinishedTrainer] = {}  # the last attempts that ended, oldest first
        self.newest_fence = 0  # the newest executor lease token a command carried
        self._tasks: set[asyncio.Task] = set()
        # Trainers with their imports done, waiting for a job (worker/standby.py): the built-in backend only.
        self.standbys = StandbyPool(
            node,
            storage_root,
            self.launch_check,
            count=standby_trainers if self.backend.name == "local" else 0,
            memory_limit=trainer_memory_limit,
            threads=self.threads_per_rank,
            clock=self.clock,
        )

    # --- serving ---------------------------------------------------------------------

    @property
    def registry(self) -> Path:
        """Where this node notes its live trainers, so a restarted worker finds them."""
        return self.storage_root / "nodes" / self.node / "trainers"

    async def run(self, stop: asyncio.Event) -> None:
        sub = await self.bus.nc.subscribe(self.bus.subjects.command(self.node), cb=self._on_command)
        chat = await self.bus.nc.subscribe(self.bus.subjects.chat(self.node), cb=ChatRelay(self.trainers).on_message)
        await self.heartbeat()
        self._spawn(self.stop_leftover_trainers())
        self.standbys.start()
        try:
            while not stop.is_set():
                await self.clock.wait(stop, self.heartbeat_interval)
                await self.heartbeat()
                await self.check_cut_off()
        finally:
            try:
                await sub.unsubscribe()
                await chat.unsubscribe()
            except Exception as err:  # cut off from the bus: stopping the trainers matters more
                log.warning("command subscription not closed: %s", err)
            await self.shutdown()

    async def shutdown(self, grace_s: float = 60.0) -> None:
        """On a clean stop, trainers checkpoint and stop too: nothing runs unwatched, no step is lost.

        Their exits are reported as stopped-after-checkpoint, so the executor requeues the jobs.
        """
        await self.standbys.close()
        for trainer in list(self.prepared.values()):  # nothing trained there yet: nothing to keep
            await trainer.terminate()
        live = [t for t in self.trainers.values() if not t.done.is_set()]
        for trainer in live:
            trainer.request_stop()
        if live:  # real time: the trainers are real processes
            await asyncio.wait([asyncio.ensure_future(t.done.wait()) for t in live], timeout=grace_s)
        for trainer in live:
            if not trainer.done.is_set():
                await trainer.terminate()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=15)

    async def heartbeat(self) -> None:
        live = [t for t in [*self.trainers.values(), *self.leftovers.values()] if not t.done.is_set()]
        self.devices = await self.backend.offered(self.devices, self._busy_devices(), live)
        running = [
            RunningTrainer(job_id=t.job_id, attempt=t.attempt, pid=t.pid or t.adopted_pid or 0, gpus=t.gpus)
            for t in [*self.trainers.values(), *self.leftovers.values()]
            if not t.done.is_set()
        ]
        beat = Heartbeat(
            node=self.node,
            ts=self.clock.now(),
            started_at=self.started_at,
            devices=self.devices,
            rack=self.rack,
            address=self.address,
            running=running,
            finished=list(self.finished.values()),
        )
        try:
            await self.bus.nc.publish(self.bus.subjects.heartbeat(self.node), beat.encode())
        except Exception as err:  # the client reconnects; the next beat goes out
            log.warning("heartbeat not sent: %s", err)

    async def check_cut_off(self) -> None:
        """Cut off from the bus, this node will be declared lost at worker.node_timeout and its jobs resumed
        elsewhere. So its trainers checkpoint-stop by themselves once half that time has passed without a
        round trip: their checkpoints are on shared storage before the executor's deadline, and the next
        attempt resumes from them (JobFolder.resume_point), losing no step. The attempt fence keeps a
        checkpoint that comes too late from overwriting the new attempt's."""
        # While reconnecting, nats-py may settle a flush without a round trip.
        if self.bus.nc.is_connected and await self.bus.round_trip(max(1.0, min(self.heartbeat_interval, 5.0))):
            self.last_contact = self.clock.now()
            self.cut_off = False
            return
        silent = self.clock.now() - self.last_contact
        if self.node_timeout is None or silent < self.node_timeout * SELF_STOP_SHARE:
            return
        self.cut_off = True  # progress is not retried meanwhile: the node is lost, the job lives elsewhere
        for trainer in self.trainers.values():
            if not trainer.done.is_set() and not trainer.cut_off:
                trainer.cut_off = True
                log.warning(
                    "no bus for %.1f s (worker.node_timeout %.0f s): checkpoint-stopping job %s attempt %d",
                    silent,
                    self.node_timeout,
                    trainer.job_id,
                    trainer.attempt,
                )
                trainer.request_stop()

    async def _on_command(self, msg: Msg) -> None:
        if not await self.gate.admit(msg):
            return
        try:
            cmd = Command.decode(msg.data)
        except ValueError as err:
            reason = rejected("commands", err, msg.data, f"worker {self.node}")
            await msg.respond(
                CommandResult(
                    command_id="?", ok=False, error=CommandError.BAD_COMMAND, message=f"{reason}: {err}"[:2000]
                ).encode()
            )
            return
        if (stale := self._stale(cmd)) is not None:
            await msg.respond(stale.encode())
            return
        if not safe_component(cmd.job_id):  # it names a folder: no separators, no `..`
            await msg.respond(
                CommandResult(
                    command_id=cmd.command_id,
                    ok=False,
                    error=CommandError.BAD_COMMAND,
                    message=f"job id {cmd.job_id[:80]!r} is not a safe path component",
                ).encode()
            )
            return
        try:
            handler = {
                "start": self.start,
                "stop": self.stop,
                "cancel": self.cancel,
                "prepare": self.prepare,
                "go": self.go,
            }[cmd.kind]
            result = await tracing.within(
                "worker", f"command {cmd.kind}", handler(cmd), headers=msg.headers, job_id=cmd.job_id, node=self.node
            )
        except Exception as err:  # errors are data: the executor decides what to do about them
            log.exception("command %s for job %s failed", cmd.kind, cmd.job_id)
            result = CommandResult(command_id=cmd.command_id, ok=False, error=CommandError.INTERNAL, message=str(err))
        await msg.respond(result.encode())

    # --- commands --------------------------------------------------------------------

    def _stale(self, cmd: Command) -> CommandResult | None:
        """A command from an executor older than one already heard from is refused: it was replaced."""
        if cmd.fence is None:
            return None  # an executor without leader election
        if cmd.fence < self.newest_fence:
            log.warning(
                "command %s for job %s refused: executor token %d is older than %d",
                cmd.kind,
                cmd.job_id,
                cmd.fence,
                self.newest_fence,
            )
            return CommandResult(
                command_id=cmd.command_id,
                ok=False,
                error=CommandError.STALE_LEADER,
                message=f"sent by an executor that no longer leads (token {cmd.fence} < {self.newest_fence})",
            )
        self.newest_fence = cmd.fence
        return None

    def _busy_devices(self) -> dict[int, str]:
        live = [*self.trainers.values(), *self.leftovers.values(), *self.prepared.values()]
        return {g: t.job_id for t in live if not t.done.is_set() for g in t.gpus}

    async def start(self, cmd: Command) -> CommandResult:
        ok = lambda **kw: CommandResult(command_id=cmd.command_id, ok=True, **kw)  # noqa: E731
        fail = lambda error, message: CommandResult(command_id=cmd.command_id, ok=False, error=error, message=message)  # noqa: E731
        existing = self.trainers.get(cmd.job_id)
        warm = cmd.kind == "prepare"
        if warm:  # the source may run here still: only another warm trainer of the job is in the way
            existing = self.prepared.get(cmd.job_id)
            if existing and not existing.done.is_set() and existing.attempt == cmd.attempt:
                return await self._prepared(cmd, existing)  # a retried prepare: wait as the first did
        if existing and not existing.done.is_set():
            if existing.attempt == cmd.attempt:  # a retried start: already done
                return ok(
                    pid=existing.pid,
                    job_dir=str(existing.folder.root),
                    backend_job=existing.backend_job,
                    message="already running",
                )
            return fail(
                CommandError.JOB_RUNNING, f"attempt {existing.attempt} of job {cmd.job_id} is still running here"
            )
        mine = [i for i, p in enumerate(cmd.placement) if p.node == self.node]
        if not mine or cmd.train is None:
            return fail(CommandError.BAD_COMMAND, "start names no devices on this node or has no train section")
        if why := self.backend.refusal(cmd):
            return fail(CommandError.REFUSED, why)
        node_rank = mine[0]
        gpus = list(cmd.placement[node_rank].gpus)
        known = {d.index for d in self.devices}
        if unknown := [g for g in gpus if g not in known]:
            return fail(CommandError.NO_SUCH_DEVICE, f"devices {unknown} do not exist on {self.node}")
        busy = self._busy_devices()
        if taken := {g: busy[g] for g in gpus if g in busy}:
            return fail(CommandError.DEVICES_BUSY, f"devices in use: {taken}")
        try:
            sandbox = await asyncio.to_thread(self.launch_check.plan, cmd)
        except LaunchRefused as err:
            log.warning("start of job %s refused: %s", cmd.job_id, err)
            return fail(CommandError.REFUSED, str(err)[:2000])
        folder = JobFolder(self.storage_root / "jobs" / cmd.job_id)
        (self.storage_root / "jobs").mkdir(parents=True, exist_ok=True)
        job_fd = job_files.worker_dir(folder.root)  # the worker's folder: the trainer writes output/ and cache/ only
        try:
            try:
                job_files.read_file(job_fd, folder.team_file.name, 256)
            except FileNotFoundError:
                job_files.write_file(job_fd, folder.team_file.name, f"{cmd.team}\n".encode())
        finally:
            os.close(job_fd)
        trainer = self.backend.trainer(
            cmd.job_id,
            cmd.attempt,
            gpus,
            folder,
            memory_limit_bytes=self.trainer_memory_limit,
            threads_per_rank=self.threads_per_rank,
            warm=warm,
        )
        trainer.rank_nodes = [p.node for p in cmd.placement for _ in p.gpus]
        if len(cmd.placement) > 1:
            trainer.node_rank = node_rank
            trainer.rank_offset = sum(len(p.gpus) for p in cmd.placement[:node_rank])
            trainer.world_size = sum(len(p.gpus) for p in cmd.placement)
            trainer.master_addr = cmd.env.get("ADC_MASTER_ADDR", "127.0.0.1")
            trainer.master_port = int(cmd.env["ADC_MASTER_PORT"]) if cmd.env.get("ADC_MASTER_PORT") else None
            # Its own namespace on the job's switch: it meets its peers there, and nothing else.
            trainer.network = multi_node_network(self.node, cmd.job_id, cmd.attempt, node_rank)
        # A standby trainer for a job of one device on one node, whose sandbox it can be made (worker/standby.py).
        # Not a serving job: its listening socket is handed to a trainer at launch, which a standby has had.
        single = (
            len(cmd.placement) == 1 and len(gpus) == 1 and sandbox.bwrap is not None and not cmd.train.get("adc_serve")
        )
        standby = self.standbys.take(sandbox) if single else None
        try:
            await trainer.launch(cmd.train, self.devices, cmd.resume_from, cmd.env, sandbox, standby=standby)
        except job_files.UnsafeJobFile as err:  # the job folder is not as the worker made it
            log.warning("start of job %s refused: %s", cmd.job_id, err)
            return fail(CommandError.REFUSED, str(err)[:2000])
        finally:
            if standby is not None and not trainer.standby:  # taken, not used: ended (a replacement is coming)
                await standby.end()
        if warm:
            self.prepared[cmd.job_id] = trainer
            self._spawn(self._watch(trainer))
            return await self._prepared(cmd, trainer)
        self.trainers[cmd.job_id] = trainer
        if node_rank == 0:  # rank 0's node speaks for the job: its events become spans of the job's trace
            trainer_spans.begin(cmd.job_id, cmd.attempt, self.node, self.clock)
        trainer.register(self.registry)
        self._spawn(self._watch(trainer))
        log.info("job %s attempt %d started on devices %s (pid %s)", cmd.job_id, cmd.attempt, gpus, trainer.pid)
        return ok(pid=trainer.pid, job_dir=str(trainer.folder.root), backend_job=trainer.backend_job)

    prepare = start  # a start that stops short of training: answered once the trainer is ready

    async def _prepared(self, cmd: Command, trainer: TrainerProcess) -> CommandResult:
        """Once the warm trainer is ready to load a checkpoint: ok; if it dies or takes too long, not."""
        ready, died = asyncio.ensure_future(trainer.ready.wait()), asyncio.ensure_future(trainer.done.wait())
        try:
            await asyncio.wait({ready, died}, timeout=self.prepare_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            died.cancel()
        if trainer.ready.is_set() and not trainer.done.is_set():
            self._spawn(self._expire(trainer))
            return CommandResult(
                command_id=cmd.command_id, ok=True, pid=trainer.pid, job_dir=str(trainer.folder.root), message="ready"
            )
        if trainer.done.is_set():
            why = f"it exited with code {trainer.exit_code} while preparing: {_log_tail(trainer.log_path, 5)}"
        else:
            why = f"it was not ready within {self.prepare_timeout_s:.0f}s"
            await trainer.terminate()
        self.prepared.pop(cmd.job_id, None)
        return CommandResult(
            command_id=cmd.command_id, ok=False, error=CommandError.NOT_READY, message=f"warm trainer: {why}"[:2000]
        )

    async def _expire(self, trainer: TrainerProcess) -> None:
        await asyncio.wait([asyncio.ensure_future(trainer.done.wait())], timeout=PREPARED_TTL_S)
        if trainer.warm and not trainer.done.is_set():
            log.warning("job %s attempt %d: prepared but never told to go; stopped", trainer.job_id, trainer.attempt)
            await trainer.terminate()

    async def go(self, cmd: Command) -> CommandResult:
        """A warm trainer trains: from the checkpoint named, which must be one of the job's own."""
        fail = lambda error, message: CommandResult(command_id=cmd.command_id, ok=False, error=error, message=message)  # noqa: E731
        trainer = self.trainers.get(cmd.job_id)
        if trainer is not None and trainer.attempt == cmd.attempt and not trainer.warm:  # a retried go
            return CommandResult(command_id=cmd.command_id, ok=True, pid=trainer.pid, job_dir=str(trainer.folder.root))
        if trainer is not None and not trainer.done.is_set():
            return fail(CommandError.JOB_RUNNING, f"attempt {trainer.attempt} of job {cmd.job_id} still runs here")
        trainer = self.prepared.get(cmd.job_id)
        if trainer is None or trainer.attempt != cmd.attempt or trainer.done.is_set():
            return fail(CommandError.NOT_RUNNING, f"no prepared attempt {cmd.attempt} of job {cmd.job_id} here")
        own = trainer.folder.output_dir.resolve()
        if cmd.resume_from and Path(cmd.resume_from).resolve().parent != own:
            return fail(CommandError.REFUSED, f"resume_from {cmd.resume_from[:300]!r} is not a checkpoint of this job")
        try:
            resume = trainer.go(cmd.resume_from)
        except job_files.UnsafeJobFile as err:
            return fail(CommandError.REFUSED, str(err)[:2000])
        self.prepared.pop(cmd.job_id, None)
        self.trainers[cmd.job_id] = trainer
        trainer.register(self.registry)
        log.info("job %s attempt %d: warm trainer resumes from %s", cmd.job_id, cmd.attempt, resume or "the start")
        return CommandResult(command_id=cmd.command_id, ok=True, pid=trainer.pid, job_dir=str(trainer.folder.root))

    async def stop(self, cmd: Command) -> CommandResult:
        """Checkpoint-stop, answered once the trainer has exited with its checkpoint."""
        trainer = self.trainers.get(cmd.job_id)
        if trainer is None or trainer.attempt != cmd.attempt:
            return CommandResult(
                command_id=cmd.command_id,
                ok=False,
                error=CommandError.NOT_RUNNING,
                message=f"job {cmd.job_id} attempt {cmd.attempt} is not running on {self.node}",
            )
        if not trainer.done.is_set():
            trainer.request_stop()
            try:
                await asyncio.wait_for(trainer.done.wait(), self.stop_timeout_s)
            except TimeoutError:  # it ignores the request: it is killed, as a stop must end it
                log.warning(
                    "job %s attempt %d did not stop within %.0f s: terminating it",
                    cmd.job_id,
                    cmd.attempt,
                    self.stop_timeout_s,
                )
                await trainer.terminate()
                await trainer.done.wait()
        last = trainer.last_event
        outcome = trainer.outcome
        stopped = outcome in (ExitOutcome.STOPPED, ExitOutcome.SUCCEEDED)
        return CommandResult(
            command_id=cmd.command_id,
            ok=stopped,
            error=None if stopped else CommandError.STOP_FAILED,
            message=f"trainer exited with code {trainer.exit_code}",
            outcome=outcome,
            checkpoint=last.get("checkpoint") if outcome == ExitOutcome.STOPPED else None,
            step=last.get("step"),
        )

    async def cancel(self, cmd: Command) -> CommandResult:
        """Terminate now; the answer names the job's newest complete checkpoint, to resume from."""
        trainer = self.trainers.get(cmd.job_id)
        if (warm := self.prepared.get(cmd.job_id)) is not None and warm.attempt == cmd.attempt:
            trainer = self.prepared.pop(cmd.job_id)
        if trainer is not None and not trainer.done.is_set() and trainer.attempt == cmd.attempt:
            trainer.cancelled = True
            await trainer.terminate()
        folder = trainer.folder if trainer is not None else JobFolder(self.storage_root / "jobs" / cmd.job_id)
        checkpoint, step = folder.newest_checkpoint()
        return CommandResult(command_id=cmd.command_id, ok=True, message="cancelled", checkpoint=checkpoint, step=step)

    # --- reporting -------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(
        self, job_id: str, attempt: int, msg_id: str, kind: str, data: dict[str, Any], until_sent: bool = False
    ) -> bool:
        """Publish a job event, retrying while NATS is away; an exit (`until_sent`) is retried for as
        long as this worker runs, since a job's end must never be lost. True once published."""
        event = JobEvent(job_id=job_id, kind=kind, ts=self.clock.now(), attempt=attempt, node=self.node, data=data)
        if self.cut_off and not until_sent:  # each try would wait out its timeout, holding the next events
            return False

        def failed(tried: int, err: BaseException | None) -> None:
            if tried % 10 == 1:
                log.warning("job %s: event %s not published yet (%s)", job_id, kind, err)

        subject = self.bus.subjects.job_events(job_id, self.node)
        try:  # NATS down for a moment: retry, the msg id dedupes
            await retrying(
                self.clock,
                wait=steps(0.2, 0.5, 1, 2, 5, 10),
                attempts=None if until_sent else 7,
                until=None if until_sent else lambda: self.cut_off,  # cut off: a stale attempt's by now
                on_failure=failed,
            )(self.bus.publish_js, subject, event, msg_id, signed=True)
            return True
        except Exception:  # noqa: BLE001 - given up
            log.error("job %s: event %s lost after retries", job_id, msg_id)
            return False

    async def _watch(self, trainer: TrainerProcess) -> None:
        async def forward(job_id: str, attempt: int, seq: int, event: dict[str, Any]) -> None:
            trainer_spans.event(job_id, attempt, event)
            kind = event.get("event")
            if trainer.warm:  # not the job's attempt yet: nothing goes out
                if kind == "prepared":
                    trainer.ready.set()
                return
            if kind in _FORWARDED and trainer.node_rank == 0:  # rank 0's node speaks for a multi-node job
                if kind == "progress" and event.get("comm_latency_us") and trainer.rank_nodes:
                    event = {**event, "comm_latency_us_by_node": by_node(event["comm_latency_us"], trainer.rank_nodes)}
                await self._publish(job_id, attempt, self.bus.private_msg_id(job_id, attempt, seq), kind, event)

        await trainer.follow(forward)
        if trainer.warm:  # never told to go: the attempt never began, its end is nobody's news
            log.info(
                "job %s attempt %d: warm trainer ended (code %s)", trainer.job_id, trainer.attempt, trainer.exit_code
            )
            if self.prepared.get(trainer.job_id) is trainer:
                self.prepared.pop(trainer.job_id)
            return
        await self._report_exit(trainer, trainer.exit_code)
        trainer.unregister(self.registry)

    async def _report_exit(self, trainer: TrainerProcess, code: int | None, **extra: Any) -> None:
        """The `exited` event: how the attempt ended, and the newest complete checkpoint to resume from."""
        outcome = trainer.outcome
        last = trainer.last_event or trainer.read_last_event()
        newest, newest_step = trainer.folder.newest_checkpoint()
        data = {
            "exit_code": code,
            "outcome": outcome.value,
            "last_event": last,
            "node_rank": trainer.node_rank,
            "log": str(trainer.log_path),
            "output_dir": str(trainer.folder.output_dir),
            "checkpoint": newest,
            "checkpoint_step": newest_step,
            "backend_job": trainer.backend_job,
            **extra,
        }
        if outcome == ExitOutcome.STOPPED and trainer.died_with_worker:
            data |= {"checkpoint": newest, "step": newest_step}
        elif outcome == ExitOutcome.STOPPED:
            data |= {"checkpoint": last.get("checkpoint") or newest, "step": last.get("step")}
        if outcome in (ExitOutcome.FAILED, ExitOutcome.OOM, ExitOutcome.KILLED):
            data["error"] = trainer.ended_by or last.get("error") or _log_tail(trainer.log_path)
        log.info("job %s attempt %d exited: %s (code %s)", trainer.job_id, trainer.attempt, outcome, code)
        # An id no other node can predict: one known in advance could be published first, and JetStream would drop this.
        exit_id = self.bus.private_msg_id(trainer.job_id, trainer.attempt, "exit", trainer.node_rank)
        self._note_finished(trainer, outcome, reported=False)
        trainer_spans.exited(trainer.job_id, trainer.attempt, outcome.value, code)
        if await self._publish(trainer.job_id, trainer.attempt, exit_id, "exited", data, until_sent=True):
            self._note_finished(trainer, outcome, reported=True)

    def _note_finished(self, trainer: TrainerProcess, outcome: ExitOutcome, reported: bool) -> None:
        key = (trainer.job_id, trainer.attempt)
        self.finished.pop(key, None)
        self.finished[key] = FinishedTrainer(
            job_id=trainer.job_id, attempt=trainer.attempt, outcome=outcome, reported=reported
        )
        while len(self.finished) > FINISHED_KEPT:
            self.finished.pop(next(iter(self.finished)))

    async def stop_leftover_trainers(self, timeout_s: float = 120.0) -> None:
        """Trainers a previous run of this worker left behind are stopped cleanly, never orphaned.

        Each gets a checkpoint-stop; its exit is reported from its events file (the exit code
        of a process that is not our child cannot be read), so the executor requeues the job
        to resume from that checkpoint.
        """
        for record in sorted(self.registry.glob("*.json")) if self.registry.exists() else []:
            leftover = self.backend.from_record(record)
            if leftover is None:
                record.unlink(missing_ok=True)
                continue
            self.leftovers[leftover.job_id] = leftover
            if leftover.alive():
                log.info(
                    "found trainer of job %s attempt %d (pid %d) from a previous run: checkpoint-stop",
                    leftover.job_id,
                    leftover.attempt,
                    leftover.adopted_pid,
                )
                leftover.request_stop()
                await leftover.wait_gone(timeout_s)
            if leftover.outcome == ExitOutcome.KILLED:
                # No final event: it died with its worker (trainers do, by construction, and one may still be
                # dying when the worker is back): not the job's doing. Reported as stopped at the job's newest
                # complete checkpoint, so the job is requeued to resume from it.
                leftover.died_with_worker = True
            await self._report_exit(leftover, None, adopted=True, died_with_worker=leftover.died_with_worker)
            leftover.done.set()
            self.leftovers.pop(leftover.job_id, None)
            record.unlink(missing_ok=True)
        # Namespaces of trainers that died with an earlier run of this worker (none of them outlived it).
        live = {t.network.name for t in self.trainers.values() if t.network is not None and not t.done.is_set()}
        await asyncio.to_thread(sweep, self.node, live)


def by_node(per_rank: list[float], rank_nodes: list[str]) -> dict[str, list[float]]:
    """Per-rank samples grouped by the node each rank runs on."""
    grouped: dict[str, list[float]] = {}
    for value, node in zip(per_rank, rank_nodes):
        grouped.setdefault(node, []).append(value)
    return grouped


def _log_tail(path: Path, lines: int = 15) -> str:
    """The log's last lines, from its last LOG_TAIL_BYTES only, never through a symlink (worker/job_files.py)."""
    tail = job_files.read_tail(path, LOG_TAIL_BYTES).decode(errors="replace")
    return "\n".join(tail.splitlines()[-lines:])
