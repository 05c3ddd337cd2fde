"""Waiting in a test for something to happen: poll what can be observed (a row in Postgres, an audit
event, a file, a process) until it holds, and fail naming what never happened. The deadline is
generous and only bounds a hung run; no test asserts on how long anything took.
`tests/unit/test_test_waits.py` fails on a fixed sleep or a wall-clock deadline written out in a
test instead."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.1  # between looks: short beside any timeout, long enough not to load the api or Postgres


def _message(what: str | Callable[[], Any], timeout: float) -> str:
    """`what` is a description, or a callable giving one when the wait fails (the state last seen)."""
    return f"within {timeout:g}s, never: {what() if callable(what) else what}"


def until(done: Callable[[], Any], what: str | Callable[[], Any], timeout: float = 60, poll: float = POLL_S) -> Any:
    """`done()`'s first truthy value, looked at every `poll` seconds; an AssertionError naming `what`
    once `timeout` seconds have passed. An exception (or a failed assert) in `done` ends the wait."""
    deadline = time.monotonic() + timeout
    while not (value := done()):
        if time.monotonic() >= deadline:
            raise AssertionError(_message(what, timeout))
        time.sleep(poll)
    return value


async def until_async(
    done: Callable[[], Any], what: str | Callable[[], Any], timeout: float = 10, poll: float = POLL_S
) -> Any:
    """As `until`, in an event loop (the loop runs on between looks); `done` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = done()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_message(what, timeout))
        await asyncio.sleep(poll)
