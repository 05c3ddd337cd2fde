"""The executor: carries decisions out with the workers and owns job status.

It consumes decisions (ADC_DECISIONS) and job events (ADC_JOBS) from durable JetStream
consumers and acks each only after its effect is committed, so a killed executor loses
nothing and redone work is a no-op: decisions are recorded by id, transitions are
idempotent, audit events carry deterministic ids, and workers treat a repeated start as done.

This module is the bus side and the wiring; each collaborator gets the small parts it uses:
`store` (jobs), `node_store`, `protocol_store`, `ledger` (decisions), `transport` (commands to
workers), `lifecycle` (start, cancel, resume, job events), `protocols`, `nodes` (loss, reconcile).

Several executors may run; one leads (shared/infra/leases.py). Every instance keeps its view of the
nodes warm (heartbeats); only the leader consumes, carries out, watches nodes and sends
commands, each stamped with its fencing token. A new leader records its token (so a replaced
one that wakes up is refused by the ledger), resumes the protocols in flight and carries on the
decisions its predecessor had received but not finished, at once rather than after the ack wait.
A leader whose lease lapses stops all of that by its deadline.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from nats.aio.msg import Msg

from services.executor.audit import Auditor, Mover
from services.executor.ledger import DecisionState, Deposed, Fence, Ledger, StaleDecision
from services.executor.lifecycle import Lifecycle
from services.executor.locks import JobLocks
from services.executor.node_store import NodeStore
from services.executor.nodes import NodeMonitor
from services.executor.protocol_store import ProtocolStore
from services.executor.protocols import KINDS as PROTOCOL_KINDS
from services.executor.protocols import ProtocolRunner
from services.executor.senders import EventSenders
from services.executor.store import JobStore
from services.executor.transport import WorkerTransport
from shared.contracts.job_status import NAMED
from shared.contracts.messages import Decision, Heartbeat, JobEvent
from shared.contracts.node_status import InvalidNodeTransition, NodeStatus
from shared.infra import tracing
from shared.infra.bus import Bus, consume
from shared.infra.clock import Clock, SystemClock
from shared.infra.config import AdcConfig
from shared.infra.leases import Lease, audit_soon
from shared.infra.rejections import refused_unauthenticated, rejected
from shared.infra.retry import doubling, retrying

log = logging.getLogger(__name__)
NODE_ACTIONS = {"cordon": NodeStatus.CORDONED, "uncordon": NodeStatus.READY, "drain": NodeStatus.DRAINING}


# A decision being carried out (a protocol may take minutes) keeps telling JetStream so, so the
# ack wait can stay short: the decisions of an executor killed mid-way come back to its
# successor within this, not after the longest protocol there could be.
DECISION_ACK_WAIT_S = 30.0


async def _keep_in_progress(msg: Msg, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)  # real time, not the clock's: JetStream's ack wait runs on the server
        try:
            await msg.in_progress()
        except Exception:  # the bus is away; the ack wait decides
            pass


class Executor:
    def __init__(self, bus: Bus, pool: asyncpg.Pool, config: AdcConfig, clock: Clock | None = None) -> None:
        self.bus = bus
        self.config = config
        self.clock = clock or SystemClock()
        self.locks = JobLocks()
        self._node_written: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()
        self.lease = Lease(bus, "executor", config.leases.lease_s) if config.leases.enabled else None
        self.fence = Fence(self.lease)
        self._leading: asyncio.Task | None = None
        self._lead_stop = asyncio.Event()
        self._stop = asyncio.Event()
        self.store = JobStore(pool, self.clock)
        self.node_store = NodeStore(pool, self.clock)
        self.protocol_store = ProtocolStore(pool, self.clock)
        self.ledger = Ledger(pool, self.clock, self.fence)
        self.audit = Auditor(bus, self.clock)
        self.senders = EventSenders(bus.subjects, config.bus.credentials_dir)  # who published and signed each job event
        move = Mover(self.store, self.audit, self.fence)
        w = config.worker
        self.transport = WorkerTransport(
            bus, w.command_timeout, config.controller.timeout, self.node_store.address, self.clock, self.fence
        )
        self.lifecycle = Lifecycle(self.store, move, self.transport, self.audit, self.ledger, self.clock)
        self.protocols = ProtocolRunner(
            self.store,
            self.protocol_store,
            self.node_store,
            move,
            self.transport,
            self.lifecycle,
            self.audit,
            self.ledger,
            w.node_timeout,
            warm_moves=config.controller.warm_moves,
        )
        self.nodes = NodeMonitor(
            self.store,
            self.node_store,
            self.protocol_store,
            move,
            self.transport,
            self.audit,
            self.clock,
            w.node_timeout,
            self.locks,
        )

    async def run(self, stop: asyncio.Event) -> None:
        s = self.bus.subjects
        self._stop = stop
        hb = await self.bus.nc.subscribe(s.heartbeat("*"), cb=self._on_heartbeat)  # warm, leading or not
        try:
            if self.lease is None:
                await self.lead(stop)
            else:
                await self.lease.keep(stop, self._leadership_changed)
        finally:
            await hb.unsubscribe()
            if self._tasks:  # the process's own grace to finish what it started (real time)
                await asyncio.wait(self._tasks, timeout=10)

    async def lead(self, stop: asyncio.Event) -> None:
        s = self.bus.subjects
        if self.fence.token is not None:
            await self._claim(stop)
        await self.resume_protocols()
        await self.carry_on_unfinished()
        await asyncio.gather(
            consume(
                self.bus,
                s.decisions_stream,
                s.decisions,
                f"{s.prefix}-executor",
                self._on_decision,
                stop,
                ack_wait=DECISION_ACK_WAIT_S,
            ),
            consume(
                self.bus,
                s.jobs_stream,
                s.job_events("*"),
                f"{s.prefix}-executor-jobs",
                self._on_job_event,
                stop,
                on_dead_letter=self._job_event_dead_lettered,
            ),
            self.nodes.watch(stop),
        )

    async def _claim(self, stop: asyncio.Event) -> None:
        """Record this leader's token, waiting out a Postgres outage; Deposed if a newer one is there."""
        if stop.is_set():
            return
        try:  # Postgres away: nothing can be carried out until it is back
            await retrying(
                self.clock,
                wait=doubling(0.2, 5),
                until=stop.is_set,
                never_on=(Deposed,),
                on_failure=lambda _, err: log.warning("executor token not recorded yet: %s", err),
            )(self.ledger.claim, self.fence.token)
        except Deposed:
            raise
        except Exception:  # noqa: BLE001 - stopping while Postgres is still away
            return

    async def _leadership_changed(self, leading: bool) -> None:
        if leading:
            self.fence.token = self.lease.token
            lead_stop = asyncio.Event()
            self._lead_stop = lead_stop
            self._leading = asyncio.create_task(self._lead_until(lead_stop))
        else:
            self.fence.token = None
            await self._stand_down()
        log.warning(
            "executor %s %s (token %s)", self.lease.instance, "leads" if leading else "follows", self.lease.last_token
        )
        asyncio.ensure_future(audit_soon(self.bus, self.lease.audit_event(leading), self._stop, self.clock))

    async def _lead_until(self, lead_stop: asyncio.Event) -> None:
        try:
            await self.lead(lead_stop)
        except Deposed as err:
            log.error("executor steps down: %s", err)
            await self.lease.release()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leading failed")

    async def _stand_down(self) -> None:
        """Stop everything a leader does, now: consumers, node watch, decisions being carried out.
        What was not acked comes back to the next leader (and the ledger names what it had begun)."""
        if self._leading is None:
            return
        self._lead_stop.set()
        running = [self._leading, *self._tasks]
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=5)
        self._leading = None

    async def carry_on_unfinished(self) -> None:
        """Decisions a replaced executor received and did not finish are carried out now (a
        redelivered copy later finds them done)."""
        for decision in await self.ledger.unfinished():
            if decision.action.action in PROTOCOL_KINDS:
                continue  # resume_protocols carries those on
            self._spawn(
                tracing.within(
                    "executor",
                    f"decision {decision.action.action}",
                    self._carry_on(decision),
                    job_id=decision.action.job_id,
                    decision_id=decision.decision_id,
                )
            )

    async def _carry_on(self, decision: Decision) -> None:
        try:
            async with self.locks(decision.action.job_id):
                if await self.ledger.record(decision) == DecisionState.RECEIVED:
                    await self.dispatch(decision)
        except Exception:
            log.exception("unfinished decision %s failed; its redelivery retries it", decision.decision_id)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resume_protocols(self) -> None:
        """A restarted executor carries on the protocols it was in the middle of, from their step."""
        for proto in await self.protocol_store.running():
            log.info("resuming %s of %s at step %s", proto.kind, proto.job_id, proto.step)
            await self.audit(
                f"{proto.id}:resumed:{proto.step}",
                "protocol.resumed",
                job_id=proto.job_id,
                decision_id=proto.id,
                action=proto.kind.value,
                reason=f"executor restarted; {proto.kind} resumes at step {proto.step}",
            )

            async def resume(p=proto):
                async with self.locks(p.job_id):
                    await self.protocols.run(p)

            self._spawn(resume())

    # --- decisions -------------------------------------------------------------------

    async def _on_decision(self, msg: Msg) -> None:
        try:
            decision = Decision.decode(msg.data)
        except ValueError as err:
            rejected("decisions", err, msg.data, "executor")
            await msg.term()
            return
        # Each decision in its own task: a long protocol for one job does not hold up the others.
        self._spawn(
            tracing.within(
                "executor",
                f"decision {decision.action.action}",
                self._handle_decision(decision, msg),
                job_id=decision.action.job_id,
                decision_id=decision.decision_id,
            )
        )

    async def _handle_decision(self, decision: Decision, msg: Msg) -> None:
        alive = asyncio.ensure_future(_keep_in_progress(msg, DECISION_ACK_WAIT_S / 3))
        try:
            async with self.locks(decision.action.job_id):
                try:
                    if decision.action.action == "start":  # recorded together with its job's move
                        await self.lifecycle.record_and_start(decision)
                    elif await self.ledger.record(decision) == DecisionState.RECEIVED:
                        await self.dispatch(decision, msg.in_progress)
                except StaleDecision as stale:
                    a = decision.action
                    await self.audit(
                        f"{decision.decision_id}:refused",
                        "decision.refused",
                        job_id=a.job_id,
                        decision_id=decision.decision_id,
                        rule=decision.rule,
                        action=a.action,
                        reason=str(stale),
                    )
            await msg.ack()
        except Deposed:
            log.warning("decision %s left to the executor that leads", decision.decision_id)
        except Exception:
            log.exception("decision %s failed; it will be redelivered", decision.decision_id)
            await msg.nak(delay=2.0)
        finally:
            alive.cancel()

    async def dispatch(self, decision: Decision, progress=None) -> None:
        """Carry one recorded decision out; `progress` keeps a long one from being redelivered meanwhile."""
        kind = decision.action.action
        if kind == "start":
            await self.lifecycle.start(decision)
        elif kind == "cancel":
            await self.lifecycle.cancel_decision(decision)
        elif kind == "fail":
            await self.lifecycle.fail_decision(decision)
        elif kind == "resume":
            await self.lifecycle.resume(decision)
        elif kind in PROTOCOL_KINDS:
            await self.protocols.begin(decision, progress)
        elif kind in NODE_ACTIONS:
            # A drain only marks the node: the decider's drain rule moves its jobs, then cordons it.
            node, new = decision.action.node, NODE_ACTIONS[kind]
            reason = decision.action.reason + ("; the decider moves its jobs off" if kind == "drain" else "")
            try:
                await self.set_node_status(node, new, decision, reason)
            except (InvalidNodeTransition, LookupError) as err:
                return await self.lifecycle.refuse(decision, str(err))
            await self.ledger.finish(decision.decision_id, DecisionState.DONE, kind)
        else:
            await self.lifecycle.refuse(decision, f"action {kind!r} is not carried out by this executor")

    async def set_node_status(self, node: str, status: NodeStatus, decision: Decision, reason: str) -> None:
        await self.node_store.set_status(node, status)
        await self.audit(
            f"{decision.decision_id}:node.{status}",
            f"node.{status}",
            node=node,
            decision_id=decision.decision_id,
            actor=decision.actor,
            action=decision.action.action,
            rule=decision.rule,
            reason=reason,
        )

    # --- job events and heartbeats ---------------------------------------------------

    async def _on_job_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.decode(msg.data)
        except ValueError as err:
            rejected("job_events", err, msg.data, "executor")
            await msg.term()
            return
        if why := self.senders.refusal(event, msg):
            log.warning("%s event for job %s refused: %s", event.kind, event.job_id, why)
            refused_unauthenticated("job_events")
            await self.audit(
                f"{event.event_id}:event.refused",
                "event.refused",
                job_id=event.job_id,
                node=event.node,
                action=event.kind,
                reason=f"a {event.kind} event not from its sender was refused: {why}",
            )
            await msg.ack()
            return
        async with self.locks(event.job_id):
            await self.lifecycle.on_event(event)
        await msg.ack()

    async def _job_event_dead_lettered(self, msg: Msg, err: Exception) -> None:
        """An event of a job that cannot be recorded fails the job, saying why, rather than leave it
        running forever with its end never recorded."""
        event = JobEvent.decode(msg.data)
        async with self.locks(event.job_id):
            job = await self.store.get(event.job_id)
            if job is None or job.status not in NAMED["fail"].sources:
                return
            await self.lifecycle.move(
                job,
                "fail",
                finished_at=self.clock.now(),
                reason=f"its {event.kind} event (attempt {event.attempt}) could not be recorded:"
                f" {type(err).__name__}: {err}"[:1000],
            )

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = Heartbeat.decode(msg.data)
        except ValueError as err:
            rejected("heartbeats", err, msg.data, "executor")
            return
        if beat.node != self.bus.subjects.node_of(msg.subject):  # one node's worker speaking for another
            log.warning("heartbeat on %s names node %r: ignored", msg.subject, beat.node)
            return
        self.nodes.heard(beat.node)
        now = self.clock.now()
        if now - self._node_written.get(beat.node, float("-inf")) >= min(5.0, self.config.worker.node_timeout / 3):
            self._node_written[beat.node] = now
            try:
                await self.nodes.record(beat)
            except Exception as err:  # the next heartbeat tries again
                self._node_written.pop(beat.node, None)
                log.warning("heartbeat of %s not recorded: %s", beat.node, err)
        # Its trainers are acted on (a returned node's stale ones stopped) only once its row says
        # it is back.
        self.nodes.take_in(beat)
