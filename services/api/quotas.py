"""Team quotas: read (a user their own team's), set and remove (admin), and the admission check
the submit route runs.

At submission the api refuses what can never or may not run: a priority the team may not use,
a job larger than the team's whole GPU quota, and, when the quota says `refuse`, a job that
would take the team over it. "Over" counts the team's queued jobs as well as its running ones,
so refuse mode bounds what a team has outstanding. With `queue` the job is accepted and the
decider holds it until the team is under quota (it counts running jobs only); the submit
answer carries the reason as `quota_note`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import asyncpg
from fastapi import APIRouter, Depends, HTTPException, Path, Request, status
from pydantic import BaseModel, Field

from services.api.audit_trail import diff, record
from services.api.auth import Principal, authenticate, require
from services.api.errors import AUTHENTICATED, NOT_FOUND, WITH_BODY, field_errors
from services.api.request_limits import StrictBody
from shared.contracts.job_status import HOLDING_GPUS, JobStatus
from shared.infra.job_reads import team_jobs
from shared.specs.quota import Quota, TeamUsage, over_quota, priority_allowed

router = APIRouter(prefix="/v1/quotas", tags=["quotas"])

TEAM_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$"
TEAM = Path(pattern=TEAM_PATTERN, description="a team name")
_MAX = 1_000_000  # Postgres integer columns; anything near it is a typo


class QuotaFields(BaseModel):
    max_gpus: int | None = Field(None, ge=0, le=_MAX, description="devices in use at once; null: no limit")
    max_running_jobs: int | None = Field(
        None, ge=0, le=_MAX, description="jobs holding devices at once; null: no limit"
    )
    allowed_priorities: list[str] | None = Field(None, max_length=64, description="null: every level")
    over_quota: Literal["queue", "refuse"] = Field("queue", description="what happens to a submission over quota")
    max_gpus_per_user: int | None = Field(
        None, ge=0, le=_MAX, description="devices one user of the team holds at once; null: no per-user limit"
    )
    max_running_jobs_per_user: int | None = Field(
        None, ge=0, le=_MAX, description="jobs one user of the team runs at once; null: no limit"
    )


class QuotaIn(StrictBody, QuotaFields):
    pass


class QuotaOut(QuotaFields):
    team: str
    updated_by: str | None
    updated_at: str


class QuotaList(BaseModel):
    items: list[QuotaOut]


def _view(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "team": row["team"],
        "max_gpus": row["max_gpus"],
        "max_running_jobs": row["max_running_jobs"],
        "allowed_priorities": row["allowed_priorities"],
        "over_quota": row["over_quota"],
        "max_gpus_per_user": row["max_gpus_per_user"],
        "max_running_jobs_per_user": row["max_running_jobs_per_user"],
        "updated_by": row["updated_by"],
        "updated_at": row["updated_at"].isoformat(),
    }


def _document(row: asyncpg.Record | None) -> dict[str, Any]:
    return {k: v for k, v in _view(row).items() if k in QuotaFields.model_fields} if row else {}


@dataclass
class Admission:
    invalid: list[dict[str, Any]] = field(default_factory=list)  # 422, naming the field
    refused: str | None = None  # 429: over quota, refuse mode
    queued: str | None = None  # accepted, but the decider will hold it


async def admission(
    conn: asyncpg.Connection, team: str, priority: str, gpus: int, user: str = "", max_gpus: int | None = None
) -> Admission:
    """Call inside the submit transaction: it serializes a team's submissions so two cannot
    both squeeze under the quota. `max_gpus`: an elastic job's ceiling, bounded by the quota too."""
    row = await conn.fetchrow("SELECT * FROM quotas WHERE team = $1", team)
    if row is None:
        return Admission()
    quota = Quota.from_row(row)
    verdict = Admission()
    if why := priority_allowed(quota, priority):
        verdict.invalid.append({"loc": ["priority"], "msg": why})
    if quota.max_gpus is not None and gpus > quota.max_gpus:
        verdict.invalid.append(
            {
                "loc": ["gpus"],
                "msg": f"the job needs {gpus} device(s) but team {team}'s whole "
                f"quota is {quota.max_gpus}: it could never run",
            }
        )
    if quota.max_gpus_per_user is not None and gpus > quota.max_gpus_per_user:
        verdict.invalid.append(
            {
                "loc": ["gpus"],
                "msg": f"the job needs {gpus} device(s) but team {team} allows "
                f"{quota.max_gpus_per_user} per user: it could never run",
            }
        )
    ceiling = (
        min(q for q in (quota.max_gpus, quota.max_gpus_per_user) if q is not None)
        if quota.max_gpus is not None or quota.max_gpus_per_user is not None
        else None
    )
    if max_gpus is not None and ceiling is not None and max_gpus > ceiling:
        verdict.invalid.append(
            {
                "loc": ["max_gpus"],
                "msg": f"max_gpus {max_gpus} is more than team {team}'s quota "
                f"lets one job hold ({ceiling}); elastic growth stops there",
            }
        )
    if verdict.invalid:
        return verdict
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('adc-quota:' || $1))", team)
    counted = [s.value for s in HOLDING_GPUS]
    if quota.over_quota == "refuse":
        counted.append(JobStatus.PENDING.value)
    holding = [s.value for s in HOLDING_GPUS]
    usage = await team_jobs.quota_usage(conn, team, counted, holding, user)
    why = over_quota(
        quota,
        TeamUsage(gpus=usage.gpus, running_jobs=usage.jobs),
        gpus,
        user,
        TeamUsage(gpus=usage.user_gpus, running_jobs=usage.user_jobs),
    )
    if why and quota.over_quota == "refuse":
        verdict.refused = f"refused: {why} (counting queued jobs); the quota says refuse"
    elif why:
        verdict.queued = f"queued until the team is under quota: {why}"
    return verdict


@router.get("", response_model=QuotaList, responses=AUTHENTICATED, summary="Quotas: every team's, or a user's own")
async def list_quotas(request: Request, who: Principal = Depends(authenticate)):
    if who.sees_all:
        rows = await request.app.state.pool.fetch("SELECT * FROM quotas ORDER BY team")
    else:
        rows = await request.app.state.pool.fetch("SELECT * FROM quotas WHERE team = $1", who.team)
    return {"items": [_view(r) for r in rows]}


@router.put("/{team}", response_model=QuotaOut, responses=WITH_BODY, summary="Set a team's quota (admin)")
async def set_quota(request: Request, body: QuotaIn, team: str = TEAM, who: Principal = Depends(require("admin"))):
    app = request.app.state
    levels = [lv.name for lv in app.config.strategies.priority_scheduling.levels]
    unknown = [p for p in body.allowed_priorities or [] if p not in levels]
    if unknown:
        return field_errors(
            [
                {
                    "loc": ["body", "allowed_priorities"],
                    "msg": f"unknown priority level(s) {unknown}; levels are {levels}",
                }
            ]
        )
    async with app.pool.acquire() as conn, conn.transaction():
        old = await conn.fetchrow("SELECT * FROM quotas WHERE team = $1 FOR UPDATE", team)
        row = await conn.fetchrow(
            "INSERT INTO quotas (team, max_gpus, max_running_jobs, allowed_priorities, over_quota, updated_by,"
            " updated_at, max_gpus_per_user, max_running_jobs_per_user) VALUES ($1, $2, $3, $4, $5, $6, now(), $7, $8)"
            " ON CONFLICT (team) DO UPDATE SET max_gpus = $2, max_running_jobs = $3, allowed_priorities = $4,"
            " over_quota = $5, updated_by = $6, updated_at = now(), max_gpus_per_user = $7,"
            " max_running_jobs_per_user = $8 RETURNING *",
            team,
            body.max_gpus,
            body.max_running_jobs,
            body.allowed_priorities,
            body.over_quota,
            who.actor,
            body.max_gpus_per_user,
            body.max_running_jobs_per_user,
        )
        changes = diff(_document(old), _document(row))
        await record(
            app,
            who,
            "quota.updated",
            f"{who.name} set the quota of team {team}: "
            + (", ".join(f"{c['path']} {c['old']} -> {c['new']}" for c in changes) or "no change"),
            action="set_quota",
            data={"team": team, "diff": changes, "quota": _document(row)},
        )
    return _view(row)


@router.delete(
    "/{team}", status_code=204, responses=AUTHENTICATED | NOT_FOUND, summary="Remove a team's quota: no limits (admin)"
)
async def delete_quota(request: Request, team: str = TEAM, who: Principal = Depends(require("admin"))):
    app = request.app.state
    async with app.pool.acquire() as conn, conn.transaction():
        old = await conn.fetchrow("DELETE FROM quotas WHERE team = $1 RETURNING *", team)
        if old is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"team {team} has no quota")
        await record(
            app,
            who,
            "quota.removed",
            f"{who.name} removed the quota of team {team}",
            action="remove_quota",
            data={"team": team, "diff": diff(_document(old), {}), "quota": None},
        )
