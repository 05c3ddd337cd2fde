"""Pausing and resuming the controller (operators, admins): while paused the decider issues no
new decisions; jobs already running keep running.

The flag is the one row of `controller_state` (migration 005). How the decider honours it:
at the start of every pass it reads `SELECT paused FROM controller_state` and, when true,
skips deciding (a missing table or row means not paused). To react at once rather than at
the next interval it may also watch the audit subject (`<prefix>.audit`) for
`controller.paused` / `controller.resumed` events; those are wake-ups, the row is the truth.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from services.api.audit_trail import record
from services.api.auth import OPERATORS, Principal, authenticate, require
from services.api.errors import AUTHENTICATED, WITH_BODY
from services.api.request_limits import StrictBody

router = APIRouter(prefix="/v1/controller", tags=["controller"])


class ControllerChange(StrictBody):
    reason: str | None = Field(None, max_length=500, pattern=r"^[^\x00]*$", description="why, for the audit log")


class ControllerState(BaseModel):
    paused: bool
    reason: str | None
    updated_by: str | None
    updated_at: str


def _view(row) -> dict[str, Any]:
    return {
        "paused": row["paused"],
        "reason": row["reason"],
        "updated_by": row["updated_by"],
        "updated_at": row["updated_at"].isoformat(),
    }


@router.get(
    "",
    response_model=ControllerState,
    responses=AUTHENTICATED,
    summary="Whether the controller is paused, by whom and why",
)
async def controller_state(request: Request, _: Principal = Depends(authenticate)):
    return _view(await request.app.state.pool.fetchrow("SELECT * FROM controller_state"))


async def _set(request: Request, who: Principal, paused: bool, body: ControllerChange | None) -> dict[str, Any]:
    app = request.app.state
    verb = "paused" if paused else "resumed"
    why = (body.reason if body else None) or f"{verb} by {who.name}"
    async with app.pool.acquire() as conn, conn.transaction():
        before = await conn.fetchrow("SELECT * FROM controller_state FOR UPDATE")
        row = await conn.fetchrow(
            "UPDATE controller_state SET paused = $1, reason = $2, updated_by = $3, updated_at = now() RETURNING *",
            paused,
            why,
            who.actor,
        )
        note = "" if before["paused"] != paused else f" (it was already {verb})"
        await record(
            app,
            who,
            f"controller.{verb}",
            f"{who.name} {verb} the controller{note}: {why}",
            action="pause" if paused else "resume",
            data={"paused": paused, "was_paused": before["paused"]},
        )
    return _view(row)


@router.post(
    "/pause",
    response_model=ControllerState,
    responses=WITH_BODY,
    summary="Stop the decider from making new decisions (operators, admins)",
)
async def pause_controller(
    request: Request, body: ControllerChange | None = None, who: Principal = Depends(require(*OPERATORS))
):
    return await _set(request, who, True, body)


@router.post(
    "/resume",
    response_model=ControllerState,
    responses=WITH_BODY,
    summary="Let the decider decide again (operators, admins)",
)
async def resume_controller(
    request: Request, body: ControllerChange | None = None, who: Principal = Depends(require(*OPERATORS))
):
    return await _set(request, who, False, body)
