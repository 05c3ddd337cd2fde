"""Wakes the live audit tails when rows are appended.

Migration 005 makes every insert into audit_events NOTIFY `adc_audit_appended`; one LISTEN
connection per api process turns that into an asyncio wake-up for all tails. A tail then
re-reads by id, so the notification carries nothing and a lost one costs only latency: tails
also re-read on a timer, short while the listener is down.

The same connection carries the api's other notifications (`also`: channel -> callback, as the token
cache's, services/api/auth.py); each callback is also called with no arguments whenever listening starts
or stops, since notifications may have been missed in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

log = logging.getLogger(__name__)

CHANNEL = "adc_audit_appended"
LISTENING_POLL_S = 5.0  # a safety net only: notifications do the work
DEGRADED_POLL_S = 0.5  # while the listener is reconnecting


class AuditFeed:
    def __init__(self, database_url: str, also: dict[str, Callable[..., None]] | None = None) -> None:
        self.database_url = database_url
        self.also = dict(also or {})
        self._conn: asyncpg.Connection | None = None
        self._changed = asyncio.Event()
        self._keeper: asyncio.Task | None = None
        self._closing = False

    async def start(self) -> None:
        await self._listen()
        self._keeper = asyncio.create_task(self._keep_listening())

    async def close(self) -> None:
        self._closing = True
        if self._keeper:
            self._keeper.cancel()
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close(timeout=2)
        self._wake()  # tails see the close and end

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def poll_s(self) -> float:
        return LISTENING_POLL_S if self.listening else DEGRADED_POLL_S

    def changed(self) -> asyncio.Event:
        """An event set at the next append. Take it before reading, so no append is missed."""
        return self._changed

    def _wake(self, *_args) -> None:
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()

    async def _listen(self) -> None:
        try:
            conn = await asyncpg.connect(self.database_url, timeout=5)
            await conn.add_listener(CHANNEL, self._wake)
            for channel, callback in self.also.items():
                await conn.add_listener(channel, callback)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
            log.warning("audit feed: cannot LISTEN (%s); tails poll every %.1fs", err, DEGRADED_POLL_S)
            return
        conn.add_termination_listener(self._lost)
        self._conn = conn
        self._missed()
        self._wake()  # rows may have landed while we were not listening

    def _missed(self, *_args) -> None:
        for callback in self.also.values():
            callback()

    def _lost(self, *_args) -> None:
        self._missed()
        self._wake()

    async def _keep_listening(self) -> None:
        while not self._closing:
            await asyncio.sleep(2.0)
            if not self.listening:
                await self._listen()
