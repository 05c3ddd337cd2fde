"""A satisfied window does not wait for the next pass, and does not pay for a whole one: the
rules that watch it run at once on a fresh snapshot (the others at the regular pass), on the
real NATS and Postgres. Any other wake-up still runs every rule."""

from __future__ import annotations

import asyncio
import time

from shared.contracts.messages import AuditEvent
from tests.integration.decider.live_decider import LiveDecider

INTERVAL = 60.0  # no regular pass during the test but the first


def oom_decider(isolated, tmp_path) -> LiveDecider:
    """A decider whose OOM window is 2 s and whose regular passes are INTERVAL apart."""
    live = LiveDecider(isolated, tmp_path, strategies={"oom_protection": {"for_s": 2}})
    live.config_doc["controller"]["interval"] = INTERVAL
    live.write_config()
    return live


async def hot_gpu_cluster(live: LiveDecider) -> None:
    """Nodes a and b (2 GPUs each), and job `hot` running on a:0."""
    await live.node("a", gpus=2)
    await live.node("b", gpus=2)
    await live.job("hot", status="running", gpus=1, placement=[{"node": "a", "gpus": [0]}])


async def test_a_satisfied_window_runs_only_the_rules_watching_it_at_once(isolated, tmp_path):
    live = oom_decider(isolated, tmp_path)
    async with live:
        await hot_gpu_cluster(live)
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
        assert after["priority_fifo"] == runs["priority_fifo"]  # ... and no other rule with it

        await live.job("small", gpus=1)  # a submission: a routine wake-up, so a full pass
        await live.wait_for(
            lambda: live.engine.core.last_run["priority_fifo"] > runs["priority_fifo"],
            what="a full pass after the submission",
        )


async def test_a_pause_the_api_audits_before_its_commit_holds_the_urgent_pass(isolated, tmp_path):
    """The urgent pass takes the pause from the last read unless an audit event said it changed; the
    api audits inside its transaction, so a read just after the event may still say "not paused"."""
    live = oom_decider(isolated, tmp_path)
    async with live:
        await hot_gpu_cluster(live)

        def set_up():
            snap = live.engine.last_snapshot
            return snap is not None and {"a", "b"} <= snap.nodes.keys() and snap.job("hot") is not None

        await live.wait_for(set_up, what="the nodes and the job in a snapshot")
        last = None
        while last != live.engine.last_snapshot.ts:  # the passes of the set-up are over
            last = live.engine.last_snapshot.ts
            await asyncio.sleep(1.0)
        async with live.pool.acquire() as conn, conn.transaction():  # as services/api/controller.py does
            await conn.execute("UPDATE controller_state SET paused = true, reason = 'maintenance', updated_by = 'ops'")
            audited = time.time()
            await live.bus.audit(
                AuditEvent(
                    ts=audited, source="api", kind="controller.paused", reason="ops paused the controller: maintenance"
                )
            )

            def read_before_the_commit():  # the pass the event woke read the state: not paused yet
                read = live.engine.source._controller
                return read is not None and read[0] >= audited and read[1][1] is None

            await live.wait_for(read_before_the_commit, what="a read of the controller state after the event")
        heated = time.time()
        while time.time() - heated < 4:  # GPU a:0 at 95 %: its window is satisfied after 2 s
            await live.metrics("a", {0: 0.95, 1: 0.1})
            await live.metrics("b", {0: 0.01, 1: 0.01})
            await asyncio.sleep(0.25)
        assert live.engine.last_snapshot.ts > heated + 2  # the urgent pass ran ...
        assert live.decisions == []  # ... and, paused, decided nothing
