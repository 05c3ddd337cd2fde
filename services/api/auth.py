"""Bearer API tokens: created once, stored only as a hash, checked on every call."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import asyncpg
from fastapi import HTTPException, Request, status

ROLES = ("user", "operator", "admin")
TOKEN_PREFIX = "adc_"


@dataclass(frozen=True)
class Principal:
    token_id: str
    name: str
    role: str
    team: str

    @property
    def actor(self) -> str:
        return f"{self.name} ({self.role}, team {self.team})"

    @property
    def sees_all(self) -> bool:
        return self.role in ("operator", "admin")

    def may_act_on_team(self, team: str) -> bool:
        return self.sees_all or self.team == team


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_token(
    conn: asyncpg.Connection | asyncpg.Pool, name: str, role: str, team: str, ttl_days: float | None = None,
) -> tuple[str, str]:
    """Store a new token; return (token id, secret). The secret is shown once and never kept."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {list(ROLES)}, got {role!r}")
    token_id = "t" + secrets.token_hex(6)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = datetime.now(timezone.utc) + timedelta(days=ttl_days) if ttl_days else None
    await conn.execute(
        "INSERT INTO api_tokens (id, token_hash, name, role, team, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
        token_id, hash_token(secret), name, role, team, expires,
    )
    return token_id, secret


_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


async def authenticate(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers=_UNAUTHORIZED)
    row = await request.app.state.pool.fetchrow(
        "SELECT id, name, role, team, expires_at, revoked_at FROM api_tokens WHERE token_hash = $1",
        hash_token(secret.strip()),
    )
    if row is None or row["revoked_at"] is not None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid token", headers=_UNAUTHORIZED)
    if row["expires_at"] is not None and row["expires_at"] <= datetime.now(timezone.utc):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "token expired", headers=_UNAUTHORIZED)
    return Principal(row["id"], row["name"], row["role"], row["team"])


def require(*roles: str):
    """A dependency that admits only the given roles (403 for the others)."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")

    async def check(request: Request) -> Principal:
        who = await authenticate(request)
        if who.role not in roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"needs role {' or '.join(roles)}; you are {who.role}")
        return who

    return check
