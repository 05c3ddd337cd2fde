"""ManualClock: waits and timeouts end when the test moves the clock past them, not before."""

import asyncio

import pytest

from shared.infra.clock import ManualClock, SystemClock


async def test_a_wait_ends_when_its_event_is_set_or_the_clock_passes_its_timeout():
    clock, event = ManualClock(), asyncio.Event()
    waiting = asyncio.ensure_future(clock.wait(event, 30))
    await asyncio.sleep(0)
    clock.advance(29.9)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.1)
    assert await waiting is False
    event.set()
    assert await clock.wait(event, 30) is True


async def test_a_timeout_cancels_what_never_answers_once_the_clock_passes_it():
    clock = ManualClock()
    never = asyncio.get_running_loop().create_future()
    guarded = asyncio.ensure_future(clock.timeout(never, 5))
    await asyncio.sleep(0)
    clock.advance(4)
    await asyncio.sleep(0)
    assert not guarded.done()
    clock.advance(1)
    with pytest.raises(asyncio.TimeoutError):
        await guarded
    assert never.cancelled()
    assert await clock.timeout(asyncio.sleep(0, result="answer"), 5) == "answer"


async def test_sleeping_moves_a_manual_clock_at_once_and_the_system_clock_waits_for_real():
    clock = ManualClock(start=100.0)
    await clock.sleep(7)
    assert clock.now() == clock.monotonic() == 107.0
    system = SystemClock()
    before = system.monotonic()
    assert await system.wait(asyncio.Event(), 0.01) is False and system.monotonic() > before
