"""Protocols that change a running job: checkpoint-stop first, then hold it or start it elsewhere.

Every protocol is recorded in `protocols` with its current step (shared/contracts/protocol_steps.py) before
that step acts, so an executor killed at any point resumes it where it was and nothing is done
twice:

  preparing       a migrate or scale onto devices the source does not hold: the target's trainer
                  is made ready to load the checkpoint first (warm_moves.py); not ready: the move
                  ends, rolled back, before the source was asked anything.
  stopping        running -> checkpointing; the worker checkpoints at the next step boundary
                  and exits (a warm target waits meanwhile); on failure the trainer is killed and the newest complete checkpoint
                  the worker reports (else the last one it reported before) is used (escalation).
  hold            preempt: -> preempted -> pending (requeued, resume_from set)
                  pause:   -> paused (until resumed)
  placing         migrate/tune: -> migrating; scale: -> resizing; new attempt, new placement
  starting_target a warm target is told to go from the checkpoint, else the target is started with
                  resume_from (also when the go fails); ok -> starting.
  rollback        the target failed: what the decision's `on_target_failure` says (the deciding
                  rule's policy, docs/executor.md): restart_source restarts on the source if its
                  devices are still free, otherwise requeues; requeue requeues.
"""

from __future__ import annotations

import logging
from typing import Any

from services.executor.audit import Auditor, Mover
from services.executor.ledger import DecisionState, Ledger
from services.executor.lifecycle import Lifecycle, incomplete_placement
from services.executor.node_store import NodeStore
from services.executor.protocol_store import Protocol, ProtocolStore
from services.executor.store import Job, JobStore
from services.executor.transport import WorkerTransport
from services.executor.warm_moves import WarmTarget, can_prepare
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import Decision
from shared.contracts.outcomes import ExitOutcome
from shared.contracts.protocol_steps import OnTargetFailure, ProtocolKind, ProtocolState, Step
from shared.infra import tracing

log = logging.getLogger(__name__)
S = JobStatus
K = ProtocolKind
MOVES = {K.MIGRATE: "migrate", K.TUNE: "migrate", K.SCALE: "resize"}
KINDS = {k.value for k in ProtocolKind}


class ProtocolRunner:
    def __init__(
        self,
        store: JobStore,
        protocols: ProtocolStore,
        nodes: NodeStore,
        move: Mover,
        transport: WorkerTransport,
        lifecycle: Lifecycle,
        audit: Auditor,
        ledger: Ledger,
        node_timeout: float,
        warm_moves: bool = True,
    ) -> None:
        self.store = store
        self.protocols = protocols
        self.nodes = nodes
        self.move = move
        self.transport = transport
        self.lifecycle = lifecycle
        self.audit_event = audit
        self.ledger = ledger
        self.node_timeout = node_timeout
        self.warm = WarmTarget(transport)
        self.warm_moves = warm_moves

    async def _audit(self, proto: Protocol, suffix: str, kind: str, reason: str, **data: Any) -> None:
        await self.audit_event(
            f"{proto.id}:{suffix}",
            kind,
            job_id=proto.job_id,
            decision_id=proto.id,
            action=proto.kind.value,
            reason=reason,
            data=data,
        )

    # --- entry -----------------------------------------------------------------------

    async def begin(self, decision: Decision, progress=None) -> None:
        """Check the decision against the job and record the protocol, then run it."""
        a = decision.action
        kind = ProtocolKind(a.action)
        job = await self.store.get(a.job_id)
        if job is None:
            return await self.lifecycle.refuse(decision, "no such job")
        existing = await self.protocols.get(decision.decision_id)
        if existing is not None:  # a redelivered decision: resume or acknowledge, never redo
            if existing.state == ProtocolState.RUNNING:
                return await self.run(existing, progress)
            return await self.ledger.finish(
                decision.decision_id, DecisionState.DONE, f"protocol already {existing.state}"
            )
        if job.status != S.RUNNING:
            return await self.lifecycle.refuse(decision, f"job is {job.status}; only a running job can be {kind}d")
        target: tuple[NodeGpus, ...] | None = None
        if kind in (K.MIGRATE, K.SCALE):
            wanted = tuple(a.placement)
            if problem := incomplete_placement(wanted):  # choosing it is the decider's (its drain rule)
                return await self.lifecycle.refuse(decision, f"placement {problem}")
            if problem := await self._unavailable(job, wanted):
                return await self.lifecycle.refuse(decision, problem)
            target = wanted
        elif kind == K.TUNE:
            target = job.placement
        detail = {
            "env": getattr(a, "env", {}),
            "train_overrides": getattr(a, "train_overrides", {}),
            "actor": decision.actor,
            "rule": decision.rule,
            "on_target_failure": decision.on_target_failure or OnTargetFailure.RESTART_SOURCE,
        }
        first = Step.PREPARING if self.warm_moves and can_prepare(job, target) else Step.STOPPING
        detail["decided_at"] = self.clock_now()
        state, proto = await self.protocols.begin(
            decision.decision_id, job.id, kind, job.placement, target, detail, first
        )
        if state == "busy":
            return await self.lifecycle.refuse(decision, f"job is mid-{proto.kind} (protocol {proto.id})")
        await self._audit(
            proto,
            "protocol.started",
            "protocol.started",
            f"{kind} of job {job.id} started" + (f" by {decision.actor}" if decision.actor else ""),
            source=job.placement_json(),
            target=_json(target),
        )
        await self.run(proto, progress)

    async def _free(self, job: Job) -> dict[str, list[int]]:
        live = await self.nodes.live_ready(self.node_timeout)
        booked = await self.store.booked_devices(exclude_job=job.id)
        return {n: [g for g in devices if (n, g) not in booked] for n, devices in live.items()}

    async def _unavailable(self, job: Job, target: tuple[NodeGpus, ...]) -> str | None:
        free = await self._free(job)
        for part in target:
            if part.node not in free:
                return f"node {part.node} is not a live, ready node"
            if busy := [g for g in part.gpus if g not in free[part.node]]:
                return f"devices {busy} of node {part.node} are not free"
        return None

    # --- the steps -------------------------------------------------------------------

    async def run(self, proto: Protocol, progress=None) -> None:
        """Carry the protocol on from its recorded step until it ends."""
        steps = {
            Step.PREPARING: self._preparing,
            Step.STOPPING: self._stopping,
            Step.HOLD: self._hold,
            Step.PLACING: self._placing,
            Step.STARTING_TARGET: self._starting_target,
            Step.ROLLBACK: self._rollback,
        }
        while proto.state == ProtocolState.RUNNING:
            if progress is not None:
                await progress()
            with tracing.span("executor", f"{proto.kind} {proto.step}", job_id=proto.job_id, protocol=proto.id):
                proto = await steps[proto.step](proto)
        await self.ledger.finish(
            proto.id,
            DecisionState.DONE if proto.state == ProtocolState.DONE else DecisionState.FAILED,
            proto.error or proto.state.value,
        )
        await self._audit(
            proto,
            f"protocol.{proto.state}",
            f"protocol.{proto.state}",
            f"{proto.kind} {proto.state.replace('_', ' ')}" + (f": {proto.error}" if proto.error else ""),
            checkpoint=proto.checkpoint,
            step=proto.ckpt_step,
            target=_json(proto.target),
        )

    def clock_now(self) -> float:
        return self.lifecycle.clock.now()

    async def _preparing(self, proto: Protocol) -> Protocol:
        """The target's trainer made ready (warm) while the source trains on; not ready: the move ends here."""
        job = await self.store.get(proto.job_id)
        if job.status != S.RUNNING:
            return await self.protocols.end(proto, ProtocolState.FAILED, f"job became {job.status} before it moved")
        attempt = job.attempt + 1  # the attempt `placing` will give the job
        began = self.clock_now()
        result = await self.warm.prepare(
            job, proto.target, attempt, job.env | (proto.detail.get("env") or {}), proto.id
        )
        prepare_s = round(self.clock_now() - began, 3)
        if not result.ok:
            await self.warm.drop(job, proto.target, attempt, proto.id)
            why = f"the target's trainer did not get ready ({result.error}: {result.message})"[:1500]
            await self._audit(
                proto,
                "protocol.prepare_failed",
                "protocol.prepare_failed",
                f"{why}; {proto.kind} given up before the source was stopped: it trains on",
                attempt=attempt,
                prepare_s=prepare_s,
                target=_json(proto.target),
            )
            return await self.protocols.end(proto, ProtocolState.ROLLED_BACK, f"{why}; the source trains on")
        await self._audit(
            proto,
            "protocol.prepared",
            "protocol.prepared",
            f"the target's trainer is ready to load the checkpoint after {prepare_s:.2f}s; stopping the source",
            attempt=attempt,
            prepare_s=prepare_s,
            target=_json(proto.target),
        )
        return await self.protocols.advance(
            proto, Step.STOPPING, detail=proto.detail | {"warm_attempt": attempt, "prepare_s": prepare_s}
        )

    @staticmethod
    def _warm_attempt(proto: Protocol) -> int | None:
        return None if proto.detail.get("rolled_back") else proto.detail.get("warm_attempt")

    async def _drop_warm(self, proto: Protocol, job: Job) -> None:
        if (attempt := self._warm_attempt(proto)) is not None and proto.target:
            await self.warm.drop(job, proto.target, attempt, proto.id)

    async def _go(self, proto: Protocol, job: Job):
        """The warm target resumes from the stop checkpoint; a failed go is dropped, for a cold start."""
        began = self.clock_now()
        result = await self.warm.go(job, proto.id)
        now = self.clock_now()
        stopped_at = proto.detail.get("stopped_at")
        await self._audit(
            proto,
            "protocol.resumed",
            "protocol.resumed",
            f"the target's trainer resumes from {job.resume_from or 'the start'}"
            + (f", {now - stopped_at:.2f}s after the source stopped" if stopped_at else "")
            if result.ok
            else f"the prepared target did not take the go ({result.error}: {result.message}); starting it cold",
            ok=result.ok,
            warm=True,
            attempt=job.attempt,
            go_s=round(now - began, 3),
            since_stopped_s=round(now - stopped_at, 3) if stopped_at else None,
            since_decision_s=round(now - proto.detail["decided_at"], 3) if proto.detail.get("decided_at") else None,
            prepare_s=proto.detail.get("prepare_s"),
        )
        if not result.ok:
            await self.warm.drop(job, proto.target, job.attempt, proto.id)
        return result

    async def _stopping(self, proto: Protocol) -> Protocol:
        job = await self.store.get(proto.job_id)
        if job.status == S.RUNNING:
            job = await self.move(
                job, "begin_checkpoint", decision_id=proto.id, reason=f"checkpoint-stop for {proto.kind}"
            )
        elif job.status != S.CHECKPOINTING:  # ended meanwhile (finished, cancelled, node lost)
            await self._drop_warm(proto, job)
            return await self.protocols.end(proto, ProtocolState.FAILED, f"job became {job.status} before it stopped")
        asked = self.clock_now()
        result = await self.transport.stop(job, f"{proto.id}:stop", proto.id)
        stop_s = round(self.clock_now() - asked, 3)
        await self.audit_event(
            f"{proto.id}:command.stop",
            "command.stop",
            job_id=job.id,
            node=job.nodes[0],
            decision_id=proto.id,
            action="stop",
            reason=(
                f"trainer checkpointed at step {result.step} and stopped ({stop_s:.2f}s)"
                if result.ok
                else f"checkpoint-stop failed: {result.error}: {result.message}"
            ),
            data={
                "ok": result.ok,
                "checkpoint": result.checkpoint,
                "step": result.step,
                "outcome": result.outcome,
                "stop_s": stop_s,
            },
        )
        if result.outcome == "succeeded":  # it finished first: its exit event completes the job
            await self._drop_warm(proto, job)
            return await self.protocols.end(proto, ProtocolState.FAILED, "the job finished before it could be stopped")
        checkpoint, step = result.checkpoint, result.step
        if not (result.ok and checkpoint):
            checkpoint, step = await self._escalate(proto, job, f"{result.error}: {result.message}")
        return await self.protocols.advance(
            proto,
            Step.HOLD if proto.kind.holds else Step.PLACING,
            checkpoint=checkpoint,
            ckpt_step=step,
            detail=proto.detail | {"stopped_at": self.clock_now()},
        )

    async def _escalate(self, proto: Protocol, job: Job, why: str) -> tuple[str | None, int | None]:
        """Kill the trainer; resume from the newest complete checkpoint its worker names, else the last reported."""
        checkpoint, step = job.last_checkpoint, job.last_checkpoint_step
        for node in job.nodes:
            killed = await self.transport.cancel(job, node, f"{proto.id}:kill:{node}", proto.id, attempts=1)
            if killed.ok and killed.checkpoint and (step is None or (killed.step or 0) >= step):
                checkpoint, step = killed.checkpoint, killed.step
        await self._audit(
            proto,
            "protocol.escalated",
            "protocol.escalated",
            f"checkpoint-stop failed ({why}); trainer killed; resuming from the last complete "
            f"checkpoint {checkpoint or '(none: from the start)'}",
            checkpoint=checkpoint,
            step=step,
        )
        return checkpoint, step

    @staticmethod
    def _overrides(proto: Protocol, job: Job) -> dict[str, Any]:
        """A tune's train settings (a smaller micro-batch), kept with the job like an OOM retry's."""
        changed = proto.detail.get("train_overrides") or {}
        return {"train_overrides": job.train_overrides | changed} if changed else {}

    def _resume_fields(self, proto: Protocol, job: Job) -> dict[str, Any]:
        ckpt = proto.checkpoint
        return dict(
            resume_from=ckpt,
            last_checkpoint=ckpt or job.last_checkpoint,
            last_checkpoint_step=proto.ckpt_step if ckpt else job.last_checkpoint_step,
            # The attempt ended at this stop: the decider's rules read the outcome, so an earlier
            # out-of-memory exit must not look like the last one (oom_retry would act on it again).
            last_outcome=ExitOutcome.STOPPED,
        )

    async def _hold(self, proto: Protocol) -> Protocol:
        job = await self.store.get(proto.job_id)
        ckpt, step = proto.checkpoint, proto.ckpt_step
        where = f"checkpoint {ckpt} (step {step})" if ckpt else "the start"
        if proto.kind == K.PAUSE:
            if job.status == S.CHECKPOINTING:
                await self.move(
                    job,
                    "pause",
                    decision_id=proto.id,
                    reason=f"paused; resumes from {where}",
                    **self._resume_fields(proto, job),
                )
        else:
            if job.status == S.CHECKPOINTING:
                job = await self.move(
                    job,
                    "preempt",
                    decision_id=proto.id,
                    reason=f"preempted at {where}",
                    **self._resume_fields(proto, job),
                )
            if job.status == S.PREEMPTED:
                await self.move(
                    job, "requeue", decision_id=proto.id, reason=f"requeued after preemption; resumes from {where}"
                )
        return await self.protocols.end(proto, ProtocolState.DONE)

    async def _placing(self, proto: Protocol) -> Protocol:
        job = await self.store.get(proto.job_id)
        if job.status == S.CHECKPOINTING:
            where = ",".join(f"{p.node}:{list(p.gpus)}" for p in proto.target)
            await self.move(
                job,
                MOVES[proto.kind],
                decision_id=proto.id,
                placement=proto.target,
                env=job.env | (proto.detail.get("env") or {}),
                **self._resume_fields(proto, job),
                **self._overrides(proto, job),
                reason=f"{proto.kind} to {where} from checkpoint step {proto.ckpt_step}",
            )
        return await self.protocols.advance(proto, Step.STARTING_TARGET)

    async def _starting_target(self, proto: Protocol) -> Protocol:
        job = await self.store.get(proto.job_id)
        if job.status not in (S.MIGRATING, S.RESIZING):
            landed = job.status in (S.STARTING, S.RUNNING)
            return await self.protocols.end(
                proto,
                ProtocolState.DONE if landed else ProtocolState.FAILED,
                None if landed else f"job is {job.status}",
            )
        result = await self._go(proto, job) if self._warm_attempt(proto) == job.attempt else None
        if result is None or not result.ok:
            result = await self.lifecycle.start_trainers(job, f"{proto.id}:start:{job.attempt}", proto.id)
        if result.ok:
            await self.move(
                job,
                "launched",
                decision_id=proto.id,
                job_dir=result.job_dir,
                reason=f"resumed from {job.resume_from} as process {result.pid} on {job.nodes[0]}",
            )
            rolled_back = proto.detail.get("rolled_back")
            return await self.protocols.end(
                proto,
                ProtocolState.ROLLED_BACK if rolled_back else ProtocolState.DONE,
                proto.detail.get("rollback_reason"),
            )
        return await self.protocols.advance(
            proto,
            Step.ROLLBACK,
            detail=proto.detail | {"failure": f"{result.error}: {result.message}", "failure_error": result.error},
        )

    async def _rollback(self, proto: Protocol) -> Protocol:
        """The target failed after the source stopped: carry out the decision's fallback at once, so the job
        never waits stopped and holding devices for a new decision."""
        job = await self.store.get(proto.job_id)
        why = f"start on the target failed ({proto.detail.get('failure')})"
        policy = OnTargetFailure(proto.detail.get("on_target_failure") or OnTargetFailure.RESTART_SOURCE)
        source = proto.source or ()
        if policy == OnTargetFailure.RESTART_SOURCE and not proto.detail.get("rolled_back") and source:
            taken = await self._unavailable(job, source)
            if not taken:
                await self.move(
                    job, "retarget", decision_id=proto.id, placement=source, reason=f"{why}; restarting on the source"
                )
                await self._rollback_audit(proto, f"{why}; restarting on the source", policy, source)
                return await self.protocols.advance(
                    proto,
                    Step.STARTING_TARGET,
                    detail=proto.detail | {"rolled_back": True, "rollback_reason": f"{why}; restarted on the source"},
                )
            why = f"{why}; the source cannot take it back ({taken})"
        elif policy == OnTargetFailure.REQUEUE:
            why = f"{why}; on_target_failure of {proto.detail.get('rule')} is requeue"
        await self.move(
            job, "requeue", decision_id=proto.id, reason=f"{why}; requeued to resume from {job.resume_from}"
        )
        await self._rollback_audit(proto, f"{why}; requeued", policy, source)
        return await self.protocols.end(proto, ProtocolState.ROLLED_BACK, f"{why}; requeued")

    async def _rollback_audit(
        self, proto: Protocol, reason: str, policy: OnTargetFailure, source: tuple[NodeGpus, ...]
    ) -> None:
        await self._audit(
            proto,
            "protocol.rollback",
            "protocol.rollback",
            reason,
            on_target_failure=policy.value,
            failure=proto.detail.get("failure"),
            failure_error=proto.detail.get("failure_error"),
            source=_json(source),
        )


def _json(placement: tuple[NodeGpus, ...] | None) -> list[dict] | None:
    return [p.model_dump(mode="json") for p in placement] if placement is not None else None
