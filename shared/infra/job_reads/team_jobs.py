"""Reads confined to one team, in SQL: what a user of the team may be shown or counted against. The
team is always a parameter of the statement, never left for the caller to filter afterwards."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from shared.infra.job_reads.one_job import Db, JobRow


class NamedJob(NamedTuple):
    id: str
    name: str
    status: str


class ChainMember(NamedTuple):
    id: str
    name: str
    status: str
    after: str | None  # the member it waits for


class QuotaUsage(NamedTuple):
    """What a team's counted jobs hold (devices) and number, in all and for one of its users."""

    gpus: int
    jobs: int
    user_gpus: int
    user_jobs: int


# The filters a page of jobs may set, as columns; a None value sets none.
PAGE_FILTERS = ("team", "owner", "priority", "name", "status")


async def page(db: Db, filters: dict[str, str | None], limit: int, before: str | None = None) -> list[JobRow]:
    """Jobs newest first (submitted_at, id), at most `limit`, matching every filter that is set (the
    api sets `team` for a user), and after the job `before` (the previous page's cursor)."""
    if unknown := set(filters) - set(PAGE_FILTERS):
        raise ValueError(f"not a filter of a page of jobs: {sorted(unknown)}")
    where, args = [], []
    for column in PAGE_FILTERS:
        if (value := filters.get(column)) is not None:
            args.append(value)
            where.append(f"{column} = ${len(args)}")
    if before:
        args.append(before)
        where.append(f"(submitted_at, id) < (SELECT submitted_at, id FROM jobs WHERE id = ${len(args)})")
    args.append(limit)
    sql = (
        "SELECT * FROM jobs"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" ORDER BY submitted_at DESC, id DESC LIMIT ${len(args)}"
    )
    return await db.fetch(sql, *args)


async def chain_members(db: Db, chain: str, team: str) -> list[ChainMember]:
    """The team's jobs submitted as the chain `chain`, by id."""
    rows = await db.fetch(
        "SELECT id, name, status, spec->>'after' AS after FROM jobs WHERE spec->>'chain' = $1 AND team = $2"
        " ORDER BY id",
        chain,
        team,
    )
    return [ChainMember(**r) for r in rows]


async def by_id_or_name(db: Db, team: str, key: str) -> NamedJob | None:
    """The team's job with the id `key`, else its newest job named `key`."""
    row = await db.fetchrow(
        "SELECT id, name, status FROM jobs WHERE team = $1 AND (id = $2 OR name = $2)"
        " ORDER BY (id = $2) DESC, submitted_at DESC LIMIT 1",
        team,
        key,
    )
    return NamedJob(**row) if row is not None else None


# Devices a job counts for: those its placement holds (an elastic job may have grown or shrunk), else
# what it asks for (a queued job).
_HELD = (
    "coalesce((SELECT sum(jsonb_array_length(p->'gpus')) FROM jsonb_array_elements("
    "CASE WHEN jsonb_typeof(placement) = 'array' THEN placement ELSE '[]'::jsonb END) p), 0)"
)
_COUNTED = f"CASE WHEN status = ANY($3::text[]) AND {_HELD} > 0 THEN {_HELD} ELSE gpus END"


async def quota_usage(db: Db, team: str, counted: list[str], holding: list[str], user: str) -> QuotaUsage:
    """The devices and jobs of the team's jobs in a `counted` status; a job in a `holding` status counts
    the devices its placement holds. Run it under the team's quota lock, in the admitting transaction."""
    row = await db.fetchrow(
        f"SELECT coalesce(sum({_COUNTED}), 0) AS gpus, count(*) AS jobs,"
        f" coalesce(sum({_COUNTED}) FILTER (WHERE owner = $4), 0) AS user_gpus,"
        " count(*) FILTER (WHERE owner = $4) AS user_jobs"
        " FROM jobs WHERE team = $1 AND status = ANY($2::text[])",
        team,
        counted,
        holding,
        user,
    )
    return QuotaUsage(*(int(row[k]) for k in QuotaUsage._fields))


async def ids_of_team(db: Db, ids: Iterable[str], team: str) -> set[str]:
    """Those of `ids` that are the team's jobs."""
    rows = await db.fetch("SELECT id FROM jobs WHERE id = ANY($1::text[]) AND team = $2", list(ids), team)
    return {r["id"] for r in rows}


async def names_of_other_teams_only(db: Db, names: Iterable[str], team: str) -> set[str]:
    """Those of `names` that name jobs of other teams and no job of this team."""
    rows = await db.fetch(
        "SELECT name FROM jobs WHERE name = ANY($1::text[]) GROUP BY name HAVING NOT bool_or(team = $2)",
        list(names),
        team,
    )
    return {r["name"] for r in rows}
