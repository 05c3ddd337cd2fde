"""The decider's event loop is shared fairly: the bus handlers give it back between messages, a
satisfied window's urgent pass runs before the next message is taken (waiting at most
URGENT_HOLD_S), and the urgent pass takes the pause and the policy version from the last read
unless an audit event said they changed (then it reads them, for as long as the api's commit may
lag its event)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from services.decider.cluster_view import ClusterView
from services.decider.core import PassResult
from services.decider.engine import DeciderEngine
from services.decider.ingest import URGENT_HOLD_S
from services.decider.job_book import MISSING_GRACE_S
from services.decider.snapshot_source import SnapshotSource
from shared.infra.clock import ManualClock
from shared.infra.config import parse_config
from tests.waits import until_async


def _engine(clock: ManualClock) -> DeciderEngine:
    config = parse_config({"leases": {"enabled": False}}, env={})
    engine = DeciderEngine(SimpleNamespace(), None, config, clock=clock, config_path=Path("/nonexistent.yaml"))
    engine.passes.ready.set()  # as after the first regular pass
    return engine


async def _turns() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_after_a_satisfied_window_the_next_message_waits_for_the_urgent_pass():
    engine = _engine(ManualClock())
    taken: list[str] = []
    seen_by_pass: list[list[str]] = []
    gate = asyncio.Event()

    async def handler(msg):
        taken.append(msg)

    async def tick(only=None):
        seen_by_pass.append(list(taken))
        await gate.wait()  # the pass waits on Postgres, the rule thread, the bus ...
        return PassResult(snapshot_ts=0.0, timings_ms={name: 1.0 for name in only})

    engine.tick = tick
    engine.watches.rules_of = lambda fired: {"oom_protection": None}
    stop = asyncio.Event()
    urgent = asyncio.ensure_future(engine.passes.urgent_loop(stop))
    take = engine.ingest.in_turn(handler)
    await take("before")
    engine.passes.window_satisfied("oom_protection window satisfied on a:0")
    after = asyncio.ensure_future(take("after"))
    await _turns()
    assert seen_by_pass == [["before"]] and not after.done()  # ... and meanwhile no message is taken
    gate.set()
    await asyncio.wait_for(after, 1)
    assert taken == ["before", "after"]
    stop.set()
    await engine.passes.wake_on(stop)  # as run() does: the urgent loop sees the stop
    await asyncio.wait_for(urgent, 1)


async def test_the_handlers_wait_for_an_urgent_pass_no_longer_than_the_hold():
    clock = ManualClock()
    engine = _engine(clock)
    taken: list[str] = []

    async def handler(msg):
        taken.append(msg)

    take = engine.ingest.in_turn(handler)
    engine.passes.window_satisfied("oom_protection window satisfied on a:0")  # no urgent loop runs to take it
    first = asyncio.ensure_future(take("first"))
    await _turns()
    assert not first.done()
    clock.advance(URGENT_HOLD_S)
    await asyncio.wait_for(first, 1)
    await asyncio.wait_for(take("second"), 1)  # the hold is over for every handler, not per message
    assert taken == ["first", "second"]


async def test_before_the_first_regular_pass_a_satisfied_window_holds_nothing():
    engine = _engine(ManualClock())
    engine.passes.ready.clear()

    async def handler(msg):
        pass

    engine.passes.window_satisfied("oom_protection window satisfied on a:0")
    await asyncio.wait_for(engine.ingest.in_turn(handler)("m"), 1)


class _Pool:
    def __init__(self) -> None:
        self.reads = 0
        self.paused = False

    async def fetchrow(self, sql):
        self.reads += 1
        return {"version": 3, "paused": self.paused, "reason": "maintenance", "updated_by": "ops"}


async def test_the_urgent_pass_takes_the_controller_state_from_the_last_read_until_an_event_says_it_changed():
    pool = _Pool()
    source = SnapshotSource(pool, ClusterView())
    assert source.recent_controller_state(100.0, 5.0) is None  # nothing read yet
    assert await source.controller_state(100.0) == (3, None)
    assert source.recent_controller_state(104.0, 5.0) == (3, None)
    assert source.recent_controller_state(105.0, 5.0) is None  # older than a regular pass's interval
    source.controller_changed(104.0)  # e.g. controller.paused, audited inside the api's transaction
    assert source.recent_controller_state(104.1, 5.0) is None
    await source.controller_state(104.2)  # may have read before the commit: not taken as the answer
    assert source.recent_controller_state(104.3, 5.0) is None
    pool.paused = True
    later = 104.0 + MISSING_GRACE_S + 0.1
    assert await source.controller_state(later) == (3, "the controller is paused by ops: maintenance")
    assert source.recent_controller_state(later + 1, 5.0) == (3, "the controller is paused by ops: maintenance")
    assert pool.reads == 3


async def test_an_urgent_pass_whose_rule_the_regular_pass_runs_waits_for_it_to_end_before_it_runs_again():
    engine = _engine(ManualClock())
    busy = {"oom_protection"}
    engine.core.runner = SimpleNamespace(busy_since=lambda name: 1.0 if name in busy else None)
    ticks: list[set] = []

    async def tick(only=None):
        ticks.append(set(busy))
        ran = {} if busy else {name: 1.0 for name in only}  # the core skips a rule the runner says is busy
        return PassResult(snapshot_ts=0.0, timings_ms=ran)

    engine.tick = tick
    engine.watches.rules_of = lambda fired: {"oom_protection": None}
    stop = asyncio.Event()
    urgent = asyncio.ensure_future(engine.passes.urgent_loop(stop))
    engine.passes.window_satisfied("oom_protection window satisfied on a:0")
    # The regular pass goes on with the rule meanwhile. The urgent loop polls the runner on the
    # host's clock (not the engine's), so these 50 ms are real.
    await asyncio.sleep(0.05)  # not a wait: no second try may come in them
    assert ticks == [{"oom_protection"}]  # one try, then it waits: no pass every 2 ms while the rule runs
    busy.clear()
    await until_async(lambda: len(ticks) == 2, lambda: f"the urgent pass once the rule ended: {ticks}", poll=0.005)
    assert ticks == [{"oom_protection"}, set()]  # once the rule ended, the urgent pass ran it
    stop.set()
    await engine.passes.wake_on(stop)  # as run() does: the urgent loop sees the stop
    await asyncio.wait_for(urgent, 1)
