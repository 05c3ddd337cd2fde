"""An injectable clock, so the same code runs live, in tests and in the simulator.

Every `now` and every timeout of the executor, the decider and the worker goes through one:
`now()` for the time, `monotonic()` for durations, `sleep` for a pause, `wait(event, timeout)` for "until this happens or
that long has passed" (periodic loops that stop on an event), `timeout(awaitable, seconds)` for
"this, but no longer than that" (a command a worker may never answer). `tests/unit/test_clock_use.py`
fails on a `time.time()`, `time.monotonic()` or `datetime.now()` anywhere else in those services.

`ManualClock` moves only when told to: `advance(s)` fires every `wait` and `timeout` whose time
has come, so a test drives a node timeout or a stuck checkpoint in no time. `sleep` on it
advances it at once (a back-off costs a test nothing).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps, for durations and deadlines (e.g. a lease)."""

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Until `event` is set (True) or `timeout` seconds have passed (False)."""

    async def timeout(self, awaitable: Awaitable[T], seconds: float) -> T:
        """The awaitable's result; asyncio.TimeoutError (it is cancelled) after `seconds`."""


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
            return True
        except TimeoutError:
            return event.is_set()

    async def timeout(self, awaitable: Awaitable[T], seconds: float) -> T:
        return await asyncio.wait_for(awaitable, seconds)


class ManualClock:
    """A clock that only moves when told to; sleeping advances it instantly."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future]] = []  # (deadline, order, future): a heap
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, fired = heapq.heappop(self._timers)
            if not fired.done():
                fired.set_result(None)

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    def _timer(self, seconds: float) -> asyncio.Future:
        fired = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            fired.set_result(None)
        else:
            heapq.heappush(self._timers, (self._now + seconds, next(self._order), fired))
        return fired

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        timer, waiter = self._timer(timeout), asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({timer, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            waiter.cancel()
        return event.is_set()

    async def timeout(self, awaitable: Awaitable[T], seconds: float) -> T:
        timer, work = self._timer(seconds), asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({timer, work}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            raise TimeoutError(f"no result within {seconds:g} s on the manual clock")
        finally:
            timer.cancel()
            if not work.done():
                work.cancel()


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)
