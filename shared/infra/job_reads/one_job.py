"""Reads of one job by its id. None of them confines by team: a caller that shows the job checks the
team the row names (the api's `visible_job`)."""

from __future__ import annotations

import re
from typing import NamedTuple

import asyncpg

Db = asyncpg.Pool | asyncpg.Connection
JobRow = asyncpg.Record  # every column of `jobs`, as the api's job view reads them
_PLACEHOLDER = re.compile(r"\$[1-9][0-9]{0,2}")


class ActionTarget(NamedTuple):
    """What a manual action checks of its job: whose it is and where it stands."""

    id: str
    team: str
    status: str


class LogCursor(NamedTuple):
    """What a followed log re-reads: the job's status, its attempt and its folder."""

    status: str
    attempt: int
    job_dir: str | None


async def job_row(db: Db, job_id: str) -> JobRow | None:
    return await db.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)


async def team_of(db: Db, job_id: str) -> str | None:
    """The job's team (it never changes once the job is stored); None if there is no such job."""
    return await db.fetchval("SELECT team FROM jobs WHERE id = $1", job_id)


def team_of_sql(placeholder: str) -> str:
    """`team_of` as a scalar subquery for another statement to embed, so a write that stamps a job's
    team (the audit sink's INSERT) stays one round trip. `placeholder`: that statement's parameter
    holding the job id, e.g. "$6"."""
    if not _PLACEHOLDER.fullmatch(placeholder):
        raise ValueError(f"not a statement parameter: {placeholder!r}")
    return f"(SELECT team FROM jobs WHERE id = {placeholder})"


async def action_target(db: Db, job_id: str) -> ActionTarget | None:
    row = await db.fetchrow("SELECT id, team, status FROM jobs WHERE id = $1", job_id)
    return ActionTarget(**row) if row is not None else None


async def log_cursor(db: Db, job_id: str) -> LogCursor | None:
    row = await db.fetchrow("SELECT status, attempt, job_dir FROM jobs WHERE id = $1", job_id)
    return LogCursor(**row) if row is not None else None


async def trace_parent(db: Db, job_id: str) -> str | None:
    """The `traceparent` the api stored at submission: the root of the job's trace."""
    return await db.fetchval("SELECT trace_parent FROM jobs WHERE id = $1", job_id)
