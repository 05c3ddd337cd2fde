"""The decider's loop: build a snapshot, run the rules, arbitrate, publish decisions.

Rules are pure functions; the engine owns everything with side effects. A decision in
flight is an expectation: the job is not decided again until the executor is seen to act
on it, or the expectation times out.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

import asyncpg
from nats.aio.msg import Msg

from services.decider.rules import priority_fifo
from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.actions import NodeGpus
from shared.bus import Bus
from shared.clock import Clock, SystemClock
from shared.config import AdcConfig
from shared.job_status import HOLDING_GPUS, JobStatus
from shared.messages import AuditEvent, Decision, Heartbeat

log = logging.getLogger(__name__)

_JOBS_SQL = (
    "SELECT id, name, status, priority, priority_rank, gpus, preemptible, team, placement, resume_from,"
    " extract(epoch FROM submitted_at) AS submitted, coalesce((spec->>'multi_node')::boolean, false) AS multi_node"
    " FROM jobs WHERE status = ANY($1::text[])"
)
_LIVE = [JobStatus.PENDING.value] + [s.value for s in HOLDING_GPUS]


@dataclass
class InFlight:
    decision_id: str
    issued_at: float
    placement: tuple[NodeGpus, ...]


class DeciderEngine:
    def __init__(self, bus: Bus, pool: asyncpg.Pool, config: AdcConfig, clock: Clock | None = None) -> None:
        self.bus = bus
        self.pool = pool
        self.config = config
        self.clock = clock or SystemClock()
        self.heartbeats: dict[str, tuple[Heartbeat, float]] = {}
        self.in_flight: dict[str, InFlight] = {}
        self.pending_reasons: dict[str, str] = {}
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        s = self.bus.subjects
        subs = [await self.bus.nc.subscribe(s.heartbeat("*"), cb=self._on_heartbeat),
                await self.bus.nc.subscribe(s.job_events("*"), cb=self._on_job_event)]
        try:
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception:  # a failed pass is retried by the next one
                    log.exception("evaluation failed")
                self._wake.clear()
                waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())}
                _, rest = await asyncio.wait(waiters, timeout=self.config.controller.interval,
                                             return_when=asyncio.FIRST_COMPLETED)
                for w in rest:
                    w.cancel()
                await asyncio.sleep(0.05)  # let a burst of events collapse into one pass
        finally:
            for sub in subs:
                await sub.unsubscribe()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = Heartbeat.decode(msg.data)
        except ValueError:
            return
        first = beat.node not in self.heartbeats
        self.heartbeats[beat.node] = (beat, self.clock.now())
        if first:
            self._wake.set()

    async def _on_job_event(self, msg: Msg) -> None:
        if b'"kind":"progress"' not in msg.data:  # progress changes nothing the rules look at
            self._wake.set()

    async def snapshot(self) -> Snapshot:
        now = self.clock.now()
        rows = await self.pool.fetch(_JOBS_SQL, _LIVE)
        jobs = tuple(
            JobView(id=r["id"], name=r["name"], status=JobStatus(r["status"]), priority=r["priority"],
                    priority_rank=r["priority_rank"], gpus=r["gpus"], preemptible=r["preemptible"],
                    submitted_at=float(r["submitted"]), team=r["team"],
                    placement=tuple(NodeGpus(node=p["node"], gpus=tuple(p["gpus"])) for p in r["placement"] or []),
                    resume_from=r["resume_from"], multi_node=r["multi_node"])
            for r in rows
        )
        self._expire_in_flight(jobs, now)
        used: dict[str, set[int]] = {}
        for job in jobs:
            held = job.placement if job.status in HOLDING_GPUS else ()
            if job.id in self.in_flight:
                held = held + self.in_flight[job.id].placement
            for part in held:
                used.setdefault(part.node, set()).update(part.gpus)
        timeout = self.config.worker.node_timeout
        nodes = {}
        for node, (beat, seen) in self.heartbeats.items():
            devices = tuple(d.index for d in beat.devices)
            nodes[node] = NodeView(id=node, devices=devices, rack=beat.rack, last_seen=seen,
                                   free=tuple(i for i in devices if i not in used.get(node, set())),
                                   schedulable=now - seen <= timeout)
        return Snapshot(ts=now, nodes=nodes, jobs=jobs)

    def _expire_in_flight(self, jobs: tuple[JobView, ...], now: float) -> None:
        pending = {j.id for j in jobs if j.status == JobStatus.PENDING}
        limit = 3 * self.config.controller.timeout
        for job_id, flight in list(self.in_flight.items()):
            # Acted on (no longer pending) or never acted on within the limit: stop expecting.
            if job_id not in pending or now - flight.issued_at > limit:
                del self.in_flight[job_id]

    async def tick(self) -> list[Decision]:
        snap = await self.snapshot()
        started = time.perf_counter()
        try:
            actions, waiting = priority_fifo.decide(snap, self.config)
        except Exception as err:  # a failing rule is isolated and audited; the loop goes on
            log.exception("rule %s failed", priority_fifo.NAME)
            await self._audit_rule_error(priority_fifo.NAME, err)
            return []
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.pending_reasons = waiting
        decisions = []
        for action in actions:
            if action.job_id in self.in_flight:
                continue
            decision = Decision(decision_id=uuid.uuid4().hex, ts=self.clock.now(), rule=priority_fifo.NAME,
                                action=action, snapshot_ts=snap.ts)
            await self.bus.audit(AuditEvent(
                event_id=f"{decision.decision_id}:decided", ts=decision.ts, source="decider", kind="decision",
                job_id=action.job_id, node=action.placement[0].node, decision_id=decision.decision_id,
                rule=decision.rule, action=action.action, reason=action.reason, evidence=action.evidence,
                data={"snapshot_ts": snap.ts, "rule_ms": round(elapsed_ms, 3)},
            ))
            await self.bus.publish_js(self.bus.subjects.decisions, decision, decision.decision_id)
            self.in_flight[action.job_id] = InFlight(decision.decision_id, decision.ts, tuple(action.placement))
            decisions.append(decision)
            log.info("decided %s %s: %s", action.action, action.job_id, action.reason)
        return decisions

    async def _audit_rule_error(self, rule: str, err: Exception) -> None:
        await self.bus.audit(AuditEvent(
            event_id=uuid.uuid4().hex, ts=self.clock.now(), source="decider", kind="rule.error", rule=rule,
            reason=f"rule {rule} raised {type(err).__name__}: {err}",
        ))
