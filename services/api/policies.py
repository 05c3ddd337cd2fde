"""The policy document (the `controller`, `strategies` and `schedules` parts of adc_config.yaml): read by
operators and admins, replaced and reloaded by admins. Every version is kept in `policies`;
every change is audited with its diff.

How the decider picks changes up: it watches the audit subject (`<prefix>.audit`) for
`policy.updated` and `policy.reloaded` events and then reads the newest row of `policies`
(`SELECT version, body FROM policies ORDER BY version DESC LIMIT 1`); no row means the
seed configuration. The event is only a wake-up; the table is the truth.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.api.audit_trail import diff, record
from services.api.auth import OPERATORS, Principal, require
from services.api.errors import AUTHENTICATED, CONFLICT, WITH_BODY, field_errors
from services.api.request_limits import StrictBody, unstorable
from shared.infra.config import ConfigError, ControllerConfig, Schedule, Strategies, apply_policy, moved_oom_retries

router = APIRouter(prefix="/v1/policies", tags=["policies"])


class PolicyDocument(BaseModel):
    """Typed with the same models as adc_config.yaml; `update_policy` then makes the same whole check
    the decider makes before applying it (`shared.infra.config.apply_policy`): a misspelt strategy, a
    schedule that breaks a rule's section, ... are refused naming the field."""

    model_config = ConfigDict(extra="forbid")
    controller: ControllerConfig = ControllerConfig()
    strategies: Strategies = Strategies()
    schedules: list[Schedule] = Field(default_factory=list, max_length=100)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        # Rule-plugin sections are free-form; they must still fit in jsonb.
        if problems := unstorable(data):
            raise ValueError("; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems))
        return moved_oom_retries(data)


class PolicyUpdate(StrictBody):
    policy: PolicyDocument
    reason: str = Field(min_length=1, max_length=500, pattern=r"^[^\x00]*$", description="why, for the audit log")
    expected_version: int | None = Field(
        None, ge=0, le=2**62, description="refuse (409) unless this is still the current version"
    )


class PolicyReload(StrictBody):
    reason: str | None = Field(None, max_length=500, pattern=r"^[^\x00]*$")


class PolicyOut(BaseModel):
    version: int = Field(description="0: the seed configuration, never changed through the API")
    policy: dict[str, Any]
    updated_by: str | None
    reason: str | None
    created_at: str | None


class PolicyChange(PolicyOut):
    diff: list[dict[str, Any]]


class PolicyHistory(BaseModel):
    items: list[PolicyOut]


def _seed(config) -> dict[str, Any]:
    return {
        "controller": config.controller.model_dump(mode="json"),
        "strategies": config.strategies.model_dump(mode="json"),
        "schedules": [s.model_dump(mode="json") for s in config.schedules],
    }


def _view(row) -> dict[str, Any]:
    return {
        "version": row["version"],
        "policy": row["body"],
        "updated_by": row["updated_by"],
        "reason": row["reason"],
        "created_at": row["created_at"].isoformat(),
    }


async def current_policy(conn, config) -> dict[str, Any]:
    row = await conn.fetchrow("SELECT * FROM policies ORDER BY version DESC LIMIT 1")
    if row is None:
        return {
            "version": 0,
            "policy": _seed(config),
            "updated_by": None,
            "reason": "seed configuration",
            "created_at": None,
        }
    return _view(row)


@router.get("", response_model=PolicyOut, responses=AUTHENTICATED, summary="The current policy (operators, admins)")
async def get_policy(request: Request, _: Principal = Depends(require(*OPERATORS))):
    return await current_policy(request.app.state.pool, request.app.state.config)


@router.get(
    "/history",
    response_model=PolicyHistory,
    responses=AUTHENTICATED,
    summary="Earlier policy versions, newest first (operators, admins)",
)
async def policy_history(
    request: Request, _: Principal = Depends(require(*OPERATORS)), limit: int = Query(20, ge=1, le=200)
):
    rows = await request.app.state.pool.fetch("SELECT * FROM policies ORDER BY version DESC LIMIT $1", limit)
    return {"items": [_view(r) for r in rows]}


@router.put(
    "",
    response_model=PolicyChange,
    responses=WITH_BODY | CONFLICT,
    summary="Replace the policy (admin); audited with its diff",
)
async def update_policy(request: Request, body: PolicyUpdate, who: Principal = Depends(require("admin"))):
    app = request.app.state
    new = body.policy.model_dump(mode="json")
    try:
        apply_policy(app.config, new)
    except ConfigError as err:
        return field_errors([{"loc": ["body", "policy", *path], "msg": msg} for path, msg in err.fields()])
    async with app.pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('adc-policies'))")  # one writer at a time
        old = await current_policy(conn, app.config)
        if body.expected_version is not None and body.expected_version != old["version"]:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"the policy is at version {old['version']}, not {body.expected_version}; re-read it",
            )
        changes = diff(old["policy"], new)
        row = await conn.fetchrow(
            "INSERT INTO policies (body, updated_by, reason) VALUES ($1, $2, $3) RETURNING *",
            new,
            who.actor,
            body.reason,
        )
        summary = ", ".join(f"{c['path']} {c['old']} -> {c['new']}" for c in changes[:5]) or "no change"
        more = f" and {len(changes) - 5} more" if len(changes) > 5 else ""
        await record(
            app,
            who,
            "policy.updated",
            f"{who.name} set policy version {row['version']}: {summary}{more} ({body.reason})",
            action="update_policy",
            data={"version": row["version"], "previous_version": old["version"], "diff": changes},
        )
    return _view(row) | {"diff": changes}


@router.post(
    "/reload",
    status_code=202,
    response_model=PolicyOut,
    responses=WITH_BODY,
    summary="Ask the decider to re-read the current policy (admin)",
)
async def reload_policy(request: Request, body: PolicyReload | None = None, who: Principal = Depends(require("admin"))):
    app = request.app.state
    current = await current_policy(app.pool, app.config)
    why = body.reason if body and body.reason else "reload requested"
    await record(
        app,
        who,
        "policy.reloaded",
        f"{who.name} asked the decider to reload policy version {current['version']} ({why})",
        action="reload_policy",
        data={"version": current["version"]},
    )
    return current
