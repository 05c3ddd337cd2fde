"""The one writer of job state: a typed `Job` and the named transitions of shared/contracts/job_status.py.

Each transition is one statement: the row's status, placement, attempt, checkpoint and progress
change together with the history row, guarded by the status (and attempt) the caller read, so a
change made meanwhile by someone else is refused as a conflict, never overwritten. Fields a
transition does not name are left as they are; a job leaving its devices loses its placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import HOLDING_GPUS, NAMED, UNPLACED, InvalidTransition, JobStatus
from shared.contracts.outcomes import ExitOutcome
from shared.infra.clock import Clock, utc
from shared.infra.storable import storable_json, storable_text

# What a transition may write besides status and reason.
FIELDS = (
    "placement",
    "resume_from",
    "last_checkpoint",
    "last_checkpoint_step",
    "progress",
    "job_dir",
    "exit_code",
    "started_at",
    "finished_at",
    "env",
    "train_overrides",
    "last_outcome",
    "oom_retries",
)


class TransitionConflict(RuntimeError):
    """The job is no longer in the state the caller read: someone else moved it first."""

    def __init__(self, job_id: str, name: str, expected: JobStatus, found: JobStatus | None) -> None:
        super().__init__(f"job {job_id}: {name} expected {expected}, found {found or 'no job'}")
        self.expected, self.found = expected, found


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    team: str
    gpus: int
    spec: dict[str, Any]
    status: JobStatus
    status_reason: str | None = None
    placement: tuple[NodeGpus, ...] | None = None
    attempt: int = 0
    resume_from: str | None = None
    last_checkpoint: str | None = None
    last_checkpoint_step: int | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    job_dir: str | None = None
    exit_code: int | None = None
    cancel_requested: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    env: dict[str, str] = field(default_factory=dict)
    train_overrides: dict[str, Any] = field(default_factory=dict)
    last_outcome: ExitOutcome | None = None
    oom_retries: int = 0

    @classmethod
    def from_row(cls, r: asyncpg.Record) -> Job:
        placement = (
            tuple(NodeGpus(node=p["node"], gpus=tuple(p["gpus"])) for p in r["placement"])
            if r["placement"] is not None
            else None
        )
        return cls(
            id=r["id"],
            name=r["name"],
            team=r["team"],
            gpus=r["gpus"],
            spec=r["spec"],
            status=JobStatus(r["status"]),
            status_reason=r["status_reason"],
            placement=placement,
            attempt=r["attempt"],
            resume_from=r["resume_from"],
            last_checkpoint=r["last_checkpoint"],
            last_checkpoint_step=r["last_checkpoint_step"],
            progress=r["progress"] or {},
            job_dir=r["job_dir"],
            exit_code=r["exit_code"],
            cancel_requested=r["cancel_requested"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            env=r["env"] or {},
            train_overrides=r["train_overrides"] or {},
            last_outcome=ExitOutcome(r["last_outcome"]) if r["last_outcome"] else None,
            oom_retries=r["oom_retries"],
        )

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.placement or ()]

    @property
    def train(self) -> dict[str, Any]:
        """The train section a start gets: the spec's, with what the executor changed since (OOM retries)."""
        return dict(self.spec["train"]) | self.train_overrides

    def placement_json(self) -> list[dict] | None:
        return [p.model_dump(mode="json") for p in self.placement] if self.placement is not None else None


def _column(key: str, value: Any) -> Any:
    if key == "placement" and value is not None:
        return [p.model_dump(mode="json") if isinstance(p, NodeGpus) else p for p in value]
    if key in ("started_at", "finished_at") and isinstance(value, (int, float)):
        return utc(value)
    return value


class JobStore:
    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool = pool
        self.clock = clock

    def _db(self, conn: asyncpg.Connection | None):
        """The transaction's connection where the caller has one, else the pool (a statement of its own)."""
        return self.pool if conn is None else conn

    async def get(self, job_id: str, conn: asyncpg.Connection | None = None) -> Job | None:
        row = await self._db(conn).fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
        return Job.from_row(row) if row else None

    async def apply(
        self,
        job: Job,
        name: str,
        *,
        reason: str,
        decision_id: str | None = None,
        conn: asyncpg.Connection | None = None,
        **fields: Any,
    ) -> Job:
        """Apply the named transition to `job` as read; the job after it. With `conn`, inside that
        connection's transaction (it is durable when the caller commits).

        A job already in the target state (a redelivered message whose work was committed) is
        returned as it is, so the caller re-audits under the same id and nothing is done twice.
        """
        t = NAMED[name]
        if unknown := set(fields) - set(FIELDS):
            raise ValueError(f"not job fields: {sorted(unknown)}")
        if job.status == t.target and job.status not in t.sources:
            return job
        if job.status not in t.sources:
            raise InvalidTransition(job.id, job.status, t.target, name)
        if t.target in UNPLACED:
            fields["placement"] = None
        after = {k: getattr(job, k) for k in t.requires} | fields
        if missing := sorted(k for k in t.requires if after.get(k) is None):
            raise ValueError(f"job {job.id}: {name} needs {', '.join(missing)}")
        if t.target in HOLDING_GPUS and not (after.get("placement") or job.placement):
            raise ValueError(f"job {job.id}: {name} to {t.target} needs a placement")
        sets = ["status = $4", "status_reason = $5", "updated_at = $6"]
        args: list[Any] = [
            job.id,
            job.status.value,
            job.attempt,
            t.target.value,
            storable_text(reason),
            utc(self.clock.now()),
        ]
        if t.new_attempt:
            sets.append("attempt = attempt + 1")
        for key, value in fields.items():
            args.append(_column(key, storable_json(value)))
            sets.append(f"{key} = ${len(args)}")
        args.append(decision_id)
        row = await self._db(conn).fetchrow(
            f"WITH moved AS (UPDATE jobs SET {', '.join(sets)} WHERE id = $1 AND status = $2 AND attempt = $3"
            " RETURNING *), history AS ("
            " INSERT INTO job_status_history (job_id, old_status, new_status, decision_id, reason, at)"
            f" SELECT id, $2, status, ${len(args)}, status_reason, updated_at FROM moved)"
            " SELECT * FROM moved",
            *args,
        )
        if row is None:
            now = await self.get(job.id, conn)
            if now is not None and now.status == t.target and now.attempt >= job.attempt:
                return now  # the same move, made by a redelivery of this message
            raise TransitionConflict(job.id, name, job.status, now.status if now else None)
        return Job.from_row(row)

    # --- facts that are not status: guarded by the attempt that reported them ----------

    async def record_progress(self, job: Job, attempt: int, progress: dict[str, Any]) -> None:
        await self.pool.execute(
            "UPDATE jobs SET progress = $3 WHERE id = $1 AND attempt = $2", job.id, attempt, storable_json(progress)
        )

    async def record_evaluation(self, job: Job, attempt: int, split: str, result: dict[str, Any]) -> None:
        """The newest metrics of an evaluation pass (`eval` or `predict`), kept per split."""
        await self.pool.execute(
            "UPDATE jobs SET evaluation = evaluation || jsonb_build_object($3::text, $4::jsonb)"
            " WHERE id = $1 AND attempt = $2",
            job.id,
            attempt,
            split,
            storable_json(result),
        )

    async def record_checkpoint(self, job: Job, attempt: int, path: str, step: int | None) -> None:
        """The newest complete checkpoint the worker reported (it never goes backwards)."""
        await self.pool.execute(
            "UPDATE jobs SET last_checkpoint = $3, last_checkpoint_step = $4"
            " WHERE id = $1 AND attempt = $2 AND (last_checkpoint_step IS NULL OR last_checkpoint_step <= $4)",
            job.id,
            attempt,
            path,
            step,
        )

    async def request_cancel(self, job_id: str) -> Job | None:
        """Record a cancel request (the api asked, through the job's events)."""
        row = await self.pool.fetchrow("UPDATE jobs SET cancel_requested = true WHERE id = $1 RETURNING *", job_id)
        return Job.from_row(row) if row else None

    # --- reads the executor checks decisions against ---------------------------------

    async def booked_devices(
        self, exclude_job: str | None = None, conn: asyncpg.Connection | None = None
    ) -> dict[tuple[str, int], str]:
        """(node, device) -> job, for every job that holds devices now, and the targets of moves being
        prepared (a warm trainer waits there, services/executor/warm_moves.py)."""
        rows = await self._db(conn).fetch(
            "SELECT id, placement FROM jobs WHERE status = ANY($1::text[]) AND placement IS NOT NULL AND id <> $2"
            " UNION ALL SELECT job_id, target FROM protocols"
            " WHERE state = 'running' AND step IN ('preparing', 'stopping') AND target IS NOT NULL AND job_id <> $2",
            [s.value for s in HOLDING_GPUS],
            exclude_job or "",
        )
        return {(p["node"], g): r["id"] for r in rows for p in r["placement"] for g in p["gpus"]}

    async def on_node(self, node: str, statuses: frozenset[JobStatus] | set[JobStatus]) -> list[Job]:
        rows = await self.pool.fetch(
            "SELECT * FROM jobs WHERE status = ANY($1::text[]) AND placement @> $2::jsonb",
            [s.value for s in statuses],
            [{"node": node}],
        )
        return [Job.from_row(r) for r in rows]

    async def in_status(self, statuses: frozenset[JobStatus] | set[JobStatus]) -> list[tuple[Job, float]]:
        """Jobs in these statuses, each with when it last changed (epoch seconds)."""
        rows = await self.pool.fetch(
            "SELECT *, extract(epoch FROM updated_at)::float8 AS changed FROM jobs WHERE status = ANY($1::text[])",
            [s.value for s in statuses],
        )
        return [(Job.from_row(r), r["changed"]) for r in rows]

    async def by_ids(self, ids: list[str]) -> dict[str, Job]:
        rows = await self.pool.fetch("SELECT * FROM jobs WHERE id = ANY($1::text[])", ids)
        return {r["id"]: Job.from_row(r) for r in rows}

    async def scheduled_by(self, job_id: str, decision_id: str, conn: asyncpg.Connection | None = None) -> bool:
        """Whether this decision already moved the job to scheduled (a redelivery after a crash)."""
        return await self.moved_by(job_id, decision_id, JobStatus.SCHEDULED, conn)

    async def launched_by(self, job_id: str, decision_id: str, conn: asyncpg.Connection | None = None) -> str | None:
        """The reason recorded with the job's newest move to starting (the launch of its current attempt)
        if this decision made it (a redelivery after the launch committed), else None."""
        row = await self._db(conn).fetchrow(
            "SELECT decision_id, reason FROM job_status_history WHERE job_id = $1 AND new_status = $2"
            " ORDER BY id DESC LIMIT 1",
            job_id,
            JobStatus.STARTING.value,
        )
        return (row["reason"] or "") if row is not None and row["decision_id"] == decision_id else None

    async def moved_by(
        self, job_id: str, decision_id: str, status: JobStatus, conn: asyncpg.Connection | None = None
    ) -> bool:
        """Whether this decision already moved the job to `status` (a redelivery after a crash)."""
        return bool(
            await self._db(conn).fetchval(
                "SELECT 1 FROM job_status_history WHERE job_id = $1 AND decision_id = $2 AND new_status = $3",
                job_id,
                decision_id,
                status.value,
            )
        )
