"""The bandit's learning state on the real NATS and Postgres: it round-trips through `bandit_state`,
a write with an older lease token is refused, a reset asked for is carried out and audited, and the
model version a decider learned survives a restart and a leader failover."""

from __future__ import annotations

import asyncio
import time

from services.decider.bandit.learner import Learner
from services.decider.bandit.store import BanditStore
from shared.contracts.messages import AuditEvent
from shared.infra.db import create_pool, service_url
from tests.integration.decider.live_decider import LiveDecider

BANDIT = {"mode": "shadow", "save_every_s": 0.2, "epsilon": 0.2}


def _live(isolated, home, **kw) -> LiveDecider:
    home.mkdir(exist_ok=True)
    live = LiveDecider(isolated, home, **kw)
    live.config_doc["bandit"] = dict(BANDIT)
    live.write_config()
    return live


async def _stored_version(live: LiveDecider) -> int | None:
    return await live.pool.fetchval("SELECT version FROM bandit_state WHERE point = 'placement'")


async def _learn_once(live: LiveDecider, job_id: str, step_time_s: float = 0.8) -> None:
    """A 2-device job is started (the bandit logs its choice), runs where it was placed, and reports.
    The filler on both nodes (1 and 2 devices) makes them differ and neither idle, so the start
    has more than one arm."""
    await live.wait_for(
        lambda: "filler" in live.engine.source.book.jobs and {"n1", "n2"} <= set(live.engine.view.nodes),
        what="both nodes and the filler in the decider's view",
    )
    await live.job(job_id, gpus=2)
    [decision] = await live.wait_for(
        lambda: [d for d in live.decisions if d.action.job_id == job_id], what=f"a start for {job_id}"
    )
    await live.wait_for(lambda: [e for e in live.audited("bandit.decision") if e.job_id == job_id], what="its choice")
    await live.pool.execute(
        "UPDATE jobs SET status = 'running', placement = $2, attempt = 1, started_at = now(), progress = $3"
        " WHERE id = $1",
        job_id,
        [p.model_dump(mode="json") for p in decision.action.placement],
        {"step": 20, "step_time_s": step_time_s},
    )
    await live.bus.audit(
        AuditEvent(event_id=f"{job_id}:job.running", ts=time.time(), source="test", kind="job.running", job_id=job_id)
    )
    [reward] = await live.wait_for(
        lambda: [e for e in live.audited("bandit.reward") if e.job_id == job_id], what=f"a reward for {job_id}"
    )
    assert reward.decision_id == decision.decision_id


async def test_the_state_round_trips_and_an_older_token_cannot_overwrite_it(isolated):
    pool = await create_pool(service_url(isolated.database_url, "decider"))  # as the decider writes it
    try:
        store = BanditStore(pool)
        learner = Learner(0.1)
        shared, arms = {"g": 1.0}, [{"x": 0.0}, {"x": 1.0}]
        for _ in range(30):
            learner.learn(shared, arms, 1, 1.0, 0.5)
        assert (await store.save(learner.to_bytes(), learner.version, {"decisions": 30}, 7, "a")).written
        stored = await store.load()
        assert stored.version == 30 and stored.fence == 7 and stored.stats == {"decisions": 30}
        again = Learner(0.1, model=stored.model, version=stored.version)
        assert again.pmf(shared, arms) == learner.pmf(shared, arms)
        stale = await store.save(Learner(0.1).to_bytes(), 0, {}, 6, "old leader")
        assert not stale.written and (await store.load()).version == 30
        admin = await create_pool(isolated.database_url)
        await admin.execute("UPDATE bandit_state SET reset_requested_at = now(), reset_requested_by = 'admin'")
        await admin.close()
        asked = await store.save(learner.to_bytes(), 31, {}, 7, "a")
        assert asked.written and asked.reset_by == "admin"
        assert await store.reset(Learner(0.1).to_bytes(), 7, {}, "a")
        row = await pool.fetchrow("SELECT version, reset_requested_at FROM bandit_state")
        assert row["version"] == 0 and row["reset_requested_at"] is None
    finally:
        await pool.close()


async def test_a_restart_keeps_the_model_version(isolated, tmp_path):
    async with _live(isolated, tmp_path / "a") as a:
        await a.node("n1", gpus=8)
        await a.node("n2", gpus=8)
        await a.job(
            "filler", status="running", gpus=3, placement=[{"node": "n1", "gpus": [0]}, {"node": "n2", "gpus": [0, 1]}]
        )
        await _learn_once(a, "first")
        await a.wait_for_async(lambda: _has_version(a, 1), what="version 1 stored")
    admin = await create_pool(isolated.database_url)
    version = await admin.fetchval("SELECT version FROM bandit_state WHERE point = 'placement'")
    written = {r["point"] for r in await admin.fetch("SELECT point FROM bandit_state")}
    knobs = Learner(0.1)
    knobs.learn({"utilization": 1.0}, [{"configured": 1.0}, {"no_grow": 1.0}], 1, -0.5, 0.5)
    await admin.execute(  # decision point 3's learner, as a previous leader left it
        "UPDATE bandit_state SET model = $1, version = 9, stats = $2 WHERE point = 'knobs'",
        knobs.to_bytes(),
        {"decisions": 11, "rewarded": 9},
    )
    await admin.close()
    assert version >= 1 and written == {"placement", "memory", "knobs"}
    async with _live(isolated, tmp_path / "b") as b:
        await b.node("n1", gpus=8)
        await b.node("n2", gpus=8)
        await b.wait_for(lambda: b.engine.bandit.policy is not None and not b.engine.bandit._stale, what="a load")
        assert b.engine.bandit.policy.learner.version == version
        point = b.engine.bandit.policy.knobs
        assert point.learner.version == 9 and point.status()["decisions"] == 11


async def test_a_leader_failover_keeps_the_model_version(isolated, tmp_path):
    a = _live(isolated, tmp_path / "a", leases={"lease_s": 1.5})
    b = _live(isolated, tmp_path / "b", leases={"lease_s": 1.5})
    async with a, b:
        for live in (a, b):
            await live.node("n1", gpus=8)
            await live.node("n2", gpus=8)
        await a.job(
            "filler", status="running", gpus=3, placement=[{"node": "n1", "gpus": [0]}, {"node": "n2", "gpus": [0, 1]}]
        )
        [lead] = await a.wait_for(lambda: a.audited("decider.leading"), what="a leader")
        leader, other = (a, b) if lead.data["instance"] == a.engine.instance else (b, a)
        await _learn_once(leader, "first")
        await leader.wait_for_async(lambda: _has_version(leader, 1), what="version 1 stored")
        first_fence = await leader.pool.fetchval("SELECT fence FROM bandit_state")
        leader.stop.set()
        await leader.task
        version = await _stored_version(leader)
        await other.wait_for(
            lambda: [e for e in other.audited("decider.leading") if e.data["instance"] == other.engine.instance],
            what="the other instance leading",
        )
        await other.wait_for(lambda: not other.engine.bandit._stale, what="the new leader's load")
        assert other.engine.bandit.policy.learner.version == version
        await _learn_once(other, "second", step_time_s=0.5)
        await other.wait_for_async(lambda: _has_version(other, version + 1), what="the new leader's write")
        assert await other.pool.fetchval("SELECT fence FROM bandit_state") > first_fence


async def _has_version(live: LiveDecider, at_least: int) -> bool:
    version = await _stored_version(live)
    return version is not None and version >= at_least


async def test_a_config_reload_keeps_the_learner(isolated, tmp_path):
    async with _live(isolated, tmp_path / "a") as a:
        await a.node("n1", gpus=8)
        await a.node("n2", gpus=8)
        await a.job(
            "filler", status="running", gpus=3, placement=[{"node": "n1", "gpus": [0]}, {"node": "n2", "gpus": [0, 1]}]
        )
        await _learn_once(a, "first")
        policy = a.engine.bandit.policy
        learned = policy.learner.version
        a.config_doc["bandit"] = {**BANDIT, "mode": "active", "epsilon": 0.05}
        a.write_config()
        await a.wait_for(lambda: a.audited("config.reloaded"), what="the reload")
        await a.job("after", gpus=1)  # a pass after the reload
        await a.wait_for(lambda: [d for d in a.decisions if d.action.job_id == "after"], what="a pass")
        await asyncio.sleep(0.3)
        assert a.engine.bandit.policy is policy and policy.config.mode == "active"
        assert policy.learner.version == learned and policy.learner.epsilon == 0.05
