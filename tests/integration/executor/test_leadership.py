"""Two executors on the real NATS and Postgres, one leading (shared/infra/leases.py): the standby keeps
its view warm and does nothing; a leader cut off from its lease steps down by its own deadline,
before the lease can expire and the standby take over; every decision and command carries the
fencing token, and whatever carries an older token than one already seen is refused."""

from __future__ import annotations

import asyncio
import time
import uuid

from services.executor.executor import Executor
from shared.contracts.actions import NodeGpus, Start
from shared.contracts.messages import Command, CommandError, CommandResult, Decision
from tests.integration.executor.harness import Harness

LEASE_S = 1.5


def start(job_id, node, gpu=0):
    return Start(job_id=job_id, reason="test start", placement=[NodeGpus(node=node, gpus=(gpu,))])


async def _when(predicate, what: str, timeout: float = 10.0) -> float:
    """The monotonic time at which `predicate` first held (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def test_the_standby_takes_over_only_after_the_cut_off_leader_stepped_down(isolated):
    async with Harness(isolated, leases={"lease_s": LEASE_S}) as h:
        first = h.executor
        await _when(lambda: first.fence.token is not None, "first executor leading")
        w = await h.worker(gpus=4)
        bus2 = await isolated.bus("executor", name="executor-standby")
        second = Executor(bus2, h.executor_pool, h.config, clock=h.clock)
        stop2 = asyncio.Event()
        task2 = asyncio.create_task(second.run(stop2))
        try:
            for _ in range(100):  # until the standby has subscribed and heard one
                await w.beat()
                if w.node in second.nodes.last_beat:
                    break
                await asyncio.sleep(0.05)
            assert w.node in second.nodes.last_beat, "the standby keeps no view of the nodes"
            job = await h.job()
            did = await h.decide(start(job, w.node))
            assert await h.settled(did) == "done"
            assert second.fence.token is None and not second.fence.leading
            [cmd] = [c for c in w.commands if c.job_id == job]
            assert cmd.fence == first.fence.token

            # Cut the leader off its lease (as a partition from NATS KV would): it renews no more.
            async def cannot_renew(timeout=None):
                await asyncio.sleep(min(timeout or 0.1, 0.1))
                return first.lease.is_leader

            first.lease.attempt = cannot_renew
            old_token = first.fence.token
            stepped_down = await _when(lambda: not first.fence.leading, "the leader stepping down")
            took_over = await _when(lambda: second.fence.token is not None, "the standby taking over")
            assert stepped_down < took_over, "two executors led at once"
            assert second.fence.token > old_token

            # The new leader carries on; its commands carry its token.
            job2 = await h.job()
            did2 = await h.decide(start(job2, w.node, gpu=1))
            assert await h.settled(did2) == "done"
            [cmd2] = [c for c in w.commands if c.job_id == job2]
            assert cmd2.fence == second.fence.token

            # A decision from a decider replaced since is refused as it is recorded, and audited.
            newer = Decision(
                decision_id=uuid.uuid4().hex,
                ts=h.clock.now(),
                rule="test",
                action=start(await h.job(), w.node, 2),
                snapshot_ts=h.clock.now(),
                fence=50,
            )
            older = Decision(
                decision_id=uuid.uuid4().hex,
                ts=h.clock.now(),
                rule="test",
                action=start(await h.job(), w.node, 3),
                snapshot_ts=h.clock.now(),
                fence=40,
            )
            await h.decider.publish_js(h.decider.subjects.decisions, newer, newer.decision_id)
            assert await h.settled(newer.decision_id) == "done"
            await h.decider.publish_js(h.decider.subjects.decisions, older, older.decision_id)
            assert await h.settled(older.decision_id) == "refused"
            assert await h.history(older.action.job_id) == ["pending"]
            [refusal] = await h.until(lambda: h.audited("decision.refused", older.action.job_id), "the refusal audited")
            assert "no longer leads" in refusal.reason and "40" in refusal.reason

            leading = await h.until(
                lambda: len(h.audited("executor.leading")) >= 2 and h.audited("executor.leading"),
                "both leaderships audited",
            )
            assert [e.data["token"] for e in leading] == [old_token, second.fence.token]
            assert all(e.data["host"] and e.data["pid"] for e in leading)
            [following] = await h.until(lambda: h.audited("executor.following"), "the step-down audited")
            assert following.data["token"] == old_token
        finally:
            stop2.set()
            await asyncio.wait_for(task2, 15)
            await bus2.close()


async def test_a_worker_refuses_a_command_older_than_the_newest_it_has_seen(tmp_path):
    from worker.agent import NodeAgent

    agent = NodeAgent(bus=None, node="n1", devices=[], storage_root=tmp_path)
    newest = Command(kind="cancel", job_id="j", attempt=1, fence=12)
    assert agent._stale(newest) is None and agent.newest_fence == 12
    refused: CommandResult = agent._stale(Command(kind="cancel", job_id="j", attempt=1, fence=11))
    assert refused is not None and refused.error == CommandError.STALE_LEADER and "11 < 12" in refused.message
    assert agent._stale(Command(kind="cancel", job_id="j", attempt=1, fence=13)) is None and agent.newest_fence == 13
