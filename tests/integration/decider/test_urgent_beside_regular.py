"""The urgent pass (the rules watching a window that was just satisfied) waits for nothing the
regular pass does: not the gap the regular pass leaves after itself so a burst of events collapses
into one pass, and not a regular pass under way. On the real NATS and Postgres; time bounds here
are generous orderings (the decision comes while the regular pass is still asleep or still held),
not speed claims."""

from __future__ import annotations

import asyncio
import time

from tests.integration.decider.live_decider import LiveDecider

INTERVAL = 60.0  # no regular pass on the interval during a test


async def _settled(live: LiveDecider) -> dict:
    """The regular passes of the set-up (nodes, jobs) are over: last_run stays put for a second."""
    await live.wait_for(
        lambda: {"oom_protection", "priority_fifo"} <= live.engine.core.last_run.keys(), what="a regular pass"
    )
    runs: dict = {}
    while runs != live.engine.core.last_run:
        runs = dict(live.engine.core.last_run)
        await asyncio.sleep(1.0)
    return runs


async def _set_up(live: LiveDecider) -> dict:
    await live.node("a", gpus=2)
    await live.node("b", gpus=2)
    await live.job("hot", status="running", gpus=1, placement=[{"node": "a", "gpus": [0]}])
    runs = await _settled(live)
    assert {"oom_protection", "priority_fifo"} <= runs.keys()
    return runs


async def _heat_until_decided(live: LiveDecider, timeout: float) -> None:
    """GPU a:0 at 95 % until the decider decides, or `timeout`."""
    start = time.time()
    while not live.decisions and time.time() - start < timeout:
        await live.metrics("a", {0: 0.95, 1: 0.1})
        await live.metrics("b", {0: 0.01, 1: 0.01})
        await asyncio.sleep(0.25)


async def test_a_window_satisfied_during_the_gap_is_decided_in_it(isolated, tmp_path):
    live = LiveDecider(isolated, tmp_path, strategies={"oom_protection": {"for_s": 2}})
    live.config_doc["controller"]["interval"] = INTERVAL
    live.write_config()
    async with live:
        await _set_up(live)
        # A long gap between regular passes (at least 30 s from one's start to the next's): the reload
        # wakes the regular pass, which now waits out the rest of the gap before it runs.
        in_gap = live.engine.core.last_run["priority_fifo"]
        live.config_doc["decider"]["min_tick_gap_s"] = 30.0
        live.write_config()
        await live.wait_for(lambda: live.audited("config.reloaded"), what="the reload")

        await _heat_until_decided(live, timeout=15)
        [decision] = await live.wait_for(lambda: live.decisions, timeout=1, what="the OOM decision within the gap")
        assert decision.rule == "oom_protection" and decision.action.job_id == "hot"
        assert live.engine.core.last_run["priority_fifo"] == in_gap  # the regular pass is still in its gap
        assert live.audited("decision", "")[0].decision_id == decision.decision_id  # audited as any decision


SLOW = """
import time
from pathlib import Path

from services.decider.plugin import Rule, RuleConfig

GATE = Path({gate!r})


class Config(RuleConfig):
    budget_ms: float = 60000.0


def decide(snapshot, config):
    # Held while the test says so: a regular pass that takes as long as the test wants.
    if (GATE / "hold").exists():
        (GATE / "holding").touch()
        deadline = time.monotonic() + 30
        while not (GATE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (GATE / "holding").unlink()
    return []


RULE = Rule(name="slow_pass", decide=decide, config=Config, precedence=1, description="test plugin: a slow pass")
"""


async def test_an_urgent_pass_does_not_wait_for_the_regular_pass_under_way(isolated, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    live = LiveDecider(isolated, tmp_path, strategies={"oom_protection": {"for_s": 2}})
    live.config_doc["controller"]["interval"] = INTERVAL
    live.write_config()
    (live.rules_dir / "slow_pass.py").write_text(SLOW.format(gate=str(gate)))
    async with live:
        await _set_up(live)
        assert "slow_pass" in live.engine.registry.rules
        (gate / "hold").touch()
        await live.job("big", gpus=8)  # wakes a regular pass, which the slow rule then holds
        await live.wait_for(lambda: (gate / "holding").exists(), what="the regular pass held")
        try:
            await _heat_until_decided(live, timeout=15)
            [decision] = await live.wait_for(
                lambda: live.decisions, timeout=1, what="the OOM decision while the regular pass is held"
            )
            assert decision.rule == "oom_protection" and decision.action.job_id == "hot"
            assert (gate / "holding").exists()  # decided while the regular pass was still under way
        finally:
            (gate / "release").touch()
        # The regular pass, once released, decides nothing more for the job: its decision is in flight.
        await live.wait_for(lambda: not (gate / "holding").exists(), what="the regular pass released")
        await asyncio.sleep(1.0)
        assert [d.action.job_id for d in live.decisions] == ["hot"]
