"""Bearer API tokens: created once, stored only as a hash, checked on every call.

`AuthenticationGate` checks the token of every request before routing, so a route that
forgets a dependency is still authenticated (and a malformed body from a stranger gets 401,
not a parse error). Routes then declare who may call them with `authenticate` (any role) or
`require(*roles)`; both read the principal the gate found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.cookies import CookieError, SimpleCookie
from typing import Any

import asyncpg
from fastapi import Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.infra.api_tokens import ROLES, hash_token
from shared.infra.api_tokens import create_token as create_token  # the api's name for it too

log = logging.getLogger(__name__)

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


TOKENS_CHANGED = "adc_api_tokens_changed"  # migration 025: every change to api_tokens NOTIFYs it
TOKEN_CACHE_S = 5.0


class TokenCache:
    """Token rows the api has looked up, kept for at most `ttl_s` so a request need not ask Postgres.

    A revoked or changed token must stop working at once, in every api process, whoever changed it
    (the api, `adc token revoke`, SQL): migration 025 makes each change to `api_tokens` NOTIFY
    `adc_api_tokens_changed` at its commit, and each notification empties the cache. Rows are kept only
    while the api's LISTEN connection is up (`listening`, services/api/audit_feed.py), and a reconnect
    empties the cache too (notifications may have been missed meanwhile); `ttl_s` bounds what a lost
    notification could cost. A lookup that overlapped a change is not kept (the generation moved), as it
    may have read the row from before. Expiry is checked on every use against the row's `expires_at`."""

    def __init__(self, clock, listening: Callable[[], bool], ttl_s: float = TOKEN_CACHE_S, size: int = 10_000) -> None:
        self.clock = clock
        self.listening = listening
        self.ttl_s = ttl_s
        self.size = size
        self._rows: dict[str, tuple[float, Any]] = {}
        self._generation = 0

    def forget(self, *_notification: Any) -> None:
        """Drop every row: a token changed (or changes may have been missed)."""
        self._generation += 1
        self._rows.clear()

    async def row(self, pool: asyncpg.Pool, digest: str):
        if not self.listening():
            if self._rows:
                self.forget()
            return await _token_row(pool, digest)
        now = self.clock.monotonic()
        cached = self._rows.get(digest)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        generation = self._generation
        row = await _token_row(pool, digest)
        if row is not None and generation == self._generation and self.listening():
            if len(self._rows) >= self.size:
                self._rows.clear()  # a flood of distinct valid tokens: start over rather than grow
            self._rows[digest] = (now, row)
        return row


async def _token_row(pool: asyncpg.Pool, digest: str):
    return await pool.fetchrow(
        "SELECT id, name, role, team, expires_at, revoked_at FROM api_tokens WHERE token_hash = $1", digest
    )


async def principal_for(pool: asyncpg.Pool, authorization: str, cache: TokenCache | None = None) -> Principal:
    """The principal an Authorization header names; raises Unauthenticated saying why not."""
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise Unauthenticated("missing bearer token")
    if len(secret) > 200 or not secret.isprintable():
        raise Unauthenticated("invalid token")
    digest = hash_token(secret)
    row = await (cache.row(pool, digest) if cache is not None else _token_row(pool, digest))
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
            state = scope["app"].state
            principal = await principal_for(state.pool, authorization, getattr(state, "tokens", None))
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
        state = request.app.state
        principal = await principal_for(
            state.pool, request.headers.get("authorization", ""), getattr(state, "tokens", None)
        )
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
