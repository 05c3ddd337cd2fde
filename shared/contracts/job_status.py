"""The job lifecycle: named transitions, each from some states to one, with the fields it needs.

The executor's store (`services/executor/store.py`) is the one place that applies them; the
edge table `TRANSITIONS` is derived from the named ones, and migration 008 holds the same edges
as a CHECK on `job_status_history`, so the database refuses what this table refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
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
# Statuses whose job has no devices: the store clears the placement on the way in.
UNPLACED = frozenset({S.PENDING, S.PREEMPTED, S.PAUSED})


@dataclass(frozen=True)
class Transition:
    """A named move: allowed from `sources`, lands in `target`, needs `requires` set (not None)."""

    name: str
    sources: frozenset[JobStatus]
    target: JobStatus
    requires: frozenset[str] = frozenset()
    new_attempt: bool = False  # a new placement: the next attempt


def _t(
    name: str, sources: set[JobStatus], target: JobStatus, requires: set[str] = frozenset(), new_attempt: bool = False
) -> Transition:
    return Transition(name, frozenset(sources), target, frozenset(requires), new_attempt)


_MOVING = {S.MIGRATING, S.RESIZING}
NAMED: dict[str, Transition] = {
    t.name: t
    for t in (
        _t("schedule", {S.PENDING}, S.SCHEDULED, {"placement"}, new_attempt=True),
        # the worker accepted the start: its trainer process runs (a first start or a move's target)
        _t("launched", {S.SCHEDULED} | _MOVING, S.STARTING, {"job_dir"}),
        _t("started", {S.STARTING}, S.RUNNING, {"started_at"}),
        _t("begin_checkpoint", {S.RUNNING}, S.CHECKPOINTING),
        _t("migrate", {S.CHECKPOINTING}, S.MIGRATING, {"placement"}, new_attempt=True),
        _t("resize", {S.CHECKPOINTING}, S.RESIZING, {"placement"}, new_attempt=True),
        # the target refused: back to the source, as a migration of its own
        _t("retarget", _MOVING, S.MIGRATING, {"placement"}, new_attempt=True),
        _t("preempt", {S.CHECKPOINTING}, S.PREEMPTED),
        _t("pause", {S.CHECKPOINTING}, S.PAUSED),
        # back to the queue: a start refused, a node lost, a stop nobody asked for, a resume, an OOM retry
        _t(
            "requeue", {S.SCHEDULED, S.STARTING, S.RUNNING, S.CHECKPOINTING, S.PREEMPTED, S.PAUSED} | _MOVING, S.PENDING
        ),
        # a very short job can finish before its first progress event, or while asked to stop
        _t("finish", {S.STARTING, S.RUNNING, S.CHECKPOINTING}, S.SUCCEEDED, {"finished_at"}),
        # a pending job is failed only by a decision: out of memory again with its retries spent
        _t(
            "fail",
            {S.PENDING, S.SCHEDULED, S.STARTING, S.RUNNING, S.CHECKPOINTING} | _MOVING,
            S.FAILED,
            {"finished_at"},
        ),
        _t("cancel", set(JobStatus) - TERMINAL, S.CANCELLED, {"finished_at"}),
    )
}

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    s: frozenset(t.target for t in NAMED.values() if s in t.sources) for s in JobStatus
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: str, old: JobStatus, new: JobStatus, name: str | None = None) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[old])) or "none (terminal)"
        label = f"{name}: " if name else ""
        super().__init__(f"job {job_id}: {label}{old} -> {new} is not allowed (from {old}: {allowed})")
        self.old, self.new = old, new


def check_transition(job_id: str, old: JobStatus | str, new: JobStatus | str) -> None:
    old, new = JobStatus(old), JobStatus(new)
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(job_id, old, new)


def reachable_from(start: JobStatus) -> set[JobStatus]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
