"""Runs rules with a time budget, isolated: whatever one does, the engine goes on.

The rules of a pass run one after another in a daemon thread over the immutable snapshot (one
hand-off to the thread per pass, a wake-up of the loop per rule; the thread is kept for the next
pass unless a rule overran in it). The engine waits for
each at most its budget, counted from when it started; a rule that overruns has its result discarded (acting on a late
answer would mean acting on an old snapshot), and is not started again while the overrunning
call is still going; the rules after it go on in a fresh thread. A rule that raises, or returns
anything but actions, is an error. Both come back as data for the audit log.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, get_args

from services.decider.plugin import Rule, RuleOutput, normalize
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Action

ACTION_TYPES = tuple(get_args(get_args(Action)[0]))


@dataclass(frozen=True)
class RunResult:
    rule: str
    output: RuleOutput | None = None
    error: str | None = None
    overrun: bool = False
    wall_ms: float = 0.0
    cpu_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.output is not None


def describe_error(err: BaseException) -> str:
    """A rule's exception and where it was raised, as its incident names it."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def call_rule(rule: Rule, snapshot: Snapshot, config: Any) -> RuleOutput:
    """Call the rule and check what it returned: typed actions only."""
    output = normalize(rule.decide(snapshot, config))
    wrong = [type(a).__name__ for a in output.actions if not isinstance(a, ACTION_TYPES)]
    if wrong:
        raise TypeError(f"returned {', '.join(sorted(set(wrong)))} where actions (shared.contracts.actions) belong")
    return output


class _Worker:
    """A daemon thread that runs what it is handed, one piece of work at a time, while each says
    to go on (a pass with an overrun says not to: nobody hands this thread anything again). Idle
    for IDLE_S, it ends; `submit` then says no."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._open = True
        threading.Thread(target=self._serve, name="rules", daemon=True).start()

    def submit(self, work) -> bool:
        with self._lock:
            if self._open:
                self._work.put(work)
            return self._open

    def _serve(self) -> None:
        while True:
            try:
                work = self._work.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._work.empty():
                        self._open = False
                        return
                continue
            if not work():
                with self._lock:
                    self._open = False
                return


class RuleRunner:
    def __init__(self) -> None:
        self._running: dict[str, float] = {}  # rule -> when its still-running call started
        self._lock = threading.Lock()
        self._idle: _Worker | None = None  # the thread of the last pass, if every rule in it ended

    def busy_since(self, rule: str) -> float | None:
        with self._lock:
            return self._running.get(rule)

    async def run(self, rule: Rule, snapshot: Snapshot, config: Any, budget_s: float) -> RunResult:
        [result] = await self.run_all([(rule, snapshot, config, budget_s)])
        return result

    async def run_all(self, calls: list[tuple[Rule, Snapshot, Any, float]]) -> list[RunResult]:
        """Each (rule, snapshot, config, budget_s) in order; one result per call."""
        results: list[RunResult] = []
        while len(results) < len(calls):
            results += await self._in_one_thread(calls[len(results) :])
        return results

    async def _in_one_thread(self, calls: list[tuple[Rule, Snapshot, Any, float]]) -> list[RunResult]:
        """Run `calls` in one thread (the last pass's, or a new one); the results up to and including
        the first overrun.

        The thread wakes the event loop as each rule ends (so the wait is always for the budget of
        the rule under way), and the loop wakes when that rule reaches the end of its budget."""
        loop = asyncio.get_running_loop()
        progress = asyncio.Event()  # set (from the thread) each time a rule ends
        abandoned = threading.Event()  # set when the engine stopped waiting: start nothing more
        starts: list[float] = []  # when each rule started, in the thread (appended there)
        results: list[RunResult] = []  # appended by the thread as each rule ends

        def work() -> bool:
            with self._lock:
                starts.append(time.perf_counter())
                self._running[calls[0][0].name] = starts[0]
            for i, (rule, snapshot, config, _) in enumerate(calls):
                cpu = time.thread_time()
                try:
                    result = RunResult(rule.name, output=call_rule(rule, snapshot, config))
                except BaseException as err:  # noqa: BLE001 - isolation: a rule's failure is data
                    result = RunResult(rule.name, error=describe_error(err))
                result = RunResult(
                    result.rule,
                    result.output,
                    result.error,
                    False,
                    (time.perf_counter() - starts[i]) * 1000,
                    (time.thread_time() - cpu) * 1000,
                )
                with self._lock:  # the next rule's start is known as soon as this one's end is
                    self._running.pop(rule.name, None)
                    results.append(result)
                    go_on = i + 1 < len(calls) and not abandoned.is_set()
                    if go_on:
                        starts.append(time.perf_counter())
                        self._running[calls[i + 1][0].name] = starts[i + 1]
                try:
                    loop.call_soon_threadsafe(progress.set)
                except RuntimeError:  # the loop is gone: nobody waits for these answers any more
                    return False
                if not go_on:
                    break
            return not abandoned.is_set()

        begun = time.perf_counter()
        with self._lock:  # busy from now: a rule waiting its turn in this thread is not started twice
            self._running[calls[0][0].name] = begun
        worker, self._idle = self._idle, None
        if worker is None or not worker.submit(work):
            worker = _Worker()
            worker.submit(work)
        while True:
            with self._lock:
                done = len(results)
                started = starts[done] if len(starts) > done else begun
                progress.clear()  # under the lock: a rule ending after this wakes the wait below
            if done == len(calls):
                self._idle = worker  # nothing of this pass runs in it any more: the next pass may use it
                return list(results)
            rule, _, _, budget_s = calls[done]
            timeout = started + budget_s - time.perf_counter()
            if timeout <= 0:
                with self._lock:  # it may have ended meanwhile; if not, it overran
                    if len(results) > done:
                        continue
                    abandoned.set()
                    return results[:done] + [
                        RunResult(rule.name, overrun=True, wall_ms=(time.perf_counter() - started) * 1000)
                    ]
            try:
                await asyncio.wait_for(progress.wait(), timeout)
            except TimeoutError:
                pass


class InlineRunner:
    """Runs each rule in the caller's thread, to completion: for the simulator, where the clock is
    simulated and a wall-time budget would make decisions depend on the machine. Errors are data,
    as with RuleRunner; wall and CPU time are measured, never enforced."""

    def busy_since(self, rule: str) -> float | None:
        return None

    async def run_all(self, calls: list[tuple[Rule, Snapshot, Any, float]]) -> list[RunResult]:
        return [await self.run(*call) for call in calls]

    async def run(self, rule: Rule, snapshot: Snapshot, config: Any, budget_s: float) -> RunResult:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            output, error = call_rule(rule, snapshot, config), None
        except Exception as err:  # noqa: BLE001 - isolation: a rule's failure is data
            output, error = None, describe_error(err)
        return RunResult(
            rule.name, output, error, False, (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000
        )
