"""Trying a call again while what it needs is away (NATS, Postgres, a worker), on the injected clock.

Every retry of the services is `retrying(clock, ...)`: tenacity's `AsyncRetrying` with the clock's
`sleep`, so a `ManualClock` test waits out a back-off in no time. What is retried (`retry_on`, or
a result `again_if` says is not good enough), how long to wait (`doubling`, `steps`, `fixed`), and
when to give up (`attempts`, `until`) are each caller's; giving up returns the last result or
raises the last error, as the call itself would have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_base,
    retry_if_exception_type,
    retry_if_not_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_never,
    wait_chain,
    wait_exponential,
    wait_fixed,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from shared.infra.clock import Clock

OnFailure = Callable[[int, BaseException | None], None]


def doubling(first_s: float, most_s: float) -> wait_base:
    """first_s, twice that, ... at most most_s."""
    return wait_exponential(multiplier=first_s, exp_base=2, max=most_s)


def steps(*delays_s: float) -> wait_base:
    """These waits in turn; the last one again from then on."""
    return wait_chain(*(wait_fixed(d) for d in delays_s))


def fixed(delay_s: float) -> wait_base:
    return wait_fixed(delay_s)


class _Until(stop_base):
    def __init__(self, done: Callable[[], bool]) -> None:
        self.done = done

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.done()


def retrying(
    clock: Clock,
    *,
    wait: wait_base,
    attempts: int | None = None,
    until: Callable[[], bool] | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    never_on: tuple[type[BaseException], ...] = (),
    again_if: Callable[[Any], bool] | None = None,
    on_failure: OnFailure | None = None,
) -> AsyncRetrying:
    """Await `retrying(...)(fn, *args)`: fn until it succeeds, waiting on `clock` between tries.

    attempts: the most tries (None: no limit). until: checked after each failure, gives up once
    true (a stop event, a closed pool). never_on: errors of retry_on that are raised at once.
    again_if: a result that counts as a failure. on_failure(attempt, error or None): after each
    failed try that is retried or given up on, e.g. to log it."""
    retry: retry_base = retry_if_exception_type(retry_on)
    if never_on:
        retry = retry & retry_if_not_exception_type(never_on)
    if again_if is not None:
        retry = retry | retry_if_result(again_if)
    stop: stop_base = stop_after_attempt(attempts) if attempts is not None else stop_never
    if until is not None:
        stop = stop | _Until(until)
    return AsyncRetrying(
        sleep=clock.sleep,
        wait=wait,
        stop=stop,
        retry=retry,
        after=(lambda state: on_failure(state.attempt_number, state.outcome.exception())) if on_failure else None,
        retry_error_callback=lambda state: state.outcome.result(),  # the last result, or its error raised
    )
