"""Refusing bad input at the edge: oversized bodies (413), NUL characters in the URL (422), and
values Postgres cannot store in jsonb (NUL in a string, NaN or infinity), named by field."""
from __future__ import annotations

import math
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse({"detail": f"body larger than {limit} bytes (api.max_body_bytes)"}, status_code=413)


def _nul_in_url(scope: Scope) -> list[dict[str, Any]]:
    problems = []
    if "\x00" in scope["path"]:
        problems.append({"type": "invalid", "loc": ["path"], "msg": "NUL characters are not allowed"})
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query or "\x00" in query:
        for name, value in parse_qsl(query, keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                problems.append({"type": "invalid", "loc": ["query", name.replace("\x00", "")],
                                 "msg": "NUL characters are not allowed"})
    return problems


class RequestLimits:
    """ASGI middleware. Reads at most `max_body_bytes` of a body and replays it to the route,
    so no route ever holds an oversized body; a declared Content-Length over the limit is
    refused before a byte is read."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if problems := _nul_in_url(scope):
            return await JSONResponse({"detail": problems}, status_code=422)(scope, receive, send)
        if scope["method"] not in _BODY_METHODS:
            return await self.app(scope, receive, send)
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await _too_large(self.limit)(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _too_large(self.limit)(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def unstorable(value: Any, loc: tuple = ()) -> list[dict[str, Any]]:
    """Every place in a decoded document that jsonb cannot hold, as {"loc", "msg"}: NUL in a
    string, NaN or infinity, and what YAML decodes but JSON has no word for (dates, binary)."""
    problems: list[dict[str, Any]] = []
    if isinstance(value, str):
        if "\x00" in value:
            problems.append({"loc": list(loc), "msg": "NUL characters are not allowed"})
    elif isinstance(value, bool) or value is None or isinstance(value, int):
        pass
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append({"loc": list(loc), "msg": f"{value} is not a finite number"})
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append({"loc": [*loc, str(key)], "msg": "keys must be strings"})
            elif "\x00" in key:
                problems.append({"loc": [*loc, key.replace("\x00", "\\0")], "msg": "NUL characters are not allowed in keys"})
            else:
                problems += unstorable(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problems += unstorable(item, (*loc, i))
    else:
        problems.append({"loc": list(loc), "msg": f"a {type(value).__name__} is not a JSON value; quote it"})
    return problems
