"""Two deciders on the real NATS and Postgres, one leader: only the lease holder decides, and
when it stops the other takes over."""

import asyncio

from tests.integration.decider.live_decider import LiveDecider


def decided(live, job_id):
    return [d for d in live.decisions if d.action.job_id == job_id]


async def test_only_the_leader_decides_and_the_other_takes_over(isolated, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = LiveDecider(isolated, tmp_path / "a", leases={"lease_s": 1.5})
    b = LiveDecider(isolated, tmp_path / "b", leases={"lease_s": 1.5})
    async with a, b:
        await a.node("n1", gpus=4)
        await b.node("n1", gpus=4)
        await a.job("first")
        [lead] = await a.wait_for(lambda: a.audited("decider.leading"), what="a leader")
        leader, other = (a, b) if lead.data["instance"] == a.engine.instance else (b, a)
        await a.wait_for(lambda: decided(a, "first"), what="a decision for the first job")
        await asyncio.sleep(1.0)
        assert len(decided(a, "first")) == 1  # the follower decided nothing
        [audit] = [e for e in a.audited("decision") if e.job_id == "first"]
        assert audit.data["instance"] == leader.engine.instance

        leader.stop.set()
        await leader.task  # a clean stop releases the lease
        await a.job("second")
        await a.wait_for(
            lambda: [e for e in a.audited("decider.leading") if e.data["instance"] == other.engine.instance],
            what="the other instance leading",
        )
        await a.wait_for(lambda: decided(a, "second"), what="a decision by the new leader")
        [audit] = [e for e in a.audited("decision") if e.job_id == "second"]
        assert audit.data["instance"] == other.engine.instance
        # Each decision carries its leader's fencing token; the newer leader's is greater.
        first, second = decided(a, "first")[0], decided(a, "second")[0]
        assert first.fence == lead.data["token"] and second.fence > first.fence
