"""Every row of the job, node and protocol-step tables against Postgres: allowed moves land with
their history row, every other move is refused and changes nothing, a stale read is a conflict,
and the database's CHECKs refuse what the tables refuse even from raw SQL."""

from __future__ import annotations

import asyncpg
import pytest

from services.executor.node_store import NodeStore
from services.executor.protocol_store import ProtocolStore
from services.executor.store import JobStore, TransitionConflict
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import HOLDING_GPUS, NAMED, UNPLACED, InvalidTransition, JobStatus
from shared.contracts.messages import Device, Heartbeat
from shared.contracts.node_status import NODE_TRANSITIONS, InvalidNodeTransition, NodeStatus
from shared.contracts.protocol_steps import STEP_TRANSITIONS, InvalidStep, ProtocolKind, ProtocolState, Step
from tests.integration.executor.harness import unique

PLACED = [{"node": "n1", "gpus": [0]}]
FIELDS_FOR = {
    "placement": [NodeGpus(node="n2", gpus=(1,))],
    "job_dir": "/jobs/x",
    "started_at": 1.7e9,
    "finished_at": 1.7e9,
}


async def _job_in(ex, status: JobStatus) -> str:
    job_id = await ex.job()
    placement = PLACED if status in HOLDING_GPUS else None
    # Set up as the executor would have left it (a fixture, not a transition under test).
    await ex.pool.execute(
        "UPDATE jobs SET status = $2, placement = $3, attempt = 1 WHERE id = $1", job_id, status.value, placement
    )
    return job_id


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("status", list(JobStatus))
async def test_every_named_transition_from_every_status(ex, name, status):
    store = JobStore(ex.pool, ex.clock)
    t = NAMED[name]
    job = await store.get(await _job_in(ex, status))
    fields = {k: FIELDS_FOR[k] for k in t.requires if k != "placement" or job.placement is None or t.new_attempt}
    before = await ex.history(job.id)
    if status in t.sources:
        moved = await store.apply(job, name, reason=f"test {name}", decision_id="d1", **fields)
        assert moved.status == t.target and moved.status_reason == f"test {name}"
        assert moved.attempt == job.attempt + (1 if t.new_attempt else 0)
        if t.target in UNPLACED:
            assert moved.placement is None
        elif t.target in HOLDING_GPUS or job.placement is not None:  # a finished job keeps where it ran
            assert moved.placement is not None
        history = await ex.pool.fetch(
            "SELECT old_status, new_status, decision_id FROM job_status_history WHERE job_id = $1 ORDER BY id", job.id
        )
        assert [tuple(history[-1])] == [(status.value, t.target.value, "d1")]
    elif status == t.target:  # already there (a redelivery): nothing written
        assert await store.apply(job, name, reason="again", **fields) == job
        assert await ex.history(job.id) == before
    else:
        with pytest.raises(InvalidTransition, match=f"{name}: {status} -> {t.target}"):
            await store.apply(job, name, reason="refused", **fields)
        assert (await store.get(job.id)) == job and await ex.history(job.id) == before


async def test_a_stale_read_is_a_conflict_not_an_overwrite(ex):
    store = JobStore(ex.pool, ex.clock)
    stale = await store.get(await _job_in(ex, JobStatus.RUNNING))
    await store.apply(stale, "begin_checkpoint", reason="someone else first")
    with pytest.raises(TransitionConflict, match="expected running, found checkpointing"):
        await store.apply(stale, "finish", reason="too late", finished_at=1.7e9)
    assert (await store.get(stale.id)).status == JobStatus.CHECKPOINTING
    # Same status, but a newer attempt: also a conflict (the guard includes the attempt).
    job = await store.get(await _job_in(ex, JobStatus.CHECKPOINTING))
    moved = await store.apply(job, "migrate", reason="moved", placement=[NodeGpus(node="n2", gpus=(0,))])
    launched = await store.apply(moved, "launched", reason="up", job_dir="/j")
    await store.apply(launched, "started", reason="on", started_at=1.7e9)
    old_attempt = await store.get(job.id)
    await ex.pool.execute("UPDATE jobs SET attempt = attempt + 1 WHERE id = $1", job.id)
    with pytest.raises(TransitionConflict):
        await store.apply(old_attempt, "begin_checkpoint", reason="stale attempt")


async def test_a_transition_missing_what_its_target_needs_is_refused(ex):
    store = JobStore(ex.pool, ex.clock)
    job = await store.get(await ex.job())
    with pytest.raises(ValueError, match="schedule needs placement"):
        await store.apply(job, "schedule", reason="where?")
    with pytest.raises(ValueError, match="not job fields"):
        await store.apply(job, "schedule", reason="x", status="running")


async def test_the_database_refuses_an_edge_and_a_state_the_tables_do_not_have(ex):
    job_id = await ex.job()
    with pytest.raises(asyncpg.CheckViolationError, match="job_status_history_edge"):
        await ex.pool.execute(
            "INSERT INTO job_status_history (job_id, old_status, new_status) VALUES ($1, 'pending', 'running')", job_id
        )
    with pytest.raises(asyncpg.CheckViolationError, match="jobs_status_known"):
        await ex.pool.execute("UPDATE jobs SET status = 'exploded' WHERE id = $1", job_id)
    with pytest.raises(asyncpg.CheckViolationError, match="jobs_placed_when_holding"):
        await ex.pool.execute("UPDATE jobs SET status = 'running' WHERE id = $1", job_id)
    with pytest.raises(asyncpg.CheckViolationError, match="protocols_step_known"):
        await ex.pool.execute(
            "INSERT INTO protocols (id, job_id, kind, step) VALUES ($1, $1, 'migrate', 'dancing')", job_id
        )
    assert await ex.history(job_id) == ["pending"]  # the submitted row, written by the database


@pytest.mark.parametrize("old", list(NodeStatus))
@pytest.mark.parametrize("new", list(NodeStatus))
async def test_every_node_transition(ex, old, new):
    nodes = NodeStore(ex.pool, ex.clock)
    node = unique("tn-")
    await nodes.record_heartbeat(
        Heartbeat(node=node, ts=ex.clock.now(), started_at=ex.clock.now(), devices=[Device(index=0, kind="cpu")])
    )
    await ex.pool.execute("UPDATE nodes SET status = $2 WHERE id = $1", node, old.value)
    if new == old:
        assert await nodes.set_status(node, new) is None
    elif new in NODE_TRANSITIONS[old]:
        change = await nodes.set_status(node, new)
        assert (change.old, change.new) == (old, new) and await ex.node_status(node) == new
    else:
        with pytest.raises(InvalidNodeTransition, match=f"{old} -> {new}"):
            await nodes.set_status(node, new)
        assert await ex.node_status(node) == old


@pytest.mark.parametrize("old", list(Step))
@pytest.mark.parametrize("new", list(Step))
async def test_every_protocol_step(ex, old, new):
    protocols = ProtocolStore(ex.pool, ex.clock)
    pid = unique("p")
    _, proto = await protocols.begin(pid, unique("j"), ProtocolKind.MIGRATE, None, None, {})
    await ex.pool.execute("UPDATE protocols SET step = $2 WHERE id = $1", pid, old.value)
    proto = await protocols.get(pid)
    if new in STEP_TRANSITIONS[old]:
        assert (await protocols.advance(proto, new)).step == new
    else:
        with pytest.raises(InvalidStep):
            await protocols.advance(proto, new)
        assert (await protocols.get(pid)).step == old
    ended = await protocols.end(await protocols.get(pid), ProtocolState.DONE)
    assert ended.state == ProtocolState.DONE
    for step in STEP_TRANSITIONS[ended.step]:  # an ended protocol takes no step
        with pytest.raises(RuntimeError, match="no longer running"):
            await protocols.advance(ended, step)


async def test_one_running_protocol_per_job(ex):
    protocols = ProtocolStore(ex.pool, ex.clock)
    job = unique("j")
    assert (await protocols.begin(unique("p"), job, ProtocolKind.PAUSE, None, None, {}))[0] == "new"
    state, holder = await protocols.begin(unique("p"), job, ProtocolKind.MIGRATE, None, None, {})
    assert state == "busy" and holder.kind == ProtocolKind.PAUSE
