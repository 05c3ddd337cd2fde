"""Runs one rule with a time budget, isolated: whatever it does, the engine goes on.

Each evaluation runs in its own daemon thread over the immutable snapshot. The engine waits
at most the rule's budget; a rule that overruns has its result discarded (acting on a late
answer would mean acting on an old snapshot), and is not started again while the overrunning
call is still going. A rule that raises, or returns anything but actions, is an error. Both
come back as data for the audit log.
"""
from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, get_args

from services.decider.plugin import Rule, RuleOutput, normalize
from services.decider.snapshot import Snapshot
from shared.actions import Action

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


def _describe(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def call_rule(rule: Rule, snapshot: Snapshot, config: Any) -> RuleOutput:
    """Call the rule and check what it returned: typed actions only."""
    output = normalize(rule.decide(snapshot, config))
    wrong = [type(a).__name__ for a in output.actions if not isinstance(a, ACTION_TYPES)]
    if wrong:
        raise TypeError(f"returned {', '.join(sorted(set(wrong)))} where actions (shared.actions) belong")
    return output


class RuleRunner:
    def __init__(self) -> None:
        self._running: dict[str, float] = {}  # rule -> when its still-running call started
        self._lock = threading.Lock()

    def busy_since(self, rule: str) -> float | None:
        with self._lock:
            return self._running.get(rule)

    async def run(self, rule: Rule, snapshot: Snapshot, config: Any, budget_s: float) -> RunResult:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RunResult] = loop.create_future()
        started = time.perf_counter()

        def settle(result: RunResult) -> None:
            if not done.done():
                done.set_result(result)

        def work() -> None:
            cpu = time.thread_time()
            try:
                output = call_rule(rule, snapshot, config)
                result = RunResult(rule.name, output=output)
            except BaseException as err:  # noqa: BLE001 - isolation: a rule's failure is data
                result = RunResult(rule.name, error=_describe(err))
            elapsed = (time.perf_counter() - started) * 1000
            result = RunResult(result.rule, result.output, result.error, False, elapsed, (time.thread_time() - cpu) * 1000)
            with self._lock:
                self._running.pop(rule.name, None)
            try:
                loop.call_soon_threadsafe(settle, result)
            except RuntimeError:  # the loop is gone: nobody waits for this answer any more
                pass

        with self._lock:
            self._running[rule.name] = started
        threading.Thread(target=work, name=f"rule-{rule.name}", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), budget_s)
        except asyncio.TimeoutError:
            return RunResult(rule.name, overrun=True, wall_ms=(time.perf_counter() - started) * 1000)


class InlineRunner:
    """Runs each rule in the caller's thread, to completion: for the simulator, where the clock is
    simulated and a wall-time budget would make decisions depend on the machine. Errors are data,
    as with RuleRunner; wall and CPU time are measured, never enforced."""

    def busy_since(self, rule: str) -> float | None:
        return None

    async def run(self, rule: Rule, snapshot: Snapshot, config: Any, budget_s: float) -> RunResult:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            output, error = call_rule(rule, snapshot, config), None
        except Exception as err:  # noqa: BLE001 - isolation: a rule's failure is data
            output, error = None, _describe(err)
        return RunResult(rule.name, output, error, False, (time.perf_counter() - started) * 1000,
                         (time.thread_time() - cpu) * 1000)
