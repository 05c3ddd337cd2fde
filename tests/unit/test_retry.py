"""retrying: a call tried again on the injected clock, waiting as told, giving up as told, and
reporting each failure; on a ManualClock every back-off is visible as time the clock moved."""

from __future__ import annotations

import logging

import pytest

from shared.infra.clock import ManualClock
from shared.infra.retry import doubling, fixed, retrying, steps


class Flaky:
    """Fails `failures` times with ConnectionError, then answers; notes the clock at each call."""

    def __init__(self, clock: ManualClock, failures: int, error: type[Exception] = ConnectionError) -> None:
        self.clock, self.failures, self.error = clock, failures, error
        self.calls: list[float] = []

    async def __call__(self, answer: str = "ok") -> str:
        self.calls.append(self.clock.now())
        if len(self.calls) <= self.failures:
            raise self.error(f"away (call {len(self.calls)})")
        return answer


def gaps(calls: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in zip(calls, calls[1:])]


async def test_a_call_is_tried_again_after_each_wait_until_it_answers():
    clock = ManualClock()
    call = Flaky(clock, failures=4)
    assert await retrying(clock, wait=doubling(0.2, 1))(call, "answer") == "answer"
    assert gaps(call.calls) == [0.2, 0.4, 0.8, 1.0]  # doubling, capped


async def test_steps_wait_each_delay_in_turn_then_the_last_again():
    clock = ManualClock()
    call = Flaky(clock, failures=4)
    await retrying(clock, wait=steps(0.2, 0.5, 1))(call)
    assert gaps(call.calls) == [0.2, 0.5, 1, 1]


async def test_it_gives_up_after_its_attempts_with_the_last_error_and_no_wait_after_it():
    clock = ManualClock()
    call = Flaky(clock, failures=10)
    with pytest.raises(ConnectionError, match="call 3"):
        await retrying(clock, wait=fixed(5), attempts=3)(call)
    assert len(call.calls) == 3 and clock.now() - call.calls[0] == 10


async def test_it_gives_up_once_until_says_so():
    clock = ManualClock()
    call = Flaky(clock, failures=100)
    stopping = iter([False, False, True])
    with pytest.raises(ConnectionError):
        await retrying(clock, wait=fixed(1), until=lambda: next(stopping))(call)
    assert len(call.calls) == 3


async def test_only_the_errors_it_is_told_of_are_retried():
    clock = ManualClock()
    call = Flaky(clock, failures=1, error=KeyError)
    with pytest.raises(KeyError):
        await retrying(clock, wait=fixed(1), retry_on=ConnectionError)(call)

    class Deposed(ConnectionError):
        pass

    call = Flaky(clock, failures=1, error=Deposed)
    with pytest.raises(Deposed):
        await retrying(clock, wait=fixed(1), never_on=(Deposed,))(call)
    assert len(call.calls) == 1 and clock.now() == call.calls[0]


async def test_a_result_again_if_rejects_is_tried_again_and_the_last_one_returned_on_giving_up():
    clock = ManualClock()
    answers = iter([False, False, True])

    async def ready() -> bool:
        return next(answers)

    assert await retrying(clock, wait=fixed(5), again_if=lambda ok: not ok)(ready) is True
    assert clock.now() == ManualClock().now() + 10

    async def never() -> bool:
        return False

    assert await retrying(clock, wait=fixed(5), attempts=2, again_if=lambda ok: not ok)(never) is False


async def test_each_failure_is_reported_with_its_attempt_and_error(caplog):
    clock = ManualClock()
    log = logging.getLogger("retry-under-test")

    def on_failure(attempt: int, err: BaseException | None) -> None:
        log.warning("try %d failed: %s", attempt, err)

    with caplog.at_level(logging.WARNING, logger="retry-under-test"), pytest.raises(ConnectionError):
        await retrying(clock, wait=fixed(1), attempts=3, on_failure=on_failure)(Flaky(clock, failures=5))
    assert [r.getMessage() for r in caplog.records] == [
        "try 1 failed: away (call 1)",
        "try 2 failed: away (call 2)",
        "try 3 failed: away (call 3)",
    ]
