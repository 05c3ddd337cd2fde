"""Long-lived responses (the audit tail, log follow) stay as authorized as a single request.

A token checked once at connect would otherwise keep a stream open for days after it was
revoked: each stream re-checks its token at least every `api.stream_recheck_s` (30 s at most)
and ends, saying why, once the token is no longer valid. Each token may hold at most
`api.max_streams_per_token` streams at once, so one caller cannot exhaust the server.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import HTTPException, Request, status

from services.api.auth import Principal, Unauthenticated, principal_for_token_id


DISCONNECT_CHECK_S = 1.0


class StreamLimits:
    def __init__(self, recheck_s: float, per_token: int) -> None:
        self.recheck_s = recheck_s
        self.per_token = per_token
        self.open: Counter[str] = Counter()

    def admit(self, who: Principal) -> None:
        """Before answering: 429 when this token already holds its streams."""
        if self.open[who.token_id] >= self.per_token:
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"this token already holds {self.per_token} open stream(s); close one first")

    async def guard(self, request: Request, who: Principal, chunks: AsyncIterator,
                    ended: Callable[[str], Any]) -> AsyncIterator:
        """`chunks`, ended with `ended(why)` once a recheck finds the token invalid (or over the cap).
        The recheck runs on its own clock, whether or not the stream has anything to send; so does
        the check for a client that went away, which frees its slot at once."""
        if self.open[who.token_id] >= self.per_token:  # lost a race with another stream of this token
            yield ended(f"this token already holds {self.per_token} open stream(s)")
            return
        self.open[who.token_id] += 1
        queue: asyncio.Queue = asyncio.Queue(maxsize=1)

        async def pump() -> None:
            try:
                async for chunk in chunks:
                    await queue.put(chunk)
                await queue.put(_END)
            except Exception as err:
                await queue.put(err)

        pumping = asyncio.create_task(pump())
        next_check = time.monotonic() + self.recheck_s
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=min(
                        DISCONNECT_CHECK_S, max(0.0, next_check - time.monotonic())))
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    if time.monotonic() >= next_check:
                        try:
                            await principal_for_token_id(request.app.state.pool, who.token_id)
                        except Unauthenticated as err:
                            yield ended(err.why)
                            return
                        next_check = time.monotonic() + self.recheck_s
                    continue
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            # Release first, synchronously: under a cancelled (anyio) scope every await below raises again.
            self.open[who.token_id] -= 1
            if not self.open[who.token_id]:
                del self.open[who.token_id]
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            await chunks.aclose()


_END = object()
