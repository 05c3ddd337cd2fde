"""API tokens over the API (admin): create (the secret is in that one answer and nowhere else,
not in the audit log), list, revoke; and `/v1/me`, which any token may ask about itself."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from pydantic import BaseModel, Field

from services.api.audit_trail import record
from services.api.auth import Principal, authenticate, require
from services.api.errors import AUTHENTICATED, CONFLICT, NOT_FOUND, WITH_BODY
from services.api.quotas import TEAM_PATTERN
from services.api.request_limits import StrictBody
from shared.infra.api_tokens import create_token

router = APIRouter(tags=["tokens"])

NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._@-]{0,63}$"
TOKEN_ID = Path(max_length=32, pattern=r"^[a-z0-9]+$", description="a token id, e.g. t0123456789ab")


class TokenCreate(StrictBody):
    name: str = Field(pattern=NAME_PATTERN, description="who or what holds it, e.g. ci-bot")
    role: Literal["user", "operator", "admin"] = "user"
    team: str = Field("default", pattern=TEAM_PATTERN)
    ttl_days: float | None = Field(None, gt=0, le=3650, description="expire after this many days; null: never")


class TokenOut(BaseModel):
    id: str
    name: str
    role: str
    team: str
    created_at: str
    expires_at: str | None
    revoked_at: str | None


class TokenCreated(TokenOut):
    secret: str = Field(description="shown once: ADC keeps only its hash")


class TokenList(BaseModel):
    items: list[TokenOut]


class Me(BaseModel):
    token_id: str
    name: str
    role: str
    team: str


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def _view(row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "role": row["role"],
        "team": row["team"],
        "created_at": row["created_at"].isoformat(),
        "expires_at": _iso(row["expires_at"]),
        "revoked_at": _iso(row["revoked_at"]),
    }


@router.get("/v1/me", response_model=Me, responses=AUTHENTICATED, summary="The caller's own token: name, role, team")
async def whoami(who: Principal = Depends(authenticate)):
    return {"token_id": who.token_id, "name": who.name, "role": who.role, "team": who.team}


@router.get("/v1/tokens", response_model=TokenList, responses=AUTHENTICATED, summary="Tokens, without secrets (admin)")
async def list_tokens(request: Request, _: Principal = Depends(require("admin")), include_revoked: bool = Query(False)):
    sql = "SELECT * FROM api_tokens" + ("" if include_revoked else " WHERE revoked_at IS NULL") + " ORDER BY created_at"
    return {"items": [_view(r) for r in await request.app.state.pool.fetch(sql)]}


@router.post(
    "/v1/tokens",
    status_code=201,
    response_model=TokenCreated,
    responses=WITH_BODY,
    summary="Create a token (admin); its secret is in this answer only",
)
async def new_token(request: Request, body: TokenCreate, who: Principal = Depends(require("admin"))):
    app = request.app.state
    async with app.pool.acquire() as conn, conn.transaction():
        token_id, secret = await create_token(conn, body.name, body.role, body.team, body.ttl_days)
        row = await conn.fetchrow("SELECT * FROM api_tokens WHERE id = $1", token_id)
        await record(
            app,
            who,
            "token.created",
            f"{who.name} created token {token_id} for {body.name} (role {body.role}, team {body.team})",
            action="create_token",
            data={
                "token_id": token_id,
                "name": body.name,
                "role": body.role,
                "team": body.team,
                "expires_at": _iso(row["expires_at"]),
            },
        )
    return _view(row) | {"secret": secret}


@router.post(
    "/v1/tokens/{token_id}/revoke",
    response_model=TokenOut,
    responses=WITH_BODY | NOT_FOUND | CONFLICT,
    summary="Revoke a token at once (admin)",
)
async def revoke_token(request: Request, token_id: str = TOKEN_ID, who: Principal = Depends(require("admin"))):
    app = request.app.state
    async with app.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow("SELECT * FROM api_tokens WHERE id = $1 FOR UPDATE", token_id)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id!r}")
        if row["revoked_at"] is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, f"token {token_id} was already revoked")
        row = await conn.fetchrow("UPDATE api_tokens SET revoked_at = now() WHERE id = $1 RETURNING *", token_id)
        await record(
            app,
            who,
            "token.revoked",
            f"{who.name} revoked token {token_id} of {row['name']}",
            action="revoke_token",
            data={"token_id": token_id, "name": row["name"], "role": row["role"], "team": row["team"]},
        )
    app.tokens.forget()  # this process at once; the others at the commit's notification (migration 025)
    return _view(row)
