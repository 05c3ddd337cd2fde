"""The job lifecycle: one transition table, enforced in one place (the executor)."""
from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    MIGRATING = "migrating"
    PREEMPTED = "preempted"
    RESIZING = "resizing"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_gpus(self) -> bool:
        return self in HOLDING_GPUS


S = JobStatus
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
HOLDING_GPUS = frozenset({S.SCHEDULED, S.STARTING, S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESIZING})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED, S.PAUSED}),
    # scheduled -> pending: the worker refused or never answered the start; requeue.
    S.SCHEDULED: frozenset({S.STARTING, S.PENDING, S.FAILED, S.CANCELLED}),
    # starting -> succeeded: a very short job can finish before its first progress event.
    S.STARTING: frozenset({S.RUNNING, S.PENDING, S.FAILED, S.CANCELLED, S.SUCCEEDED}),
    # running -> pending: its node was lost; it resumes from its last checkpoint.
    S.RUNNING: frozenset({S.CHECKPOINTING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PENDING}),
    # checkpointing -> pending: the checkpoint-stop could not be completed; requeue from the last checkpoint.
    S.CHECKPOINTING: frozenset({S.MIGRATING, S.PREEMPTED, S.RESIZING, S.PAUSED, S.RUNNING, S.PENDING, S.FAILED,
                                S.CANCELLED, S.SUCCEEDED}),
    S.MIGRATING: frozenset({S.STARTING, S.PENDING, S.FAILED, S.CANCELLED}),
    S.RESIZING: frozenset({S.STARTING, S.PENDING, S.FAILED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.PENDING, S.CANCELLED}),
    S.PAUSED: frozenset({S.PENDING, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: str, old: JobStatus, new: JobStatus) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[old])) or "none (terminal)"
        super().__init__(f"job {job_id}: {old} -> {new} is not allowed (from {old}: {allowed})")
        self.old, self.new = old, new


def check_transition(job_id: str, old: JobStatus | str, new: JobStatus | str) -> None:
    old, new = JobStatus(old), JobStatus(new)
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(job_id, old, new)
