"""Nodes through the bus: registration, cordon, drain, loss and return on the ManualClock,
and reconciliation of trainers the heartbeats do (not) list."""

from __future__ import annotations

import pytest

from shared.contracts.actions import Cordon, Drain, Uncordon


async def test_a_node_registers_with_its_first_heartbeat(ex):
    w = await ex.worker(gpus=3)
    row = await ex.pool.fetchrow("SELECT status, devices FROM nodes WHERE id = $1", w.node)
    assert row["status"] == "ready" and [d["index"] for d in row["devices"]] == [0, 1, 2]
    assert [a for a in ex.audited("node.registered") if a.node == w.node]


@pytest.mark.parametrize(
    "steps,ends,refused",
    [
        ([Cordon], "cordoned", False),
        ([Cordon, Uncordon], "ready", False),
        ([Uncordon], "ready", False),  # already ready: nothing to do, done
        ([Drain], "draining", False),  # marked only: the decider's drain rule moves the jobs, then cordons
        ([Drain, Uncordon], "ready", False),  # uncordoned mid-drain
        ([Drain, Cordon], "cordoned", False),  # what the drain rule sends once the node is empty
    ],
)
async def test_cordon_uncordon_drain(ex, steps, ends, refused):
    w = await ex.worker()
    for action in steps:
        state = await ex.settled(await ex.decide(action(node=w.node, reason="t")))
        assert state == ("refused" if refused else "done")
    assert await ex.node_status(w.node) == ends


async def test_a_drain_moves_nothing_itself(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    assert await ex.settled(await ex.decide(Drain(node=w.node, reason="t"))) == "done"
    assert await ex.node_status(w.node) == "draining" and (await ex.row(job_id))["status"] == "running"
    assert w.kinds(job_id) == ["start"]


async def test_a_lost_node_requeues_its_jobs_from_the_last_reported_checkpoint_and_returns_ready(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "checkpointed", 1, w.node, step=12, path=f"/s/jobs/{job_id}/output/checkpoint-12")
    await ex.until(lambda: _ckpt(ex, job_id, 12), "checkpoint")
    ex.clock.advance(ex.config.worker.node_timeout + 1)  # silence, on the executor's clock
    row = await ex.status_becomes(job_id, "pending")
    assert await ex.node_status(w.node) == "lost"
    assert row["resume_from"] == f"/s/jobs/{job_id}/output/checkpoint-12" and "was lost" in row["status_reason"]
    # A lost node takes no cordon (it has to come back first) ...
    assert await ex.settled(await ex.decide(Cordon(node=w.node, reason="t"))) == "refused"
    # ... and is ready again with its next heartbeat.
    w.running.clear()
    await w.beat()
    await ex.until(lambda: _ready(ex, w.node), "node back")
    # Audited after the change is committed: it may arrive a moment after the status reads ready.
    await ex.until(lambda: [a for a in ex.audited("node.ready") if a.node == w.node], "node.ready audited")
    for other in ex.workers:  # the others heard nothing meanwhile either: bring them back for later tests
        other.running.clear()
        await other.beat()


async def _ckpt(ex, job_id, step):
    return (await ex.row(job_id))["last_checkpoint_step"] == step


async def _beat_recorded(ex, node):
    at = await ex.pool.fetchval("SELECT extract(epoch FROM last_heartbeat) FROM nodes WHERE id = $1", node)
    return at is not None and float(at) >= ex.clock.now() - 0.01


async def _ready(ex, node):
    return await ex.node_status(node) == "ready"


async def test_a_trainer_the_heartbeats_stop_listing_is_requeued_after_the_grace(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    ex.clock.advance(2)
    w.running.pop(job_id)
    await w.beat()  # the node is alive but no longer runs the trainer (its exit event was lost)
    await ex.until_time_passes(lambda: ex.executor.nodes.missing_since, "missing trainer noticed")
    assert (await ex.row(job_id))["status"] == "running"  # within the grace: its exit may still come
    ex.clock.advance(ex.config.worker.node_timeout / 2)
    await w.beat()
    await ex.until(lambda: _beat_recorded(ex, w.node), "the heartbeat recorded")  # alive: the node is not lost
    ex.clock.advance(ex.config.worker.node_timeout / 2 + 1)  # the grace is over: the monitor requeues it
    row = await ex.status_becomes(job_id, "pending")
    assert "no longer runs its trainer" in row["status_reason"]


async def test_a_trainer_of_an_attempt_that_is_not_current_is_stopped(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    w.running[job_id] = 0  # the node still runs an old attempt too (it came back after a loss)
    w.running["j-unknown"] = 3
    await w.beat()
    # The node monitor's next check (on the executor's clock) stops both.
    await ex.until_time_passes(
        lambda: [c for c in w.commands if c.command_id == f"{job_id}:0:stale"], "stale trainer stopped"
    )
    await ex.until(lambda: [c for c in w.commands if c.command_id == "j-unknown:3:stale"], "unknown trainer stopped")
    assert [a for a in ex.audited("node.reconciled") if a.job_id == job_id]


async def test_a_returned_nodes_stale_trainer_is_stopped_only_once_its_row_says_it_is_back(ex):
    """Its first heartbeat back lists the trainer of an attempt requeued meanwhile; the node watch
    stops that trainer, and by then the node's row reads ready (the row's write may be slow: here
    another transaction holds the row until the watch has had a pass)."""
    w = await ex.worker()
    job_id = await ex.running_job(w)
    ex.clock.advance(ex.config.worker.node_timeout + 1)
    await ex.status_becomes(job_id, "pending")
    assert await ex.node_status(w.node) == "lost"
    async with ex.pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM nodes WHERE id = $1 FOR UPDATE", w.node)
        ex.clock.advance(1)
        await w.beat()  # still lists attempt 1, which is no longer current
        await ex.until(lambda: ex.executor.nodes.heard_at.get(w.node) == ex.clock.now(), "the heartbeat heard")
        await ex.executor.nodes.check()  # a pass of the node watch while the row still reads lost
        assert not [c for c in w.commands if c.command_id == f"{job_id}:1:stale"]
        assert not [a for a in ex.audited("node.reconciled") if a.job_id == job_id]
    await ex.until(lambda: _ready(ex, w.node), "node back")
    await ex.until_time_passes(
        lambda: [c for c in w.commands if c.command_id == f"{job_id}:1:stale"], "stale trainer stopped"
    )
    assert await ex.node_status(w.node) == "ready"
    w.running.clear()
    await w.beat()
