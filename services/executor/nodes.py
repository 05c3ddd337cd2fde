"""Node lifecycle as the executor sees it: registration, loss, return, reconciliation.

A node whose heartbeats stop for `worker.node_timeout` (on the injected clock) is lost: its jobs
go back to the queue to resume from the newest complete checkpoint their worker reported. A
node heard from within that time is never lost, whatever the database says: while Postgres is
down no heartbeat can be written, and when it returns every node's row looks stale. So an
executor that has not been listening for a whole node timeout yet (one just started after an
outage) declares no node lost: it cannot tell a silent node from a stale row. When a
node comes back it is reconciled: any trainer it still runs for an attempt that is no longer
current is cancelled, so nothing is double-booked; and a job the database shows running on a
node whose heartbeats neither run it nor list it as finished is requeued, so no job is shown
running that is not. A finished attempt is left to its `exited` event, which JetStream keeps
until it is recorded: requeueing it would train a finished job again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.executor.audit import Auditor, Mover
from services.executor.node_store import NodeStore
from services.executor.protocol_store import ProtocolStore
from services.executor.store import JobStore
from services.executor.transport import WorkerTransport
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import Command, Heartbeat
from shared.infra.clock import Clock

log = logging.getLogger(__name__)
S = JobStatus
# Statuses in which a trainer should be running on the job's node.
_EXPECT_TRAINER = frozenset({S.STARTING, S.RUNNING})
_PROTOCOL_OWNED = (S.SCHEDULED, S.CHECKPOINTING, S.MIGRATING, S.RESIZING)
_ON_NODE = frozenset({S.SCHEDULED, S.STARTING, S.RUNNING})


class NodeMonitor:
    def __init__(
        self,
        store: JobStore,
        nodes: NodeStore,
        protocols: ProtocolStore,
        move: Mover,
        transport: WorkerTransport,
        audit: Auditor,
        clock: Clock,
        node_timeout: float,
        lock: Callable[[str], asyncio.Lock],
    ) -> None:
        self.store = store
        self.nodes = nodes
        self.protocols = protocols
        self.move = move
        self.transport = transport
        self.audit = audit
        self.clock = clock
        self.node_timeout = node_timeout
        self.lock = lock
        self.last_beat: dict[str, Heartbeat] = {}
        self.heard_at: dict[str, float] = {}  # node -> when its last heartbeat arrived, on the clock
        self.listening_since = clock.now()  # heartbeats are heard from construction on, leading or not
        self.missing_since: dict[tuple[str, int], float] = {}

    def heard(self, node: str) -> None:
        """The node is alive: heard before its row is written, which may be slow or fail."""
        self.heard_at[node] = self.clock.now()

    def take_in(self, beat: Heartbeat) -> None:
        """The trainers the node lists, reconciled from now on: called once its row is written (or tried)."""
        self.last_beat[beat.node] = beat

    async def record(self, beat: Heartbeat) -> None:
        change = await self.nodes.record_heartbeat(beat)
        if change is not None and change.old is None:
            await self.audit(
                f"{beat.node}:registered:{beat.started_at}",
                "node.registered",
                node=beat.node,
                reason=f"node {beat.node} registered {len(beat.devices)} device(s)",
                data={"devices": [d.model_dump() for d in beat.devices]},
            )
        elif change is not None:
            await self.audit(
                f"{beat.node}:returned:{beat.ts}",
                "node.ready",
                node=beat.node,
                reason=f"node {beat.node} is back: heartbeats again after it was lost",
            )

    async def watch(self, stop: asyncio.Event) -> None:
        """Look for lost nodes and unreported trainers once a second."""
        while not stop.is_set():
            await self.check()
            await self.clock.wait(stop, 1.0)  # on the clock: a test's advance() runs the check at once

    async def check(self) -> None:
        try:
            await self.find_lost()
            await self.reconcile()
        except Exception:  # the next pass tries again
            log.exception("node watch failed")

    async def find_lost(self) -> None:
        now = self.clock.now()
        if now - self.listening_since <= self.node_timeout:
            return  # not listened long enough to call any node silent
        alive = [node for node, at in self.heard_at.items() if now - at <= self.node_timeout]
        for change in await self.nodes.mark_lost(self.node_timeout, alive):
            node = change.node
            await self.audit(
                f"{node}:lost:{change.last_heartbeat.timestamp()}",
                "node.lost",
                node=node,
                reason=f"no heartbeat from {node} for more than {self.node_timeout:.0f}s",
                evidence={"last_heartbeat": change.last_heartbeat.isoformat(), "timeout_s": self.node_timeout},
            )
            for job in await self.store.on_node(node, _ON_NODE):
                async with self.lock(job.id):
                    await self.requeue(job.id, f"node {node} was lost")

    async def requeue(self, job_id: str, why: str) -> None:
        """Back to the queue, to resume from the newest complete checkpoint the worker reported."""
        job = await self.store.get(job_id)
        if job is None or job.status not in _ON_NODE:
            return
        if await self.protocols.running_for(job_id):
            return  # the protocol's own timeouts and rollback handle it
        resume, step = job.last_checkpoint, job.last_checkpoint_step
        await self.move(
            job,
            "requeue",
            resume_from=resume,
            reason=f"{why}; requeued to resume from {resume or 'the start'}"
            + (f" (step {step})" if step is not None else ""),
            audit_data={"lost_progress_from_step": job.progress.get("step"), "resume_step": step},
        )

    async def reconcile(self) -> None:
        now = self.clock.now()
        for job, changed in await self.store.in_status(_EXPECT_TRAINER):
            beats = [self.last_beat.get(node) for node in job.nodes]
            if any(b is None or b.ts < changed + 1 for b in beats):
                continue  # no heartbeat sent after the job got here yet
            listed = all(b.knows(job.id, job.attempt) for b in beats)
            key = (job.id, job.attempt)
            if listed:
                self.missing_since.pop(key, None)
                continue
            first = self.missing_since.setdefault(key, now)
            if now - first > self.node_timeout:  # its exit event would have come by now
                self.missing_since.pop(key, None)
                async with self.lock(job.id):
                    await self.requeue(job.id, f"node {','.join(job.nodes)} no longer runs its trainer")
        # Trainers of attempts that are no longer current (a node that came back) are stopped.
        # Read the jobs now, after the heartbeats: a trainer's attempt is written before it starts.
        # The beats taken once, before the read: one arriving during it may list a trainer started
        # since, whose job this read did not fetch (it was then stopped as if it had no job).
        beats = list(self.last_beat.items())
        listed = {t.job_id for _, beat in beats for t in beat.running}
        if not listed:
            return
        jobs = await self.store.by_ids(list(listed))
        for node, beat in beats:
            for t in beat.running:
                job = jobs.get(t.job_id)
                if job is not None:
                    if job.attempt == t.attempt and node in job.nodes:
                        continue
                    if job.status in _PROTOCOL_OWNED:
                        continue  # mid-protocol: the protocol owns that trainer
                cmd = Command(
                    command_id=f"{t.job_id}:{t.attempt}:stale", kind="cancel", job_id=t.job_id, attempt=t.attempt
                )
                result = await self.transport.send(node, cmd, attempts=1)
                await self.audit(
                    f"{t.job_id}:{t.attempt}:{node}:stale",
                    "node.reconciled",
                    node=node,
                    job_id=t.job_id,
                    reason=f"{node} still ran attempt {t.attempt} of {t.job_id}, which is no longer "
                    f"current; stopped it",
                    data={"ok": result.ok},
                )
