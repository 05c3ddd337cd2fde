"""The executor: carries decisions out with the workers and owns job status.

It consumes decisions (ADC_DECISIONS) and job events (ADC_JOBS) from durable JetStream
consumers and acks each only after its effect is committed, so a killed executor loses
nothing and redone work is a no-op: decisions are recorded by id, transitions are
idempotent, audit events carry deterministic ids, and workers treat a repeated start as done.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from nats.aio.msg import Msg
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from services.executor import job_store
from services.executor.nodes import NodeMonitor
from services.executor.protocols import KINDS as PROTOCOL_KINDS, ProtocolRunner
from shared import tracing  # obs (issue 14)
from shared.actions import Cancel, Start
from shared.bus import Bus, consume
from shared.clock import Clock, SystemClock, utc
from shared.config import AdcConfig
from shared.job_status import InvalidTransition, JobStatus
from shared.messages import AuditEvent, Command, CommandResult, Decision, Heartbeat, JobEvent

log = logging.getLogger(__name__)
S = JobStatus
_EXIT_STATUS = {"succeeded": S.SUCCEEDED, "cancelled": S.CANCELLED, "failed": S.FAILED, "oom": S.FAILED,
                "killed": S.FAILED}


class Executor:
    def __init__(self, bus: Bus, pool: asyncpg.Pool, config: AdcConfig, clock: Clock | None = None) -> None:
        self.bus = bus
        self.pool = pool
        self.config = config
        self.clock = clock or SystemClock()
        self._job_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._node_written: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()
        self.protocols = ProtocolRunner(self)
        self.nodes = NodeMonitor(self)

    @asynccontextmanager
    async def job_lock(self, job_id: str):
        """One protocol or event at a time per job (and per node, keyed node:<id>)."""
        async with self._job_locks[job_id]:
            yield

    async def run(self, stop: asyncio.Event) -> None:
        s = self.bus.subjects
        hb = await self.bus.nc.subscribe(s.heartbeat("*"), cb=self._on_heartbeat)
        await self.resume_protocols()
        try:
            await asyncio.gather(
                consume(self.bus, s.decisions_stream, s.decisions, f"{s.prefix}-executor", self._on_decision,
                        stop, ack_wait=max(120.0, 4 * self.config.worker.command_timeout)),
                consume(self.bus, s.jobs_stream, s.job_events("*"), f"{s.prefix}-executor-jobs", self._on_job_event, stop),
                self.nodes.watch(stop),
            )
        finally:
            await hb.unsubscribe()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=10)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resume_protocols(self) -> None:
        """A restarted executor carries on the protocols it was in the middle of, from their step."""
        rows = await self.pool.fetch("SELECT * FROM protocols WHERE state = 'running' ORDER BY started_at")
        for proto in rows:
            log.info("resuming %s of %s at step %s", proto["kind"], proto["job_id"], proto["step"])
            await self.audit(f"{proto['id']}:resumed:{proto['step']}", "protocol.resumed", job_id=proto["job_id"],
                             decision_id=proto["id"], action=proto["kind"],
                             reason=f"executor restarted; {proto['kind']} resumes at step {proto['step']}")

            async def resume(p=proto):
                async with self.job_lock(p["job_id"]):
                    await self.protocols.run(p)

            self._spawn(resume())

    # --- audit -----------------------------------------------------------------------

    async def audit(self, event_id: str, kind: str, **fields: Any) -> None:
        await self.bus.audit(AuditEvent(event_id=event_id, ts=self.clock.now(), source="executor", kind=kind, **fields))

    async def _audit_transition(self, row: asyncpg.Record, decision_id: str | None = None, **data: Any) -> None:
        status = row["status"]
        await self.audit(
            f"{row['id']}:{row['attempt']}:{status}", f"job.{status}", job_id=row["id"], decision_id=decision_id,
            node=(row["placement"] or [{}])[0].get("node"), reason=row["status_reason"],
            data={"attempt": row["attempt"], "placement": row["placement"], **data},
        )

    async def move(self, job_id: str, new: JobStatus, decision_id: str | None = None, audit_data: dict | None = None,
                    **kw: Any) -> asyncpg.Record | None:
        """Transition and audit. A redelivered message finds the job moved and re-audits under the same id."""
        async with self.pool.acquire() as conn:
            row = await job_store.transition(conn, job_id, new, decision_id=decision_id, **kw)
            if row is None:
                row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
        await self._audit_transition(row, decision_id, **(audit_data or {}))
        return row

    # --- decisions -------------------------------------------------------------------

    async def _on_decision(self, msg: Msg) -> None:
        try:
            decision = Decision.decode(msg.data)
        except ValueError as err:
            log.error("undecodable decision dropped: %s", err)
            await msg.term()
            return
        # Each decision in its own task: a long protocol for one job does not hold up the others.
        self._spawn(tracing.within("executor", f"decision {decision.action.action}", self._handle_decision(decision, msg),
                                   job_id=decision.action.job_id, decision_id=decision.decision_id))  # obs (issue 14)

    async def record(self, decision: Decision) -> str:
        a = decision.action
        async with self.pool.acquire() as conn:
            return await job_store.record_decision(conn, decision.decision_id, a.job_id, decision.rule, a.action,
                                                   decision.model_dump(mode="json"))

    async def _handle_decision(self, decision: Decision, msg: Msg) -> None:
        action = decision.action
        try:
            async with self.job_lock(action.job_id):
                state = await self.record(decision)
                if state == "received":
                    await self._dispatch(decision, msg)
            await msg.ack()
        except Exception:
            log.exception("decision %s failed; it will be redelivered", decision.decision_id)
            await msg.nak(delay=2.0)

    async def _dispatch(self, decision: Decision, msg: Msg) -> None:
        kind = decision.action.action
        if kind == "start":
            await self._start(decision, msg)
        elif kind == "cancel":
            await self._cancel_decision(decision, msg)
        elif kind == "resume":
            await self._resume(decision)
        elif kind in PROTOCOL_KINDS:
            await self.protocols.begin(decision, msg)
        elif kind in ("cordon", "uncordon"):
            node = decision.action.node
            await self.set_node_status(node, "cordoned" if kind == "cordon" else "ready", decision,
                                       f"{node} {kind}ed" + (f" by {decision.actor}" if decision.actor else ""))
            await self.finish_decision(decision.decision_id, "done", kind)
        elif kind == "drain":
            await self.protocols.drain(decision, decision.action.node)
        else:
            await self.refuse(decision, f"action {kind!r} is not carried out by this executor")

    async def finish_decision(self, decision_id: str, state: str, outcome: str) -> None:
        async with self.pool.acquire() as conn:
            await job_store.finish_decision(conn, decision_id, state, outcome)

    async def set_node_status(self, node: str, status: str, decision: Decision, reason: str) -> None:
        await self.pool.execute("UPDATE nodes SET status = $2 WHERE id = $1 AND status <> 'lost'", node, status)
        await self.audit(f"{decision.decision_id}:node.{status}", f"node.{status}", node=node,
                         decision_id=decision.decision_id, actor=decision.actor, action=decision.action.action,
                         rule=decision.rule, reason=reason)

    async def _resume(self, decision: Decision) -> None:
        job = await self.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", decision.action.job_id)
        if job is None or job["status"] != S.PAUSED:
            return await self.refuse(decision, f"job is {job['status'] if job else 'missing'}, not paused")
        where = job["resume_from"] or "the start"
        await self.move(job["id"], S.PENDING, decision.decision_id,
                        reason=f"resumed by {decision.actor or decision.rule}; queued to continue from {where}")
        await self.finish_decision(decision.decision_id, "done", "queued")

    async def refuse(self, decision: Decision, why: str) -> None:
        a = decision.action
        await self.audit(f"{decision.decision_id}:refused", "decision.refused", job_id=a.job_id,
                         decision_id=decision.decision_id, rule=decision.rule, action=a.action, reason=why)
        async with self.pool.acquire() as conn:
            await job_store.finish_decision(conn, decision.decision_id, "refused", why)
        log.info("decision %s refused: %s", decision.decision_id, why)

    async def _start(self, decision: Decision, msg: Msg) -> None:
        action: Start = decision.action  # type: ignore[assignment]
        did = decision.decision_id
        async with self.pool.acquire() as conn:
            job = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", action.job_id)
            if job is None:
                return await self.refuse(decision, "no such job")
            resumed = job["status"] == S.SCHEDULED and await job_store.scheduled_by(conn, job["id"], did)
            if not resumed:
                if job["status"] != S.PENDING:
                    return await self.refuse(decision, f"job is {job['status']}, not pending")
                if job["cancel_requested"]:
                    return await self.refuse(decision, "job has a cancel request")
                booked = await job_store.booked_devices(conn, exclude_job=job["id"])
                clash = {f"{p.node}/{g}": booked[(p.node, g)] for p in action.placement for g in p.gpus if (p.node, g) in booked}
                if clash:
                    return await self.refuse(decision, f"devices already booked: {clash}")
        placement = [p.model_dump(mode="json") for p in action.placement]
        if not resumed:
            job = await self.move(job["id"], S.SCHEDULED, did, reason=action.reason, placement=placement,
                                   attempt=job["attempt"] + 1, resume_from=action.resume_from or job["resume_from"])
        await msg.in_progress()
        result = await self.start_trainers(job, action.placement, f"{did}:start", did, rule=decision.rule)
        node = action.placement[0].node
        try:
            if result.ok:
                await self.move(job["id"], S.STARTING, did, reason=f"trainer process {result.pid} on {node}",
                                 job_dir=result.job_dir)
            else:
                await self.move(job["id"], S.PENDING, did, reason=f"start on {node} failed: {result.message}",
                                 placement=None)
        except InvalidTransition as err:  # e.g. the trainer already finished and was recorded
            log.info("start of %s: %s", job["id"], err)
        async with self.pool.acquire() as conn:
            await job_store.finish_decision(conn, did, "done" if result.ok else "failed", result.message or "")

    async def _cancel_decision(self, decision: Decision, msg: Msg) -> None:
        action: Cancel = decision.action  # type: ignore[assignment]
        await self._cancel(action.job_id, decision.decision_id)
        async with self.pool.acquire() as conn:
            await job_store.finish_decision(conn, decision.decision_id, "done", "cancelled")

    async def start_trainers(self, job: asyncpg.Record, placement, command_id: str, decision_id: str | None,
                             env: dict[str, str] | None = None, rule: str | None = None) -> CommandResult:
        """Start the trainers (see `_start_on_nodes`) and audit the outcome as `command.start`."""
        result = await self._start_on_nodes(job, placement, command_id, decision_id, env)
        await self.audit(f"{command_id}:command.start", "command.start", job_id=job["id"], node=placement[0].node,
                         decision_id=decision_id, action="start", rule=rule,
                         reason=("worker started the trainer" if result.ok else f"start failed: {result.error}: {result.message}"),
                         data={"ok": result.ok, "pid": result.pid, "attempt": job["attempt"],
                               "placement": [p.model_dump(mode="json") for p in placement],
                               "resume_from": job["resume_from"], "error": result.error})
        return result

    async def _start_on_nodes(self, job: asyncpg.Record, placement, command_id: str, decision_id: str | None,
                              env: dict[str, str] | None) -> CommandResult:
        """Start the job's trainer on every node of its placement, as one job.

        A multi-node job meets at rank 0's node: the executor names the address and port, and
        each worker starts its share of the ranks. If one node fails, the others are stopped.
        """
        env = dict(job["env"] or {}) | dict(env or {})  # what a tune gave the job stays with it
        if len(placement) > 1:
            first = placement[0].node
            address = await self.pool.fetchval("SELECT address FROM nodes WHERE id = $1", first) or "127.0.0.1"
            digest = int(hashlib.sha1(f"{job['id']}:{job['attempt']}".encode()).hexdigest(), 16)
            env |= {"ADC_MASTER_ADDR": address, "ADC_MASTER_PORT": str(20000 + digest % 20000)}
        base = Command(command_id=command_id, decision_id=decision_id, kind="start", job_id=job["id"],
                       attempt=job["attempt"], train=job["spec"]["train"], placement=list(placement),
                       resume_from=job["resume_from"], env=env)
        results = await asyncio.gather(*(self.send(p.node, base.model_copy(update={"command_id": f"{command_id}:{p.node}"}))
                                         for p in placement))
        failed = [(p.node, r) for p, r in zip(placement, results) if not r.ok]
        if failed and len(placement) > 1:
            for p, r in zip(placement, results):
                if r.ok:
                    await self.send(p.node, Command(command_id=f"{command_id}:{p.node}:undo", kind="cancel",
                                                    job_id=job["id"], attempt=job["attempt"]), attempts=1)
        if failed:
            node, r = failed[0]
            return r.model_copy(update={"message": f"{node}: {r.message}"})
        return results[0]

    async def stop_trainers(self, job: asyncpg.Record, command_id: str, decision_id: str | None) -> CommandResult:
        """Checkpoint-stop on every node of the job; rank 0's node reports the checkpoint."""
        parts = job["placement"] or []
        results = await asyncio.gather(*(
            self.send(p["node"], Command(command_id=f"{command_id}:{p['node']}", decision_id=decision_id, kind="stop",
                                         job_id=job["id"], attempt=job["attempt"]),
                      attempts=2, timeout=self.config.controller.timeout)
            for p in parts))
        first = results[0]
        if not all(r.ok for r in results):
            bad = next(r for r in results if not r.ok)
            return first.model_copy(update={"ok": False, "error": bad.error, "message": bad.message})
        return first

    async def send(self, node: str, command: Command, attempts: int = 3, timeout: float | None = None) -> CommandResult:
        """Request/reply with bounded retries; the command id makes a repeat harmless on the worker."""
        timeout = timeout or self.config.worker.command_timeout
        error = "no answer"
        for attempt in range(attempts):
            try:
                reply = await self.bus.request(self.bus.subjects.command(node), command, timeout)  # obs (issue 14): traced
                return CommandResult.decode(reply.data)
            except NoRespondersError:
                error = f"no worker is listening on node {node}"
            except NatsTimeout:
                error = f"node {node} did not answer within {timeout:.0f}s"
            await asyncio.sleep(min(0.5 * 2**attempt, 5))
        return CommandResult(command_id=command.command_id, ok=False, error="unreachable", message=error)

    # --- job events ------------------------------------------------------------------

    async def _on_job_event(self, msg: Msg) -> None:
        try:
            event = JobEvent.decode(msg.data)
        except ValueError as err:
            log.error("undecodable job event dropped: %s", err)
            await msg.term()
            return
        async with self._job_locks[event.job_id]:
            await self._apply(event)
        await msg.ack()

    async def _apply(self, event: JobEvent) -> None:
        job = await self.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", event.job_id)
        if job is None:
            return
        if event.kind == "cancel_requested":
            return await self._cancel(job["id"], None)
        if event.kind == "submitted" or event.attempt != job["attempt"]:
            return  # a stale attempt's event, or nothing to do
        status = JobStatus(job["status"])
        d = event.data
        try:
            if event.kind == "started":
                if status == S.STARTING:
                    await self.move(job["id"], S.RUNNING, reason=f"training on {event.node}",
                                     started_at=job["started_at"] or utc(event.ts))
            elif event.kind == "progress":
                if status == S.STARTING:
                    await self.move(job["id"], S.RUNNING, reason=f"training on {event.node}",
                                     started_at=job["started_at"] or utc(event.ts))
                await self.pool.execute("UPDATE jobs SET progress = $2, updated_at = now() WHERE id = $1 AND attempt = $3",
                                        job["id"], _progress(d), event.attempt)
            elif event.kind == "checkpointed":
                await self.pool.execute(
                    "UPDATE jobs SET last_checkpoint = $2, last_checkpoint_step = $3, updated_at = now() WHERE id = $1",
                    job["id"], d.get("path"), d.get("step"))
            elif event.kind == "exited":
                await self._exited(job, event)
        except InvalidTransition as err:
            log.warning("job event %s for %s ignored: %s", event.kind, job["id"], err)

    async def _exited(self, job: asyncpg.Record, event: JobEvent) -> None:
        d = event.data
        if d.get("node_rank", 0) != 0:
            return  # rank 0's node reports how a multi-node job ended
        outcome = d.get("outcome", "failed")
        if job["cancel_requested"] and outcome != "succeeded":
            outcome = "cancelled"
        last = d.get("last_event") or {}
        if outcome == "stopped":
            if JobStatus(job["status"]) not in (S.RUNNING, S.STARTING):
                return  # a protocol asked for this stop and carries on from it
            # A stop no protocol asked for (its worker shut down): back to the queue, resuming from it.
            await self.move(job["id"], S.PENDING, reason=f"trainer stopped after checkpoint at step {d.get('step')}",
                             placement=None, resume_from=d.get("checkpoint"), last_checkpoint=d.get("checkpoint"),
                             last_checkpoint_step=d.get("step"), exit_code=d.get("exit_code"))
            return
        new = _EXIT_STATUS.get(outcome, S.FAILED)
        reason = {
            "succeeded": f"training finished at step {last.get('step')}",
            "cancelled": "cancelled on request",
            "oom": f"out of memory: {d.get('error', '')}"[:2000],
        }.get(outcome, f"trainer {outcome} (exit code {d.get('exit_code')}): {d.get('error', '')}"[:2000])
        progress = (job["progress"] or {}) | (_progress(last) if outcome == "succeeded" else {})
        await self.move(job["id"], new, reason=reason, exit_code=d.get("exit_code"), finished_at=utc(event.ts),
                         progress=progress, audit_data={"outcome": outcome, "output_dir": d.get("output_dir"),
                                                        "exit_code": d.get("exit_code")})

    async def _cancel(self, job_id: str, decision_id: str | None) -> None:
        job = await self.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
        status = JobStatus(job["status"])
        if status.terminal:
            return
        if status in (S.PENDING, S.PREEMPTED, S.PAUSED):
            await self.move(job_id, S.CANCELLED, decision_id, reason="cancelled before it started",
                             finished_at=utc(self.clock.now()))
            return
        for part in job["placement"] or []:
            cmd = Command(command_id=f"{job_id}:{job['attempt']}:cancel", decision_id=decision_id, kind="cancel",
                          job_id=job_id, attempt=job["attempt"])
            result = await self.send(part["node"], cmd)
            await self.audit(f"{job_id}:{job['attempt']}:command.cancel:{part['node']}", "command.cancel", job_id=job_id,
                             node=part["node"], decision_id=decision_id, action="cancel",
                             reason="trainer stopped" if result.ok else f"cancel failed: {result.message}",
                             data={"ok": result.ok})
        if status == S.SCHEDULED:  # never reached a trainer: nothing will report an exit
            await self.move(job_id, S.CANCELLED, decision_id, reason="cancelled before it started",
                             finished_at=utc(self.clock.now()))

    # --- nodes -----------------------------------------------------------------------

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = Heartbeat.decode(msg.data)
        except ValueError:
            return
        self.nodes.last_beat[beat.node] = beat
        now = self.clock.now()
        if now - self._node_written.get(beat.node, 0) < min(5.0, self.config.worker.node_timeout / 3):
            return
        self._node_written[beat.node] = now
        try:
            await self.nodes.record(beat)
        except Exception as err:  # the next heartbeat tries again
            self._node_written.pop(beat.node, None)
            log.warning("heartbeat of %s not recorded: %s", beat.node, err)


def _progress(d: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "max_steps", "epoch", "loss", "learning_rate", "tokens_per_s", "samples_per_s",
            "step_time_s", "peak_memory_bytes", "ts")
    return {k: d[k] for k in keys if k in d}
