"""The executor alone on the real NATS and Postgres, driven through its bus interface.

Workers are recording doubles that speak the real command protocol (request/reply on the
node's command subject, job events on ADC_JOBS, heartbeats); what each answers is scripted per
test. Every party connects as its own bus role: the executor as `executor`, each double as
its node's `worker-<node>`, decisions come from a `decider` connection, which also reads the
audit subject. Time is a ManualClock: node timeouts, command timeouts, the node monitor's checks and
retry back-offs pass when the test says so (`clock.advance`, `until_time_passes`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.executor.executor import Executor
from shared.contracts.actions import NodeGpus
from shared.contracts.messages import (
    AuditEvent,
    Command,
    CommandError,
    CommandResult,
    Decision,
    Device,
    FinishedTrainer,
    Heartbeat,
    JobEvent,
    RunningTrainer,
)
from shared.contracts.subjects import API_SOURCE
from shared.infra.bus import Bus
from shared.infra.clock import ManualClock
from shared.infra.config import parse_config
from shared.infra.db import create_pool, service_url

_ids = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_ids)}-{uuid.uuid4().hex[:4]}"


Reply = Callable[[Command], CommandResult | None]  # None: do not answer at all


@dataclass
class FakeWorker:
    """A node double: answers commands as scripted, records them, heartbeats on demand."""

    harness: Harness
    node: str
    gpus: int = 2
    commands: list[Command] = field(default_factory=list)
    replies: dict[str, Reply] = field(default_factory=dict)  # kind -> reply; default: ok
    running: dict[str, int] = field(default_factory=dict)  # job -> attempt it runs
    finished: dict[str, tuple[int, str]] = field(default_factory=dict)  # job -> (attempt, outcome) that ended here
    sub: Any = None
    bus: Bus | None = None

    async def listen(self) -> FakeWorker:
        self.bus = await self.harness.env.bus(f"worker-{self.node}")
        self.sub = await self.bus.nc.subscribe(self.bus.subjects.command(self.node), cb=self._on)
        await self.beat()
        return self

    async def _on(self, msg) -> None:
        cmd = Command.decode(msg.data)
        self.commands.append(cmd)
        reply = self.replies.get(cmd.kind, self._ok)(cmd)
        if reply is None:
            return
        if reply.ok and cmd.kind in ("start", "go"):
            self.running[cmd.job_id] = cmd.attempt
        elif cmd.kind in ("stop", "cancel"):
            self.running.pop(cmd.job_id, None)
        await msg.respond(reply.encode())

    def _ok(self, cmd: Command) -> CommandResult:
        if cmd.kind in ("start", "prepare", "go"):
            return CommandResult(command_id=cmd.command_id, ok=True, pid=4242, job_dir=f"/jobs/{cmd.job_id}")
        if cmd.kind == "stop":
            return CommandResult(
                command_id=cmd.command_id,
                ok=True,
                outcome="stopped",
                step=20,
                checkpoint=f"/jobs/{cmd.job_id}/output/checkpoint-20",
            )
        return CommandResult(command_id=cmd.command_id, ok=True, message="cancelled")

    def kinds(self, job_id: str) -> list[str]:
        return [c.kind for c in self.commands if c.job_id == job_id]

    async def beat(self) -> None:
        beat = Heartbeat(
            node=self.node,
            ts=self.harness.clock.now(),
            started_at=self.harness.started,
            devices=[Device(index=i, kind="cpu") for i in range(self.gpus)],
            running=[RunningTrainer(job_id=j, attempt=a, pid=4242, gpus=[0]) for j, a in self.running.items()],
            finished=[
                FinishedTrainer(job_id=j, attempt=a, outcome=o, reported=True) for j, (a, o) in self.finished.items()
            ],
        )
        await self.bus.nc.publish(self.bus.subjects.heartbeat(self.node), beat.encode())

    async def close(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()
            self.sub = None
        if self.bus is not None:
            await self.bus.close()
            self.bus = None


def refuse(error: CommandError, message: str = "scripted refusal") -> Reply:
    return lambda cmd: CommandResult(command_id=cmd.command_id, ok=False, error=error, message=message)


class Harness:
    def __init__(self, env, **config: Any) -> None:
        self.env = env
        self.clock = ManualClock(start=time.time())
        self.started = self.clock.now()
        self.config = parse_config(
            {
                "bus": {"url": env.nats_url, "prefix": env.prefix, "credentials_dir": str(env.keys.directory)},
                "database": {"url": env.database_url},
                "worker": {"node_timeout": 30, "command_timeout": 0.5},
                "controller": {"timeout": 1},
                **config,
            },
            env={},
        )
        self.audits: list[AuditEvent] = []
        self.workers: list[FakeWorker] = []

    async def __aenter__(self) -> Harness:
        self.pool = await create_pool(self.env.database_url)  # the test's view (and the api's inserts)
        self.executor_pool = await create_pool(service_url(self.env.database_url, "executor"))  # its own role
        self.bus = await self.env.bus("executor")
        self.decider = await self.env.bus("decider")  # publishes decisions, reads the audit subject
        self._audit_sub = await self.decider.nc.subscribe(self.decider.subjects.audit, cb=self._on_audit)
        self._reporters: dict[str, Bus] = {}  # who publishes job events: the api, or a node's worker
        await self.start_executor()
        return self

    async def _on_audit(self, msg) -> None:
        self.audits.append(AuditEvent.decode(msg.data))

    async def start_executor(self) -> None:
        self.executor = Executor(self.bus, self.executor_pool, self.config, clock=self.clock)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.executor.run(self.stop))

    async def stop_executor(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)

    async def __aexit__(self, *exc) -> None:
        for w in self.workers:
            await w.close()
        await self.stop_executor()
        await self._audit_sub.unsubscribe()
        for bus in [*self._reporters.values(), self.decider, self.bus]:
            await bus.close()
        await self.executor_pool.close()
        await self.pool.close()

    # --- the world ---------------------------------------------------------------------

    async def worker(self, node: str | None = None, gpus: int = 2) -> FakeWorker:
        w = await FakeWorker(self, node or unique("node-"), gpus).listen()
        self.workers.append(w)
        await self.until(lambda: self.node_status(w.node), f"node {w.node} registered")
        return w

    async def node_status(self, node: str) -> str | None:
        return await self.pool.fetchval("SELECT status FROM nodes WHERE id = $1", node)

    async def job(self, gpus: int = 1, **columns: Any) -> str:
        """A job as the api records it; `columns` put it where a test starts (as the executor would have)."""
        job_id = unique("j")
        await self.pool.execute(
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec)"
            " VALUES ($1, $1, 'test', 'default', 'low', 1, $2, true, $3)",
            job_id,
            gpus,
            {"name": job_id, "gpus": gpus, "train": {"per_device_train_batch_size": 4}},
        )
        return job_id

    async def row(self, job_id: str) -> dict:
        return dict(await self.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id))

    async def history(self, job_id: str) -> list[str]:
        return [
            r["new_status"]
            for r in await self.pool.fetch(
                "SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id
            )
        ]

    async def decision_state(self, decision_id: str) -> str | None:
        return await self.pool.fetchval("SELECT state FROM decisions WHERE decision_id = $1", decision_id)

    async def decide(
        self,
        action,
        decision_id: str | None = None,
        rule: str = "test",
        actor: str | None = None,
        msg_id: str | None = None,
        on_target_failure: str | None = None,
    ) -> str:
        d = Decision(
            decision_id=decision_id or uuid.uuid4().hex,
            ts=self.clock.now(),
            rule=rule,
            action=action,
            snapshot_ts=self.clock.now(),
            actor=actor,
            on_target_failure=on_target_failure,
        )
        await self.decider.publish_js(self.decider.subjects.decisions, d, msg_id or d.decision_id)
        return d.decision_id

    async def settled(self, decision_id: str) -> str:
        """Wait until the executor has finished with the decision; its final state."""
        await self.until(lambda: self._finished(decision_id), f"decision {decision_id} finished")
        return await self.decision_state(decision_id)

    async def _finished(self, decision_id: str) -> bool:
        return (await self.decision_state(decision_id)) not in (None, "received")

    async def event(self, job_id: str, kind: str, attempt: int, node: str = "n", **data: Any) -> None:
        e = JobEvent(job_id=job_id, kind=kind, ts=self.clock.now(), attempt=attempt, node=node, data=data)
        api = kind in ("submitted", "cancel_requested")
        reporter = await self.reporter("api" if api else f"worker-{node}")
        source = API_SOURCE if api else node  # each sender on its own subject, signed, as each does
        await reporter.publish_js(reporter.subjects.job_events(job_id, source), e, e.event_id, signed=True)

    async def reporter(self, role: str) -> Bus:
        if role not in self._reporters:
            self._reporters[role] = await self.env.bus(role)
        return self._reporters[role]

    async def status_becomes(self, job_id: str, status: str, timeout: float = 10.0) -> dict:
        await self.until(lambda: self._status_is(job_id, status), f"job {job_id} {status}", timeout)
        return await self.row(job_id)

    async def _status_is(self, job_id: str, status: str) -> bool:
        return (await self.row(job_id))["status"] == status

    async def until(self, predicate, what: str, timeout: float = 10.0, step: float = 0.0):
        """Until `predicate` (sync or async) holds. With `step`, the executor's clock moves that much at
        each look: for what waits on it (a command nobody answers, the node monitor's next check)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if step:
                self.clock.advance(step)
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"no {what} within {timeout}s (clock at +{self.clock.now() - self.started:.1f}s);"
            f" audit: {[(a.kind, a.reason) for a in self.audits][-15:]}"
        )

    async def until_time_passes(self, predicate, what: str, step: float = 0.25, timeout: float = 10.0):
        """As `until`, with the executor's clock moving `step` s at each look. Nothing else moves it."""
        return await self.until(predicate, what, timeout, step)

    def audited(self, kind: str, job_id: str | None = None) -> list[AuditEvent]:
        return [a for a in self.audits if a.kind == kind and (job_id is None or a.job_id == job_id)]

    async def running_job(self, worker: FakeWorker, gpus: tuple[int, ...] = (0,)) -> str:
        """A job started through a Start decision and reported running by its (fake) trainer."""
        from shared.contracts.actions import Start

        job_id = await self.job(gpus=len(gpus))
        await self.settled(
            await self.decide(
                Start(job_id=job_id, reason="test start", placement=[NodeGpus(node=worker.node, gpus=gpus)])
            )
        )
        await self.event(job_id, "started", 1, worker.node)
        await self.status_becomes(job_id, "running")
        return job_id
