"""A job's own life: start, cancel and fail decisions, a paused job resumed, and what its trainer reports.

The events of an attempt that is no longer current are ignored. How an attempt ended is the
worker's `ExitOutcome`; shared/contracts/outcomes.py maps it to the job's transition. An out-of-memory
exit is requeued to resume from the newest complete checkpoint the worker reported, its outcome and
count recorded; whether it is retried (on more memory, with a smaller micro-batch) or failed is the
decider's `oom_retry` rule's decision, never this module's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from services.executor.audit import Auditor, Mover
from services.executor.ledger import DecisionState, Ledger
from services.executor.store import Job, JobStore, TransitionConflict
from services.executor.transport import WorkerTransport
from shared.contracts.actions import Start
from shared.contracts.job_status import InvalidTransition, JobStatus
from shared.contracts.messages import CommandError, CommandResult, Decision, JobEvent
from shared.contracts.outcomes import JOB_TRANSITION, ExitOutcome
from shared.infra.clock import Clock, utc
from shared.infra.rejections import refused_not_placed

log = logging.getLogger(__name__)
S = JobStatus


@dataclass(frozen=True)
class Launched:
    """A Start decision redelivered after it launched its job's current attempt (the reason recorded
    with that launch): nothing is started again."""

    job: Job
    reason: str


_PROGRESS_KEYS = (
    "step",
    "max_steps",
    "epoch",
    "loss",
    "learning_rate",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "peak_memory_bytes",
    "ts",
)


def progress_of(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in _PROGRESS_KEYS if k in d}


def evaluation_of(d: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """An `evaluated` event's split and {step, metric: number, ...}, or None if it is not one (the
    event crossed from a trainer process: only bounded, finite numbers are kept)."""
    split, metrics = d.get("split", "eval"), d.get("metrics")
    if split not in ("eval", "predict") or not isinstance(metrics, dict):
        return None
    kept = {
        str(k)[:100]: float(v)
        for k, v in list(metrics.items())[:64]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    step = d.get("step")
    return split, {"step": step if isinstance(step, int) and not isinstance(step, bool) else None, **kept}


def incomplete_placement(placement) -> str | None:
    """Why a placement cannot be carried out as it is; the executor never fills one in."""
    if not placement:
        return "names no devices"
    if empty := [p.node for p in placement if not p.gpus]:
        return f"names no devices on {', '.join(empty)}"
    if len({p.node for p in placement}) != len(placement):
        return "names a node twice"
    return None


def checkpoint_refusal(job: Job, event: JobEvent) -> str | None:
    """Why a reported checkpoint is not recorded: the attempt fences it, and it must be in the job's own
    output folder (`.../jobs/<id>/output/checkpoint-N`), whatever a trainer writes in its event."""
    if event.attempt != job.attempt:
        return (
            f"checkpoint of attempt {event.attempt} refused: the job is at attempt {job.attempt} "
            "(a superseded attempt may not publish)"
        )
    path = event.data.get("path")
    if not isinstance(path, str) or not path:
        return None
    p = PurePosixPath(path)
    if (
        ".." in p.parts
        or not p.name.startswith("checkpoint-")
        or p.parent.name != "output"
        or p.parent.parent.name != job.id
    ):
        return f"checkpoint {path[:200]!r} is not in job {job.id}'s own output folder"
    return None


class Lifecycle:
    def __init__(
        self,
        store: JobStore,
        move: Mover,
        transport: WorkerTransport,
        audit: Auditor,
        ledger: Ledger,
        clock: Clock,
    ) -> None:
        self.store = store
        self.move = move
        self.transport = transport
        self.audit = audit
        self.ledger = ledger
        self.clock = clock

    async def refuse(self, decision: Decision, why: str) -> None:
        a = decision.action
        await self.audit(
            f"{decision.decision_id}:refused",
            "decision.refused",
            job_id=a.job_id,
            decision_id=decision.decision_id,
            rule=decision.rule,
            action=a.action,
            reason=why,
        )
        await self.ledger.finish(decision.decision_id, DecisionState.REFUSED, why)
        log.info("decision %s refused: %s", decision.decision_id, why)

    # --- decisions -------------------------------------------------------------------

    async def start(self, decision: Decision) -> None:
        """A Start decision recorded before: its job scheduled in a transaction of its own, then started."""
        async with self.store.pool.acquire() as conn, conn.transaction():
            scheduled = await self._schedule(decision, conn)
        await self._launch(decision, scheduled)

    async def record_and_start(self, decision: Decision) -> DecisionState:
        """A Start decision as it arrives: recorded, checked and its job scheduled in one transaction, so
        the decision and the job's new state are durable together, in one commit, before the command
        leaves (a crashed executor's redelivery finds both or neither); then its trainers are started.
        Its recorded state (StaleDecision once a stale one is recorded refused)."""
        async with self.ledger.recording(decision) as (state, conn):
            if state != DecisionState.RECEIVED:
                return state
            scheduled = await self._schedule(decision, conn)
        await self._launch(decision, scheduled)
        return state

    async def _schedule(self, decision: Decision, conn) -> Job | Launched | str:
        """Inside the caller's transaction: the job scheduled by this decision (moved now, or by an
        executor that died before auditing it), the job it launched already (Launched), or why the
        decision is refused."""
        action: Start = decision.action  # type: ignore[assignment]
        did = decision.decision_id
        job = await self.store.get(action.job_id, conn)
        if job is None:
            return "no such job"
        if job.status == S.SCHEDULED and await self.store.scheduled_by(job.id, did, conn):
            return job  # an executor died between the move and its audit: audited again, under the same id
        if job.status != S.PENDING:
            if (reason := await self.store.launched_by(job.id, did, conn)) is not None:
                return Launched(job, reason)  # its trainers started, then auditing or finishing it failed
            return f"job is {job.status}, not pending"
        if job.cancel_requested:
            return "job has a cancel request"
        if problem := incomplete_placement(action.placement):
            return f"placement {problem}"
        booked = await self.store.booked_devices(exclude_job=job.id, conn=conn)
        if clash := {
            f"{p.node}/{g}": booked[(p.node, g)] for p in action.placement for g in p.gpus if (p.node, g) in booked
        }:
            return f"devices already booked: {clash}"
        return await self.move.within(
            conn,
            job,
            "schedule",
            decision_id=did,
            reason=action.reason,
            placement=action.placement,
            resume_from=action.resume_from or job.resume_from,
            train_overrides=job.train_overrides | action.train_overrides,
        )

    async def _launch(self, decision: Decision, scheduled: Job | str) -> None:
        """After the schedule committed: the command, then the move's audit event, and what follows."""
        if isinstance(scheduled, str):
            return await self.refuse(decision, scheduled)
        did = decision.decision_id
        if isinstance(scheduled, Launched):  # the move to starting audited again, under the same id
            await self.audit.transition(scheduled.job, did, to=S.STARTING, reason=scheduled.reason)
            return await self.ledger.finish(did, DecisionState.DONE, "")
        job = scheduled
        result = await self.start_trainers(job, f"{did}:start", did, rule=decision.rule, audit_move=True)
        try:
            job = await self.store.get(job.id)
            if result.ok:
                await self.move(
                    job,
                    "launched",
                    decision_id=did,
                    job_dir=result.job_dir,
                    reason=f"trainer process {result.pid} on {job.nodes[0]}",
                )
            elif result.error == CommandError.REFUSED:  # the spec itself: another try would be refused too
                await self.move(
                    job,
                    "fail",
                    decision_id=did,
                    finished_at=self.clock.now(),
                    reason=f"the worker refused to start it: {result.message}"[:2000],
                )
            else:
                await self.move(job, "requeue", decision_id=did, reason=f"start failed: {result.message}")
        except (InvalidTransition, TransitionConflict) as err:  # e.g. the trainer already finished
            log.info("start of %s: %s", job.id, err)
        await self.ledger.finish(did, DecisionState.DONE if result.ok else DecisionState.FAILED, result.message or "")

    async def start_trainers(
        self, job: Job, command_id: str, decision_id: str | None, rule: str | None = None, audit_move: bool = False
    ) -> CommandResult:
        """Start the job's trainers on its placement and audit the outcome as `command.start`. With
        `audit_move`, the job's move to where it is now (committed before the command) is audited once
        the command is out and before `command.start`, so the command does not wait for that event's
        ack and the job's events keep their order; should its publish fail, the decision fails and its
        redelivery audits the move again, under the same id, and repeats the start (acked as done)."""
        result = await self.transport.start(job, job.placement, command_id, decision_id)
        if audit_move:
            await self.audit.transition(job, decision_id)
        await self.audit(
            f"{command_id}:command.start",
            "command.start",
            job_id=job.id,
            node=job.nodes[0],
            decision_id=decision_id,
            action="start",
            rule=rule,
            reason=("worker started the trainer" if result.ok else f"start failed: {result.error}: {result.message}"),
            data={
                "ok": result.ok,
                "pid": result.pid,
                "backend_job": result.backend_job,
                "attempt": job.attempt,
                "placement": job.placement_json(),
                "resume_from": job.resume_from,
                "train_overrides": job.train_overrides,
                "error": result.error,
            },
        )
        return result

    async def cancel_decision(self, decision: Decision) -> None:
        await self.cancel(decision.action.job_id, decision.decision_id, decision.action.reason)
        await self.ledger.finish(decision.decision_id, DecisionState.DONE, "cancelled")

    async def fail_decision(self, decision: Decision) -> None:
        """A waiting job given up by the decider (out of memory past its retries): it ends failed."""
        did = decision.decision_id
        job = await self.store.get(decision.action.job_id)
        if job is not None and job.status == S.FAILED and await self.store.moved_by(job.id, did, S.FAILED):
            await self.audit.transition(job, did)  # an executor died before finishing it: audited again, same id
        elif job is None or job.status != S.PENDING:
            return await self.refuse(decision, f"job is {job.status if job else 'missing'}, not pending")
        else:
            await self.move(job, "fail", decision_id=did, finished_at=self.clock.now(), reason=decision.action.reason)
        await self.ledger.finish(did, DecisionState.DONE, "failed")

    async def resume(self, decision: Decision) -> None:
        job = await self.store.get(decision.action.job_id)
        if job is None or job.status != S.PAUSED:
            return await self.refuse(decision, f"job is {job.status if job else 'missing'}, not paused")
        where = job.resume_from or "the start"
        await self.move(
            job,
            "requeue",
            decision_id=decision.decision_id,
            reason=f"resumed by {decision.actor or decision.rule}; queued to continue from {where}",
        )
        await self.ledger.finish(decision.decision_id, DecisionState.DONE, "queued")

    async def cancel(self, job_id: str, decision_id: str | None, reason: str | None = None) -> None:
        job = await self.store.get(job_id)
        if job is None or job.status.terminal:
            return
        if job.status in (S.PENDING, S.PREEMPTED, S.PAUSED):
            await self.move(
                job,
                "cancel",
                decision_id=decision_id,
                reason=f"cancelled before it started: {reason}" if reason else "cancelled before it started",
                finished_at=self.clock.now(),
            )
            return
        for node in job.nodes:
            result = await self.transport.cancel(job, node, f"{job_id}:{job.attempt}:cancel", decision_id)
            await self.audit(
                f"{job_id}:{job.attempt}:command.cancel:{node}",
                "command.cancel",
                job_id=job_id,
                node=node,
                decision_id=decision_id,
                action="cancel",
                reason="trainer stopped" if result.ok else f"cancel failed: {result.message}",
                data={"ok": result.ok},
            )
        if job.status == S.SCHEDULED:  # never reached a trainer: nothing will report an exit
            await self.move(
                job,
                "cancel",
                decision_id=decision_id,
                reason="cancelled before it started",
                finished_at=self.clock.now(),
            )

    # --- job events ------------------------------------------------------------------

    async def on_event(self, event: JobEvent) -> None:
        if event.kind == "cancel_requested":
            if await self.store.request_cancel(event.job_id):
                await self.cancel(event.job_id, None)
            return
        job = await self.store.get(event.job_id)
        if (
            job is not None
            and event.kind != "submitted"
            and event.attempt == job.attempt
            and event.node not in job.nodes
        ):
            return await self.foreign(job, event)
        if job is not None and event.kind == "checkpointed" and (why := checkpoint_refusal(job, event)):
            await self.audit(
                f"{event.job_id}:{event.attempt}:checkpoint.refused:{event.data.get('step')}",
                "checkpoint.refused",
                job_id=job.id,
                node=event.node,
                reason=why,
                data={
                    "attempt": event.attempt,
                    "current_attempt": job.attempt,
                    "path": str(event.data.get("path"))[:500],
                    "step": event.data.get("step"),
                },
            )
            return
        if job is None or event.kind == "submitted" or event.attempt != job.attempt:
            return  # a stale attempt's event, or nothing to do
        if job.status.terminal:  # its record is final: a late or repeated trainer event changes nothing
            log.info("job %s is %s: %s event of attempt %d ignored", job.id, job.status, event.kind, event.attempt)
            return
        d = event.data
        try:
            if event.kind in ("started", "progress") and job.status == S.STARTING:
                job = await self.move(
                    job, "started", reason=f"training on {event.node}", started_at=job.started_at or utc(event.ts)
                )
            if event.kind == "progress":
                await self.store.record_progress(job, event.attempt, progress_of(d))
            elif event.kind == "evaluated" and (evaluation := evaluation_of(d)):
                await self.store.record_evaluation(job, event.attempt, *evaluation)
            elif event.kind == "checkpointed" and d.get("path"):
                await self.store.record_checkpoint(job, event.attempt, d["path"], d.get("step"))
            elif event.kind == "exited":
                await self.exited(job, event)
        except (InvalidTransition, TransitionConflict) as err:
            log.warning("job event %s for %s ignored: %s", event.kind, job.id, err)

    async def foreign(self, job: Job, event: JobEvent) -> None:
        """A trainer event of the current attempt from a node it does not run on (published by that node,
        senders.py): ignored, counted and audited, once per node, attempt and kind (the audit id repeats)."""
        refused_not_placed()
        log.warning(
            "job %s: %s event from %s ignored, attempt %d is placed on %s",
            job.id,
            event.kind,
            event.node,
            job.attempt,
            job.nodes,
        )
        await self.audit(
            f"{job.id}:{job.attempt}:{event.node}:{event.kind}:event.ignored",
            "event.ignored",
            job_id=job.id,
            node=event.node,
            action=event.kind,
            reason=f"ignored the {event.kind!r} event from node {event.node}: attempt {job.attempt} runs"
            f" on {', '.join(job.nodes) or 'no node'}",
            data={"attempt": job.attempt, "placement": job.nodes},
        )

    async def exited(self, job: Job, event: JobEvent) -> None:
        d = event.data
        if d.get("node_rank", 0) != 0:
            return  # rank 0's node reports how a multi-node job ended
        if job.status in (S.PENDING, S.PAUSED, S.PREEMPTED):
            return  # taken off its node already (a lost node that came back): this trainer was stale
        outcome = ExitOutcome(d.get("outcome", ExitOutcome.FAILED))
        if job.cancel_requested and outcome != ExitOutcome.SUCCEEDED:
            outcome = ExitOutcome.CANCELLED
        if outcome == ExitOutcome.STOPPED and job.status not in (S.RUNNING, S.STARTING):
            return  # a protocol asked for this stop and carries on from it
        last = d.get("last_event") or {}
        # The worker names the newest complete checkpoint of the job's folder; else the last one it reported.
        checkpoint = d.get("checkpoint") or job.last_checkpoint
        step = d.get("checkpoint_step") if d.get("checkpoint") else job.last_checkpoint_step
        common = dict(
            exit_code=d.get("exit_code"),
            last_outcome=outcome,
            audit_data={
                "outcome": outcome.value,
                "node": event.node,
                "output_dir": d.get("output_dir"),
                "exit_code": d.get("exit_code"),
                "checkpoint": checkpoint,
                "checkpoint_step": step,
            },
        )
        name = JOB_TRANSITION[outcome]
        if outcome == ExitOutcome.OOM:  # back to the queue as a typed outcome: the decider retries or fails it
            peak = (job.progress or {}).get("peak_memory_bytes")
            return await self.move(
                job,
                name,
                resume_from=checkpoint,
                last_checkpoint=checkpoint,
                last_checkpoint_step=step,
                oom_retries=job.oom_retries + 1,
                **common,
                reason=f"out of memory at step {(job.progress or {}).get('step', 0)}"
                + (f" (peak {peak / 2**30:.2f} GiB)" if peak else "")
                + f": {d.get('error', '')}"[:500]
                + f"; requeued to resume from {checkpoint or 'the start'} (out-of-memory exit {job.oom_retries + 1})",
            )
        if outcome == ExitOutcome.STOPPED:  # a stop no protocol asked for (its worker shut down)
            return await self.move(
                job,
                name,
                resume_from=d.get("checkpoint"),
                last_checkpoint=d.get("checkpoint"),
                last_checkpoint_step=d.get("step"),
                **common,
                reason=f"trainer stopped after checkpoint at step {d.get('step')}",
            )
        reason = {
            ExitOutcome.SUCCEEDED: f"training finished at step {last.get('step')}",
            ExitOutcome.CANCELLED: "cancelled on request",
        }.get(outcome, f"trainer {outcome} (exit code {d.get('exit_code')}): {d.get('error', '')}"[:2000])
        progress = job.progress | (progress_of(last) if outcome == ExitOutcome.SUCCEEDED else {})
        await self.move(job, name, reason=reason, finished_at=utc(event.ts), progress=progress, **common)
