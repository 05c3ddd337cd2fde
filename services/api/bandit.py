"""The decider's bandit (operators, admins): what it is doing, what it logged, and a reset.

The state is the `bandit_state` row the leading decider writes (migration 022): the mode it runs
in, its decisions, mean reward against the rules' baseline (the mean reward of decisions that took
the rules' own arm), exploration spent, the model's version; and the same figures for each
decision point (placement, memory, knobs), each from its own row. The log is each `bandit.decision`
audit event joined by decision id to its `bandit.reward`, with the stored model, for off-policy
evaluation (`adc bandit evaluate`, which computes it on the caller's side). A reset (admins) only
asks: the decider carries it out at its next write of the model and audits `bandit.reset`.
"""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import Field

from services.api.audit_trail import record
from services.api.auth import OPERATORS, Principal, require
from services.api.errors import AUTHENTICATED, NOT_FOUND, WITH_BODY
from services.api.request_limits import StrictBody

router = APIRouter(prefix="/v1/bandit", tags=["bandit"])
POINT = "placement"
POINTS = ("placement", "memory", "knobs")  # the decision points, each its own row
SUMMARY = ("model_version", "decisions", "acted", "explored", "rewarded", "mean_reward", "rules_mean_reward")


class ResetRequest(StrictBody):
    reason: str | None = Field(None, max_length=500, pattern=r"^[^\x00]*$", description="why, for the audit log")


def _status(row) -> dict[str, Any]:
    if row is None:
        return {"point": POINT, "stored": False, "mode": None, "model_version": None}
    stats = dict(row["stats"] or {})
    return {
        "point": row["point"],
        "stored": True,
        "mode": stats.pop("mode", None),
        "model_version": row["version"],
        "fence": row["fence"],
        "writer": row["writer"],
        "updated_at": row["updated_at"].isoformat(),
        "reset_requested_at": row["reset_requested_at"].isoformat() if row["reset_requested_at"] else None,
        "reset_requested_by": row["reset_requested_by"],
        **{k: v for k, v in stats.items() if k != "model_version"},
    }


def _summary(point: str, row) -> dict[str, Any]:
    """One decision point: decisions, acted, exploration spent, mean reward against the rules'."""
    if row is None:
        return {"stored": False} | dict.fromkeys(SUMMARY)
    stats = dict(row["stats"] or {})
    return {"stored": True} | {k: stats.get(k) for k in SUMMARY} | {"model_version": row["version"]}


@router.get("", responses=AUTHENTICATED, summary="The bandit's mode, decisions, rewards and exploration (operators)")
async def bandit_status(request: Request, _: Principal = Depends(require(*OPERATORS))):
    rows = await request.app.state.pool.fetch("SELECT * FROM bandit_state WHERE point = ANY($1::text[])", list(POINTS))
    by_point = {row["point"]: row for row in rows}
    return _status(by_point.get(POINT)) | {"points": {p: _summary(p, by_point.get(p)) for p in POINTS}}


@router.get(
    "/log", responses=AUTHENTICATED, summary="Logged bandit decisions with their rewards, and the model (operators)"
)
async def bandit_log(
    request: Request,
    limit: int = Query(5000, ge=1, le=50_000, description="the newest this many decisions"),
    point: str = Query(POINT, pattern="^(placement|memory|knobs)$", description="the decision point's model"),
    _: Principal = Depends(require(*OPERATORS)),
):
    pool = request.app.state.pool
    rows = await pool.fetch(
        "SELECT d.decision_id, d.job_id, d.ts, d.data, r.data AS reward FROM ("
        "  SELECT decision_id, job_id, ts, data FROM audit_events WHERE kind = 'bandit.decision'"
        "  ORDER BY id DESC LIMIT $1) d"
        " LEFT JOIN audit_events r ON r.kind = 'bandit.reward' AND r.decision_id = d.decision_id"
        " ORDER BY d.ts",
        limit,
    )
    state = await pool.fetchrow("SELECT model, version, stats FROM bandit_state WHERE point = $1", point)
    items = []
    for row in rows:
        reward = (row["reward"] or {}).get("reward")
        items.append(
            {**dict(row["data"] or {}), "decision_id": row["decision_id"], "job_id": row["job_id"], "reward": reward}
        )
    return {
        "items": items,
        "model": base64.b64encode(bytes(state["model"])).decode() if state else None,
        "model_version": state["version"] if state else None,
        "epsilon": (state["stats"] or {}).get("epsilon") if state else None,
        "act_margin": (state["stats"] or {}).get("act_margin") if state else None,
        "act_after": (state["stats"] or {}).get("act_after") if state else None,
    }


@router.post(
    "/reset",
    responses=WITH_BODY | NOT_FOUND,
    summary="Ask the leading decider to forget what the bandit learned (admins)",
)
async def bandit_reset(request: Request, body: ResetRequest | None = None, who: Principal = Depends(require("admin"))):
    app = request.app.state
    why = (body.reason if body else None) or f"reset by {who.name}"
    async with app.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "UPDATE bandit_state SET reset_requested_at = now(), reset_requested_by = $2 WHERE point = $1 RETURNING *",
            POINT,
            who.actor,
        )
        if row is None:
            raise HTTPException(404, "no bandit model is stored yet: nothing to reset")
        await record(
            app,
            who,
            "bandit.reset_requested",
            f"{who.name} asked for the bandit model (version {row['version']}) to be reset: {why}",
            action="reset",
            data={"point": POINT, "version": row["version"]},
        )
    return _status(row)
