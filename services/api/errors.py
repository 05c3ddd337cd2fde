"""The errors the API answers with: their shapes (documented once, so every operation in the
OpenAPI document lists them) and the handlers that turn an outage into 503 instead of 500."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import nats.errors
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class Problem(BaseModel):
    detail: str


class FieldProblem(BaseModel):
    model_config = ConfigDict(extra="allow")  # FastAPI adds input/ctx to its own
    type: str
    loc: list[str | int]
    msg: str


class ValidationProblem(BaseModel):
    detail: list[FieldProblem]


def _problem(description: str, model: type[BaseModel] = Problem) -> dict[str, Any]:
    return {"model": model, "description": description}


UNAUTHENTICATED = {401: _problem("no token, or a malformed, unknown, expired or revoked one")}
FORBIDDEN = {403: _problem("the token's role may not do this")}
NOT_FOUND = {404: _problem("no such thing, or not one the caller may see")}
CONFLICT = {409: _problem("the request conflicts with the current state")}
TOO_LARGE = {413: _problem("the body is larger than api.max_body_bytes")}
INVALID = {422: _problem("a field is missing, unknown or wrong; each problem names its field", ValidationProblem)}
UNAVAILABLE = {503: _problem("NATS or Postgres is unreachable; nothing was changed")}

# What any authenticated operation may answer besides its own outcomes.
AUTHENTICATED = UNAUTHENTICATED | FORBIDDEN | INVALID | UNAVAILABLE
WITH_BODY = AUTHENTICATED | TOO_LARGE


def field_errors(errors: list[dict[str, Any]], status_code: int = 422) -> JSONResponse:
    """The same shape FastAPI uses for its own validation errors."""
    return JSONResponse(
        status_code=status_code,
        content={"detail": [{"type": "invalid", "loc": e["loc"], "msg": e["msg"]} for e in errors]},
    )


def install_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body that is not JSON at all with a bare 400; say where, like any other field.
        if err.status_code == 400 and err.detail == "There was an error parsing the body":
            return field_errors([{"loc": ["body"], "msg": "not valid JSON (or not UTF-8 text)"}])
        return await http_exception_handler(request, err)

    app.add_exception_handler(StarletteHTTPException, http_error)

    async def postgres_down(request: Request, err: Exception) -> JSONResponse:
        log.warning("%s %s: Postgres unreachable: %s", request.method, request.url.path, err)
        return JSONResponse({"detail": "Postgres unreachable; nothing was changed"}, status_code=503)

    async def nats_down(request: Request, err: Exception) -> JSONResponse:
        log.warning("%s %s: NATS unreachable: %s", request.method, request.url.path, err)
        return JSONResponse({"detail": "NATS unreachable; nothing was changed"}, status_code=503)

    for exc in (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError):
        app.add_exception_handler(exc, postgres_down)
    app.add_exception_handler(nats.errors.Error, nats_down)
