"""What the executor tells the audit log: transitions, commands, refusals. Ids are deterministic,
so a redelivered message re-audits under the same id and the sink keeps one row."""

from __future__ import annotations

from typing import Any

from services.executor.ledger import Fence
from services.executor.store import Job, JobStore
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import AuditEvent
from shared.infra.bus import Bus
from shared.infra.clock import Clock


class Auditor:
    def __init__(self, bus: Bus, clock: Clock) -> None:
        self.bus = bus
        self.clock = clock

    async def __call__(self, event_id: str, kind: str, **fields: Any) -> None:
        await self.bus.audit(AuditEvent(event_id=event_id, ts=self.clock.now(), source="executor", kind=kind, **fields))

    async def transition(
        self,
        job: Job,
        decision_id: str | None = None,
        *,
        to: JobStatus | None = None,
        reason: str | None = None,
        **data: Any,
    ) -> None:
        """The job's move to its status (or, `to` and `reason`: an earlier move of its current attempt)."""
        status = to or job.status
        await self(
            f"{job.id}:{job.attempt}:{status}",
            f"job.{status}",
            job_id=job.id,
            decision_id=decision_id,
            node=(job.nodes or [None])[0],
            reason=job.status_reason if reason is None else reason,
            data={"attempt": job.attempt, "placement": job.placement_json(), **data},
        )


class Mover:
    """A named transition, then its audit event: how every job change is made."""

    def __init__(self, store: JobStore, audit: Auditor, fence: Fence | None = None) -> None:
        self.store = store
        self.audit = audit
        self.fence = fence or Fence()

    async def __call__(
        self,
        job: Job,
        name: str,
        *,
        reason: str,
        decision_id: str | None = None,
        audit_data: dict | None = None,
        **fields: Any,
    ) -> Job:
        moved = await self.within(None, job, name, reason=reason, decision_id=decision_id, **fields)
        await self.audit.transition(moved, decision_id, **(audit_data or {}))
        return moved

    async def within(
        self, conn, job: Job, name: str, *, reason: str, decision_id: str | None = None, **fields: Any
    ) -> Job:
        """The transition inside the caller's transaction on `conn` (None: a statement of its own); its
        audit event (`Auditor.transition`) is the caller's to publish once that transaction has committed."""
        self.fence.check()
        return await self.store.apply(job, name, reason=reason, decision_id=decision_id, conn=conn, **fields)
