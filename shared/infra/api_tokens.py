"""API tokens at rest: each is stored only as its sha256, with a role and a team. The api checks
them (services/api/auth.py); the api and the CLI's bootstrap (`adc up`, `adc token create
--database`) create them here, so neither reaches into the other's code."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

import asyncpg

ROLES = ("user", "operator", "admin")
TOKEN_PREFIX = "adc_"


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_token(
    conn: asyncpg.Connection | asyncpg.Pool,
    name: str,
    role: str,
    team: str,
    ttl_days: float | None = None,
) -> tuple[str, str]:
    """Store a new token; return (token id, secret). The secret is shown once and never kept."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {list(ROLES)}, got {role!r}")
    token_id = "t" + secrets.token_hex(6)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = datetime.now(UTC) + timedelta(days=ttl_days) if ttl_days else None
    await conn.execute(
        "INSERT INTO api_tokens (id, token_hash, name, role, team, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
        token_id,
        hash_token(secret),
        name,
        role,
        team,
        expires,
    )
    return token_id, secret
