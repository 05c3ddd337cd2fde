"""Reads across teams: which jobs hold which devices, the pending queue, and the aggregates and live
jobs ADC's metrics are computed from. Only the queue confines by team (for a user); the others feed
operator views and team-free aggregates."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from shared.contracts.job_status import HOLDING_GPUS
from shared.infra.job_reads.one_job import Db


class PlacedJob(NamedTuple):
    id: str
    team: str
    placement: list[dict[str, Any]]  # [{"node": ..., "gpus": [...]}], as the executor stored it


class QueuedJob(NamedTuple):
    id: str
    name: str
    team: str
    owner: str
    priority: str
    priority_rank: int
    gpus: int
    submitted_at: datetime
    multi_node: bool
    position: int  # in line within its priority rank, from 1
    pending: int  # every pending job, whoever's


class StatusCount(NamedTuple):
    status: str
    priority: str
    n: int


class PriorityAge(NamedTuple):
    priority: str
    s: float  # seconds


class PriorityWaits(NamedTuple):
    priority: str
    n: int
    s: float | None  # seconds in all


class LiveProgress(NamedTuple):
    id: str
    team: str
    name: str
    progress: dict[str, Any] | None
    last_checkpoint: str | None


async def placed_jobs(db: Db) -> list[PlacedJob]:
    """Every job holding devices now, with its placement."""
    rows = await db.fetch(
        "SELECT id, team, placement FROM jobs WHERE status = ANY($1::text[]) AND placement IS NOT NULL",
        [s.value for s in HOLDING_GPUS],
    )
    return [PlacedJob(**r) for r in rows]


async def pending_queue(db: Db, team: str | None, limit: int) -> list[QueuedJob]:
    """Pending jobs in admission order (priority rank, then submission), at most `limit`; with `team`,
    only that team's, each still numbered in the whole queue."""
    rows = await db.fetch(
        "SELECT * FROM (SELECT id, name, team, owner, priority, priority_rank, gpus, submitted_at,"
        " coalesce((spec->>'multi_node')::boolean, false) AS multi_node,"
        " row_number() OVER (PARTITION BY priority_rank ORDER BY submitted_at, id) AS position,"
        " count(*) OVER () AS pending"
        " FROM jobs WHERE status = 'pending') q WHERE $1::text IS NULL OR team = $1"
        " ORDER BY priority_rank, position LIMIT $2",
        team,
        limit,
    )
    return [QueuedJob(**r) for r in rows]


async def counts_by_status(db: Db) -> list[StatusCount]:
    rows = await db.fetch("SELECT status, priority, count(*) AS n FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")
    return [StatusCount(**r) for r in rows]


async def oldest_pending(db: Db) -> list[PriorityAge]:
    """Per priority, how long its oldest pending job has waited (by the database's clock)."""
    rows = await db.fetch(
        "SELECT priority, extract(epoch FROM now() - min(submitted_at)) AS s FROM jobs"
        " WHERE status = 'pending' GROUP BY 1 ORDER BY 1"
    )
    return [PriorityAge(r["priority"], float(r["s"])) for r in rows]


async def queue_waits(db: Db) -> list[PriorityWaits]:
    """Per priority, the jobs that have started and their waits from submission to the first start."""
    rows = await db.fetch(
        "SELECT priority, count(*) AS n, sum(extract(epoch FROM started_at - submitted_at)) AS s"
        " FROM jobs WHERE started_at IS NOT NULL GROUP BY 1 ORDER BY 1"
    )
    return [PriorityWaits(r["priority"], r["n"], float(r["s"]) if r["s"] is not None else None) for r in rows]


async def live_progress(db: Db, statuses: list[str]) -> list[LiveProgress]:
    """The progress and last checkpoint of every job in one of `statuses`, by id."""
    rows = await db.fetch(
        "SELECT id, team, name, progress, last_checkpoint FROM jobs WHERE status = ANY($1::text[]) ORDER BY id",
        statuses,
    )
    return [LiveProgress(**r) for r in rows]
