"""Refusing bad input at the edge, each problem named by field: oversized bodies (413); NUL
characters in the URL, a lone UTF-16 surrogate in a JSON body, unknown or repeated query parameters, values Postgres cannot store in
jsonb (NUL in a string, NaN, infinity, a lone UTF-16 surrogate), and bodies whose types are only nearly
right (422)."""

from __future__ import annotations

import json
import math
from typing import Any, get_args, get_origin
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.specs.spec_bounds import printable_key, unicode_problem

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_STRICT_PASS = "adc-strict-pass"


class StrictBody(BaseModel):
    """A request body: unknown fields refused, and no coercion anywhere inside it, nested config
    models included (false is not 0, "2" is not 2), so what the schema says is what is accepted."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _strict_all_the_way_down(cls, data: Any, handler, info: ValidationInfo) -> Any:
        if info.context and info.context.get(_STRICT_PASS):
            return handler(data)
        return cls.model_validate(data, strict=True, context={_STRICT_PASS: True})


def _invalid_unicode(body: bytes) -> list[dict[str, Any]]:
    """Where a JSON body holds a lone UTF-16 surrogate (`"\\ud800"`), which no route could store or echo.
    Only a body with such an escape is decoded here; the route decodes (and reports) the rest."""
    if b"\\ud" not in body and b"\\uD" not in body:
        return []
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    stack: list[tuple[Any, tuple]] = [(doc, ("body",))]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, str) and (why := unicode_problem(value)):
            return [{"type": "invalid", "loc": list(loc), "msg": why}]
        if isinstance(value, dict):
            for key, item in value.items():
                if why := unicode_problem(key):
                    return [{"type": "invalid", "loc": [*loc, printable_key(key)], "msg": f"key {why}"}]
                stack.append((item, (*loc, key)))
        elif isinstance(value, list):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
    return []


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
                problems.append(
                    {
                        "type": "invalid",
                        "loc": ["query", name.replace("\x00", "")],
                        "msg": "NUL characters are not allowed",
                    }
                )
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
        if problems := _invalid_unicode(body):
            return await JSONResponse({"detail": problems}, status_code=422)(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


_declared_query: dict[int, tuple[frozenset[str], frozenset[str]]] = {}


def _is_multi(annotation: Any) -> bool:
    """Whether a parameter takes several values (list[str], list[str] | None, ...)."""
    if get_origin(annotation) in (list, tuple, set, frozenset):
        return True
    return any(_is_multi(arg) for arg in get_args(annotation))


def _declared(dependant, names: set[str], multi: set[str]) -> None:
    for param in dependant.query_params:
        names.add(param.alias)
        if _is_multi(param.field_info.annotation):
            multi.add(param.alias)
    for sub in dependant.dependencies:
        _declared(sub, names, multi)


def _query_names(route) -> tuple[frozenset[str], frozenset[str]]:
    """(every query parameter the route declares, those that may repeat)."""
    key = id(route)
    if key not in _declared_query:
        names: set[str] = set()
        multi: set[str] = set()
        if (dependant := getattr(route, "dependant", None)) is not None:
            _declared(dependant, names, multi)
        _declared_query[key] = (frozenset(names), frozenset(multi))
    return _declared_query[key]


async def known_query_only(request: Request) -> None:
    """An app-wide dependency: a query parameter the route does not declare is a typo
    (`?stauts=running` would otherwise silently list everything), and one given twice is
    ambiguous; both are refused by name."""
    route = request.scope.get("route")
    if route is None:
        return
    known, multi = _query_names(route)
    given = [name for name, _ in request.query_params.multi_items()]
    problems = [
        {
            "type": "invalid",
            "loc": ("query", name),
            "msg": f"unknown query parameter; this operation takes {sorted(known) or 'none'}",
        }
        for name in sorted(set(given) - known)
    ]
    problems += [
        {"type": "invalid", "loc": ("query", name), "msg": "given more than once"}
        for name in sorted({n for n in given if given.count(n) > 1 and n in known and n not in multi})
    ]
    if problems:
        raise RequestValidationError(problems)


def unstorable(value: Any, loc: tuple = ()) -> list[dict[str, Any]]:
    """Every place in a decoded document that jsonb cannot hold, as {"loc", "msg"}: NUL in a
    string, NaN or infinity, and what YAML decodes but JSON has no word for (dates, binary)."""
    problems: list[dict[str, Any]] = []
    if isinstance(value, str):
        if "\x00" in value:
            problems.append({"loc": list(loc), "msg": "NUL characters are not allowed"})
        if why := unicode_problem(value):
            problems.append({"loc": list(loc), "msg": why})
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
                problems.append({"loc": [*loc, printable_key(key)], "msg": "NUL characters are not allowed in keys"})
            elif why := unicode_problem(key):
                problems.append({"loc": [*loc, printable_key(key)], "msg": f"key {why}"})
            else:
                problems += unstorable(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problems += unstorable(item, (*loc, i))
    else:
        problems.append({"loc": list(loc), "msg": f"a {type(value).__name__} is not a JSON value; quote it"})
    return problems
