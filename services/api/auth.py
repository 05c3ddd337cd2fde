"""Bearer API tokens: created once, stored only as a hash, checked on every call.

`AuthenticationGate` checks the token of every request before routing, so a route that
forgets a dependency is still authenticated (and a malformed body from a stranger gets 401,
not a parse error). Routes then declare who may call them with `authenticate` (any role) or
`require(*roles)`; both read the principal the gate found.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.cookies import CookieError, SimpleCookie

import asyncpg
from fastapi import Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

ROLES = ("user", "operator", "admin")
TOKEN_PREFIX = "adc_"
# Probes, scrapers and the schema itself answer without a token; nothing else does.
PUBLIC_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/ui",
        "/ui/logout",
    }
)
PUBLIC_PREFIXES = ("/ui/static/",)  # the dashboard's page and assets hold no data
# The dashboard's session (services/api/dashboard.py): the token in an HttpOnly SameSite=Strict cookie,
# accepted for reads only, so a cross-site request can change nothing.
SESSION_COOKIE = "adc_session"
COOKIE_METHODS = frozenset({"GET", "HEAD"})


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _session_cookie(headers: list[tuple[bytes, bytes]]) -> str:
    for key, value in headers:
        if key == b"cookie":
            jar = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                return ""
            if SESSION_COOKIE in jar:
                return jar[SESSION_COOKIE].value
    return ""


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


class Unauthenticated(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


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


async def principal_for(pool: asyncpg.Pool, authorization: str) -> Principal:
    """The principal an Authorization header names; raises Unauthenticated saying why not."""
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise Unauthenticated("missing bearer token")
    if len(secret) > 200 or not secret.isprintable():
        raise Unauthenticated("invalid token")
    row = await pool.fetchrow(
        "SELECT id, name, role, team, expires_at, revoked_at FROM api_tokens WHERE token_hash = $1",
        hash_token(secret),
    )
    return _principal(row)


async def principal_for_token_id(pool: asyncpg.Pool, token_id: str) -> Principal:
    """The same check again, by id: for a stream that outlives the request that opened it."""
    row = await pool.fetchrow(
        "SELECT id, name, role, team, expires_at, revoked_at FROM api_tokens WHERE id = $1", token_id
    )
    return _principal(row)


def token_problem(row) -> str | None:
    """Why a token's row (id, expires_at, revoked_at) no longer authenticates, or None while it does."""
    if row is None:
        return "invalid token"
    if row["revoked_at"] is not None:
        return "token revoked"
    if row["expires_at"] is not None and row["expires_at"] <= datetime.now(UTC):
        return "token expired"
    return None


def _principal(row) -> Principal:
    if (why := token_problem(row)) is not None:
        raise Unauthenticated(why)
    return Principal(row["id"], row["name"], row["role"], row["team"])


_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


class AuthenticationGate:
    """ASGI middleware: every non-public request carries a valid token, or gets 401 here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_public(scope["path"]):
            return await self.app(scope, receive, send)
        authorization = ""
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
        if not authorization and scope["method"] in COOKIE_METHODS and (secret := _session_cookie(scope["headers"])):
            authorization = f"Bearer {secret}"
        try:
            principal = await principal_for(scope["app"].state.pool, authorization)
        except Unauthenticated as err:
            response = JSONResponse({"detail": err.why}, status.HTTP_401_UNAUTHORIZED, headers=_UNAUTHORIZED)
            return await response(scope, receive, send)
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as err:
            log.warning("cannot check a token, Postgres unreachable: %s", err)
            response = JSONResponse({"detail": "Postgres unreachable; try again"}, status.HTTP_503_SERVICE_UNAVAILABLE)
            return await response(scope, receive, send)
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


# Declares the scheme in the OpenAPI document (the docs' Authorize button); the gate does the checking.
_bearer_scheme = HTTPBearer(auto_error=False, description="an ADC API token: `adc token create`")


async def authenticate(
    request: Request,
    _credentials: HTTPAuthorizationCredentials | None = Depends(_bearer_scheme),
) -> Principal:
    """Any valid token. The gate has already checked it; an app without the gate checks here."""
    principal = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    try:
        principal = await principal_for(request.app.state.pool, request.headers.get("authorization", ""))
    except Unauthenticated as err:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, err.why, headers=_UNAUTHORIZED) from None
    request.state.principal = principal
    return principal


def require(*roles: str):
    """A dependency that admits only the given roles (403 for the others)."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")

    async def check(who: Principal = Depends(authenticate)) -> Principal:
        if who.role not in roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"needs role {' or '.join(roles)}; you are {who.role}")
        return who

    return check


OPERATORS = ("operator", "admin")
