"""Long-lived responses (every SSE stream, log follow) stay as authorized as a single request.

A token checked once at connect would otherwise keep a stream open for days after it was
revoked. One watcher per api re-checks the tokens of all open streams together, one query every
`api.stream_recheck_s` (1 s at most), and wakes each stream of a token that is no longer valid:
the stream ends at once, saying why, whether or not it had anything to send. Each token may hold
at most `api.max_streams_per_token` streams at once (429 beyond), so one caller cannot exhaust the
server.

Server-Sent Events go out through sse-starlette's `EventSourceResponse` (`sse_response`): it
encodes each `ServerSentEvent`, sends a keep-alive comment every KEEPALIVE_S (it finds dead clients
and keeps proxies from timing the stream out) and ends the stream when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import HTTPException, Request, status
from sse_starlette import EventSourceResponse, ServerSentEvent

from services.api.auth import Principal, token_problem

log = logging.getLogger(__name__)
DISCONNECT_CHECK_S = 1.0
KEEPALIVE_S = 15.0
SSE_DOC = {200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}}
_TOKENS_SQL = "SELECT id, expires_at, revoked_at FROM api_tokens WHERE id = ANY($1::text[])"


class StreamLimits:
    def __init__(self, recheck_s: float, per_token: int) -> None:
        self.recheck_s = recheck_s
        self.per_token = per_token
        self.open: Counter[str] = Counter()
        self._ended: dict[str, asyncio.Event] = {}  # token -> set once the watcher finds it invalid
        self._why: dict[str, str] = {}
        self._watcher: asyncio.Task | None = None

    def admit(self, who: Principal) -> None:
        """Before answering: 429 when this token already holds its streams."""
        if self.open[who.token_id] >= self.per_token:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                f"this token already holds {self.per_token} open stream(s) "
                "(api.max_streams_per_token); close one first",
            )

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None

    async def _watch(self, pool) -> None:
        """Every recheck_s: the tokens of all open streams, in one query; streams of an invalid one are woken."""
        while True:
            await asyncio.sleep(self.recheck_s)
            tokens = [t for t in self.open if t not in self._why]
            if not tokens:
                continue
            try:
                rows = {r["id"]: r for r in await pool.fetch(_TOKENS_SQL, tokens)}
            except Exception as err:  # noqa: BLE001 - Postgres away: streams go on, checked again next time
                log.warning("cannot re-check the tokens of open streams: %s", err)
                continue
            for token in tokens:
                if (why := token_problem(rows.get(token))) is not None and token in self._ended:
                    self._why[token] = why
                    self._ended[token].set()

    async def guard(
        self, request: Request, who: Principal, chunks: AsyncIterator, ended: Callable[[str], Any]
    ) -> AsyncIterator:
        """`chunks`, ended with `ended(why)` as soon as the watcher finds the token invalid. A client that
        went away is noticed within DISCONNECT_CHECK_S, which frees its slot."""
        token = who.token_id
        if self.open[token] >= self.per_token:  # lost a race with another stream of this token
            yield ended(f"this token already holds {self.per_token} open stream(s)")
            await chunks.aclose()
            return
        self.open[token] += 1
        revoked = self._ended.setdefault(token, asyncio.Event())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch(request.app.state.pool))
        queue: asyncio.Queue = asyncio.Queue(maxsize=1)

        async def pump() -> None:
            try:
                async for chunk in chunks:
                    await queue.put(chunk)
                await queue.put(_END)
            except Exception as err:
                await queue.put(err)

        pumping = asyncio.create_task(pump())
        stop = asyncio.ensure_future(revoked.wait())
        getter: asyncio.Future | None = None
        try:
            while True:
                getter = getter or asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, stop}, timeout=DISCONNECT_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
                if stop.done():
                    yield ended(self._why.get(token, "token no longer valid"))
                    return
                if not getter.done():
                    if await request.is_disconnected():
                        return
                    continue
                item, getter = getter.result(), None
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            # Release first, synchronously: under a cancelled (anyio) scope every await below raises again.
            self.open[token] -= 1
            if not self.open[token]:
                del self.open[token]
                self._ended.pop(token, None)
                self._why.pop(token, None)
            for task in (getter, stop, pumping):
                if task is not None:
                    task.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            await chunks.aclose()


_END = object()


def sse_ended(why: str) -> ServerSentEvent:
    """The last message of an SSE stream that the server ends; `retry` far off, as a client that
    reconnects at once would only be refused again."""
    return ServerSentEvent(json.dumps({"reason": why}), event="end", retry=60000)


def sse_response(request: Request, who: Principal, events: AsyncIterator[ServerSentEvent]) -> EventSourceResponse:
    """`events` as a stream under the api's limits: ended with `sse_ended` once the token is invalid."""
    limits: StreamLimits = request.app.state.streams
    return EventSourceResponse(
        limits.guard(request, who, events, sse_ended),
        ping=KEEPALIVE_S,
        ping_message_factory=lambda: ServerSentEvent(comment="keepalive"),
    )
