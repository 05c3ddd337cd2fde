"""A satisfied window does not wait for the next pass, and does not pay for a whole one: the
rules that watch it run at once on a fresh snapshot (the others at the regular pass), on the
real NATS and Postgres. Any other wake-up still runs every rule."""
from __future__ import annotations

import asyncio
import time

from tests.integration.decider.live_decider import LiveDecider

INTERVAL = 60.0  # no regular pass during the test but the first


async def test_a_satisfied_window_runs_only_the_rules_watching_it_at_once(isolated, tmp_path):
    live = LiveDecider(isolated, tmp_path, strategies={"oom_protection": {"for_s": 2}})
    live.config_doc["controller"]["interval"] = INTERVAL
    live.write_config()
    async with live:
        await live.node("a", gpus=2)
        await live.node("b", gpus=2)
        await live.job("hot", status="running", gpus=1, placement=[{"node": "a", "gpus": [0]}])
        await live.job("big", gpus=8)  # fits nowhere: admission says why at every full pass
        await live.pending_reason("big", "no node has 8 free device(s)")
        runs: dict = {}
        while runs != live.engine.core.last_run:  # the full passes of the set-up (nodes, jobs) are over
            runs = dict(live.engine.core.last_run)
            await asyncio.sleep(1.0)
        assert {"oom_protection", "priority_fifo"} <= runs.keys()

        start = time.time()
        while not live.decisions and time.time() - start < 15:  # GPU a:0 at 95 % until the decision
            await live.metrics("a", {0: 0.95, 1: 0.1})
            await live.metrics("b", {0: 0.01, 1: 0.01})
            await asyncio.sleep(0.25)
        [decision] = await live.wait_for(lambda: live.decisions, what="the OOM decision")
        assert decision.rule == "oom_protection" and decision.action.job_id == "hot"
        after = live.engine.core.last_run
        assert after["oom_protection"] > runs["oom_protection"]  # run for the window ...
        assert after["priority_fifo"] == runs["priority_fifo"]   # ... and no other rule with it

        await live.job("small", gpus=1)  # a submission: a routine wake-up, so a full pass
        await live.wait_for(lambda: live.engine.core.last_run["priority_fifo"] > runs["priority_fifo"],
                            what="a full pass after the submission")
