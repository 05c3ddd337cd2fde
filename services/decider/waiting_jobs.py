"""Pending jobs that wait for another (`after`, services/api/job_refs.py) which has not succeeded yet.

The job book keeps them out of its view, so no rule can place one; the publisher gives each its
pending reason, and cancels one whose job failed, was cancelled or is gone. A change of the job
waited for re-reads the jobs waiting for it, so one starts at the pass after its job succeeded.
"""

from __future__ import annotations

from shared.contracts.actions import Cancel
from shared.contracts.job_status import HOLDING_GPUS, JobStatus
from shared.contracts.messages import AuditEvent, Decision
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.infra.bus import Bus

# Statuses of a job that others may still wait for: it may yet succeed.
WAITABLE = {JobStatus.PENDING, JobStatus.PREEMPTED, JobStatus.PAUSED, *HOLDING_GPUS}


class WaitingJobs:
    """The job book's part for `after`: `waiting` maps a job to (the job it waits for, that job's status)."""

    @property
    def waiting(self) -> dict[str, tuple[str, str | None]]:
        return self.__dict__.setdefault("_waiting", {})

    def _held(self, row) -> bool:
        """Whether this row is a pending job whose `after` has not succeeded (noted in `waiting`)."""
        after, status = row.get("after"), row.get("after_status")
        if row["status"] == JobStatus.PENDING and after and status != JobStatus.SUCCEEDED:
            self.waiting[row["id"]] = (after, status)
            return True
        self.waiting.pop(row["id"], None)
        return False

    def _waiting_for(self, job_id: str) -> set[str]:
        return {j for j, (after, _) in self.waiting.items() if after == job_id}

    def _keep_waiting(self, listed: set[str]) -> None:
        """After a whole read: only the jobs it listed still wait."""
        self.__dict__["_waiting"] = {j: w for j, w in self.waiting.items() if j in listed}


class WaitingReport:
    """The publisher's part for `after`: pending reasons of the waiting jobs, and the cancels."""

    def __init__(self, bus: Bus, leadership, source) -> None:
        self.bus = bus
        self.leadership = leadership
        self.source = source  # the snapshot source: its job book holds the waiting jobs
        self.cancelled: set[str] = set()  # jobs cancelled because their `after` failed

    async def report(self, now: float, decide: bool) -> dict[str, dict[str, str]]:
        """Pending jobs whose `after` has not succeeded (job_book.py), which no rule sees: a pending reason
        for each; one whose `after` failed, was cancelled or is gone is cancelled (with `decide`), saying why."""
        pending = {}
        for job_id, (after, status) in sorted(self.source.book.waiting.items()):
            if status in WAITABLE:
                pending[job_id] = {
                    "after": Reason(ReasonCode.PENDING_AFTER, f"waits for job {after} to succeed (it is {status})")
                }
                continue
            why = f"job {after}, which it runs after, {'is ' + status if status else 'no longer exists'}"
            pending[job_id] = {"after": Reason(ReasonCode.PENDING_AFTER_FAILED, f"{why}; cancelling it")}
            if decide and job_id not in self.cancelled:
                await self._cancel_after(job_id, after, f"{why}: nothing to run after", now)
        return pending

    async def _cancel_after(self, job_id: str, after: str, reason: str, now: float) -> None:
        token = self.leadership.token
        if self.leadership.fenced and token is None:
            return  # not leading: the leader cancels it
        decision = Decision(
            decision_id=f"{job_id}:after:{after}",  # the same each pass: the executor records it once
            ts=now,
            rule="after",
            action=Cancel(job_id=job_id, reason=reason, reason_code=ReasonCode.AFTER_CANCEL, evidence={"after": after}),
            snapshot_ts=now,
            fence=token,
        )
        await self.bus.audit(
            AuditEvent(
                event_id=f"{decision.decision_id}:decided",
                ts=now,
                source="decider",
                kind="decision",
                job_id=job_id,
                decision_id=decision.decision_id,
                rule="after",
                action="cancel",
                reason=reason,
                evidence={"after": after},
                data={"instance": self.leadership.instance, "reason_code": ReasonCode.AFTER_CANCEL},
            )
        )
        await self.bus.publish_js(self.bus.subjects.decisions, decision, decision.decision_id)
        self.cancelled.add(job_id)
        self.source.book.changed(job_id)
