"""A pass's results out: each decision to the executor (with the lease's fencing token) and to the
audit, shadow decisions and rule incidents to the audit, proposals held back by arbitration
audited once in a while (not every pass they come back), and every pending job's reasons to the
board the api reads."""

from __future__ import annotations

import logging

import asyncpg

from services.decider.core import EngineCore, Incident, PassResult
from services.decider.evidence_links import evidence_links
from services.decider.leadership import Leadership
from services.decider.snapshot import Snapshot
from services.decider.snapshot_source import SnapshotSource
from services.decider.waiting_jobs import WaitingReport
from shared.contracts.messages import AuditEvent, Decision
from shared.contracts.reason_codes import Reason, ReasonCode, code_of
from shared.infra import tracing
from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.pending_reasons import PendingReasonBoard

log = logging.getLogger(__name__)
REAUDIT_S = 300.0  # the same rule incident is audited again only after this long


class Publisher:
    def __init__(
        self,
        bus: Bus,
        pool: asyncpg.Pool,
        clock: Clock,
        core: EngineCore,
        source: SnapshotSource,
        leadership: Leadership,
    ) -> None:
        self.bus = bus
        self.pool = pool
        self.clock = clock
        self.core = core
        self.source = source
        self.leadership = leadership
        self.board = PendingReasonBoard(bus)
        self._audited: dict[tuple[str, ...], float] = {}
        self.waiting = WaitingReport(bus, leadership, source)

    async def publish(self, result: PassResult, snap: Snapshot) -> None:
        if self.leadership.fenced:
            # Every decision carries the lease's fencing token; one decided by a leader that has
            # stepped down meanwhile is not sent (the executor would refuse it anyway).
            if (fence := self.leadership.token) is None:
                for unsent in result.decisions:
                    self.core.in_flight.pop(unsent.action.job_id, None)
                log.warning(
                    "pass ended after this decider stopped leading; %d decision(s) not sent", len(result.decisions)
                )
                return
            result.decisions[:] = [d.model_copy(update={"fence": fence}) for d in result.decisions]
        for decision in result.shadow:
            await self._audit_decision(decision, snap, result, "decision.shadow")
        for i, decision in enumerate(result.decisions):
            try:
                job_trace = await tracing.job_context(self.pool, decision.action.job_id)
                with tracing.span(
                    "decider",
                    f"decide {decision.action.action}",
                    parent=job_trace,
                    # The request or the samples it acted on (nothing to walk for when tracing is off).
                    links=evidence_links(decision.action.evidence) if tracing.enabled() else (),
                    job_id=decision.action.job_id,
                    rule=decision.rule,
                ):
                    await self._audit_decision(decision, snap, result, "decision")
                    await self.bus.publish_js(self.bus.subjects.decisions, decision, decision.decision_id)
                self.source.book.changed(decision.action.job_id)  # the executor is about to move it
            except Exception:
                for unsent in result.decisions[i:]:  # not sent: decide them again next pass
                    self.core.in_flight.pop(unsent.action.job_id, None)
                raise
            log.info(
                "decided %s %s by %s: %s",
                decision.action.action,
                decision.action.job_id,
                decision.rule,
                decision.action.reason,
            )
        for incident in result.incidents:
            await self._audit_incident(incident)
        for verdict in result.refused:
            p = verdict.proposal
            if p.kind == "start" or verdict.routine:
                continue  # the normal course: the same proposal comes back each pass until it can go
            await self._audit_once(
                AuditEvent(
                    ts=result.snapshot_ts,
                    source="decider",
                    kind="decision.held",
                    job_id=p.action.job_id,
                    rule=p.rule,
                    action=p.kind,
                    reason=f"{p.action.reason}; held back: {verdict.why}",
                    evidence=p.action.evidence,
                    data={"shadow": p.shadow, "reason_code": verdict.code, "proposal_reason_code": code_of(p.action)},
                ),
                (p.rule, p.action.job_id, verdict.why),
            )

    async def publish_pending(
        self, result: PassResult, snap: Snapshot, now: float, unreadable: dict[str, dict[str, str]]
    ) -> None:
        """Why each pending job waits, from every rule (a regular pass's: the urgent one runs only some),
        and for each pending job whose row the decider cannot read, which no rule sees."""
        try:
            await self.board.publish(
                result.pending | unreadable, {j.id for j in snap.pending()} | unreadable.keys(), now
            )
        except Exception as err:  # the next pass writes them again
            log.warning("pending reasons not written: %s", err)

    async def report_unreadable(self, now: float) -> dict[str, dict[str, str]]:
        """Jobs whose row the decider cannot read (job_book.py): audited (again after REAUDIT_S), and a
        pending reason for each pending one."""
        pending = {}
        for job_id, (status, why) in sorted(self.source.book.unreadable.items()):
            reason = Reason(
                ReasonCode.PENDING_UNREADABLE,
                f"the decider cannot read this job's row ({why}); nothing is decided from it until the row "
                "is fixed or the job cancelled" + ("; it keeps its devices" if status != "pending" else ""),
            )
            await self._audit_once(
                AuditEvent(
                    ts=now,
                    source="decider",
                    kind="job.unreadable",
                    job_id=job_id,
                    reason=reason,
                    data={"status": str(status), "reason_code": reason.code},
                ),
                ("job.unreadable", job_id, why),
            )
            if status == "pending":
                pending[job_id] = {"decider": reason}
        return pending

    async def _audit_decision(self, decision: Decision, snap: Snapshot, result: PassResult, kind: str) -> None:
        a = decision.action
        placement = getattr(a, "placement", None) or []
        job = snap.job(a.job_id)
        node = placement[0].node if placement else (job.placement[0].node if job and job.placement else None)
        suffix = "decided" if kind == "decision" else "shadow"
        await self.bus.audit(
            AuditEvent(
                event_id=f"{decision.decision_id}:{suffix}",
                ts=decision.ts,
                source="decider",
                kind=kind,
                job_id=a.job_id,
                node=node,
                decision_id=decision.decision_id,
                rule=decision.rule,
                action=a.action,
                reason=a.reason,
                evidence=a.evidence,
                data={
                    "reason_code": code_of(a),
                    "snapshot_ts": snap.ts,
                    "rule_ms": result.timings_ms.get(decision.rule),
                    "shadow": decision.shadow,
                    "instance": self.leadership.instance,
                    "placement": [p.model_dump() for p in placement],
                    "schedules": list(snap.schedules),
                },
            )
        )

    async def _audit_incident(self, incident: Incident) -> None:
        await self._audit_once(
            AuditEvent(
                ts=self.clock.now(),
                source="decider",
                kind=incident.kind,
                rule=incident.rule,
                reason=incident.reason,
                data=incident.data | {"reason_code": ReasonCode(incident.kind)},
            ),
            (incident.kind, incident.rule, incident.reason),
        )

    async def _audit_once(self, event: AuditEvent, key: tuple) -> None:
        """Audit, unless the very same thing was audited less than REAUDIT_S ago."""
        now = self.clock.now()
        key = tuple(str(k) for k in key)
        if now - self._audited.get(key, float("-inf")) < REAUDIT_S:
            return
        self._audited[key] = now
        if len(self._audited) > 10_000:
            self._audited = {k: t for k, t in self._audited.items() if now - t < REAUDIT_S}
        await self.bus.audit(event)
        log.warning("%s: %s", event.kind, event.reason)
