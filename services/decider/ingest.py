"""Ingest: the decider's bus handlers, which keep the cluster view (heartbeats, metrics, progress
and checkpoints) and the job book (which jobs to read again) current and wake the regular pass
on what changes the queue.

The handlers take turns with the urgent pass through `IngestGate`: nats-py awaits each callback
in turn, so while messages are queued the handlers would never give the event loop back; the
gate gives it back every INGEST_SLICE_S, and holds the next message while a satisfied window's
urgent pass is due or under way (at most URGENT_HOLD_S), so that pass has the loop to itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.decider.cluster_view import ClusterView
from services.decider.snapshot_source import SnapshotSource
from shared.contracts.messages import AuditEvent, Heartbeat, JobEvent, NodeMetrics
from shared.contracts.subjects import API_EVENT_KINDS
from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.rejections import refused_not_placed, refused_unauthenticated, rejected

# The bus handlers run one message after another without giving the event loop back while messages
# are queued (nats-py awaits each callback in turn): after this long they let the loop run what is
# ready (a pass's Postgres answers, the urgent pass), so a backlog is not one long stall.
INGEST_SLICE_S = 0.002
URGENT_HOLD_S = 0.2  # the longest the handlers wait for an urgent pass (one waiting on a slow Postgres)

Handler = Callable[[Msg], Awaitable[None]]


class IngestGate:
    """Whose turn it is: the bus handlers', or an urgent pass's that is due or under way."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # Clear while a satisfied window waits for its urgent pass and while that pass runs: the bus
        # handlers hold the next message until then, so the pass has the event loop to itself.
        self._open = asyncio.Event()
        self._open.set()
        self._slice_began = time.perf_counter()

    def hold(self) -> None:
        """The urgent pass runs before the next message is taken."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def take_turn(self) -> None:
        """Before each message a bus handler takes: wait while an urgent pass is due or under way,
        and give the event loop back after INGEST_SLICE_S of handling messages in a row."""
        if not self._open.is_set():
            if not await self.clock.wait(self._open, URGENT_HOLD_S):
                self._open.set()  # a pass this slow does not hold up ingest: it goes on beside it
            self._slice_began = time.perf_counter()
        elif time.perf_counter() - self._slice_began >= INGEST_SLICE_S:
            await asyncio.sleep(0)
            self._slice_began = time.perf_counter()


class Ingest:
    """The bus handlers: messages in, the cluster view and the job book updated, passes woken."""

    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        view: ClusterView,
        source: SnapshotSource,
        gate: IngestGate,
        wake: Callable[[str], None],
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.view = view
        self.source = source
        self.gate = gate
        self._woken = wake  # run a regular pass soon, for this reason

    async def subscribe(self) -> list[Subscription]:
        s = self.bus.subjects
        return [
            await self.bus.nc.subscribe(s.heartbeat("*"), cb=self.in_turn(self._on_heartbeat)),
            await self.bus.nc.subscribe(s.metrics("*"), cb=self.in_turn(self._on_metrics)),
            await self.bus.nc.subscribe(s.job_events("*"), cb=self.in_turn(self._on_job_event)),
            await self.bus.nc.subscribe(s.audit, cb=self.in_turn(self._on_audit)),
        ]

    def in_turn(self, handler: Handler) -> Handler:
        async def in_turn(msg: Msg) -> None:
            await self.gate.take_turn()
            await handler(msg)

        return in_turn

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = Heartbeat.decode(msg.data)
        except ValueError as err:
            rejected("heartbeats", err, msg.data, "decider")
            return
        if beat.node != self.bus.subjects.node_of(msg.subject):  # a node speaking for another: forged
            return
        if self.view.heartbeat(beat, self.clock.now()):
            self._woken(f"node {beat.node} registered or changed")

    async def _on_metrics(self, msg: Msg) -> None:
        try:
            sample = NodeMetrics.decode(msg.data)
            if sample.node == self.bus.subjects.node_of(msg.subject):  # else one node's collector forging another's
                self.view.ingest(sample)
        except ValueError as err:
            rejected("metrics", err, msg.data, "decider")

    async def _on_job_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.decode(msg.data)
        except ValueError as err:
            rejected("job_events", err, msg.data, "decider")
            return
        book = self.source.book
        if self.bus.subjects.event_sender_refusal(
            msg.subject, event.kind, event.node
        ):  # a node speaking for another, or as the api
            refused_unauthenticated("job_events")
            return
        placed = event.kind in API_EVENT_KINDS or book.runs_on(event.job_id, event.attempt, event.node)
        if placed is False:  # from a node the attempt does not run on: its word on the job counts for nothing
            refused_not_placed()
            return
        if event.kind == "progress":  # progress wakes nothing; it may carry comm latency
            book.progress(event.job_id, event.attempt, event.node, event.data)
            if placed and "comm_latency_us_by_node" in event.data:  # rank 0's node speaks for the job's nodes
                try:
                    self.view.job_comm_latency(event.job_id, event.ts, event.data["comm_latency_us_by_node"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
            return
        if event.kind == "checkpointed" and placed:
            self.view.job_checkpointed(event.job_id, event.ts)
            book.checkpointed(event.job_id)
            return
        book.changed(event.job_id)
        self._woken("job event")

    async def _on_audit(self, msg: Msg) -> None:
        # Wake-ups, and which jobs to re-read: the executor audits every transition after committing
        # it, the api every submission and request. Policy and pause: each pass reads the tables.
        if b'"kind":"job.' in msg.data:
            try:
                event = AuditEvent.decode(msg.data)
            except ValueError as err:
                rejected("audit", err, msg.data, "decider")
                return
            if event.job_id:
                self.source.book.changed(event.job_id)
                self._woken(f"{event.kind} {event.job_id}")
            if event.kind == "job.move_requested":
                self.source.tables_changed(self.clock.now())
        elif b'"kind":"node.' in msg.data or b'"kind":"quota.' in msg.data:
            self.source.tables_changed(self.clock.now())
            self._woken("node or quota change")
        elif b'"kind":"policy.' in msg.data or b'"kind":"controller.' in msg.data:
            self.source.controller_changed(self.clock.now())
            self._woken("policy or controller change")
