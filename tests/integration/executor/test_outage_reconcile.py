"""What the executor makes of nodes after Postgres was away (no heartbeat could be written) or
after it restarted (it has heard nothing yet): a node heard from lately is not lost however stale
its row, a fresh executor calls no node silent before it has listened a whole node timeout, and
a trainer its node lists as finished is left to its exit event, never requeued. Once, a job that
finished during an outage was requeued both ways and trained past its max_steps."""

from __future__ import annotations

from shared.infra.clock import utc


async def _beat_heard(ex, w) -> None:
    await w.beat()
    # Heard, and its trainers taken in (after its row is written, or its write skipped or failed).
    await ex.until(lambda: _taken_in(ex, w.node), "the heartbeat heard")


def _taken_in(ex, node: str) -> bool:
    beat = ex.executor.nodes.last_beat.get(node)
    return ex.executor.nodes.heard_at.get(node) == ex.clock.now() and beat is not None and beat.ts == ex.clock.now()


async def _row_written_at(ex, node: str, ts: float) -> bool:
    written = await ex.pool.fetchval("SELECT last_heartbeat FROM nodes WHERE id = $1", node)
    return written is not None and abs(written.timestamp() - ts) < 1e-3


async def _make_row_stale(ex, node: str, age_s: float) -> None:
    """The node's row as an outage leaves it: its last recorded heartbeat long ago."""
    await ex.pool.execute("UPDATE nodes SET last_heartbeat = $2 WHERE id = $1", node, utc(ex.clock.now() - age_s))


async def test_a_trainer_listed_as_finished_is_left_to_its_exit_event(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    ex.clock.advance(2)
    w.running.pop(job_id)
    w.finished[job_id] = (1, "succeeded")  # ended while its exit could not be recorded yet
    timeout = ex.config.worker.node_timeout
    for _ in range(4):  # twice the grace after which a trainer that is simply missing is requeued
        ex.clock.advance(timeout / 2)
        await _beat_heard(ex, w)
        await ex.executor.nodes.check()  # a pass of the node watch, now
    assert (await ex.row(job_id))["status"] == "running"
    assert (job_id, 1) not in ex.executor.nodes.missing_since
    await ex.event(job_id, "exited", 1, w.node, outcome="succeeded", exit_code=0, last_event={"step": 30})
    row = await ex.status_becomes(job_id, "succeeded")
    assert row["attempt"] == 1 and row["progress"]["step"] == 30
    assert await ex.history(job_id) == ["pending", "scheduled", "starting", "running", "succeeded"]


async def test_a_node_heard_from_lately_is_not_lost_however_stale_its_row(ex):
    ex.clock.advance(ex.config.worker.node_timeout + 1)  # the executor has listened long enough to call nodes silent
    assert ex.clock.now() - ex.executor.nodes.listening_since > ex.config.worker.node_timeout
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await _beat_heard(ex, w)
    # Its row written (the clock stands still: within the write throttle no later beat rewrites it).
    await ex.until(lambda: _row_written_at(ex, w.node, ex.clock.now()), "the heartbeat's row written")
    await _make_row_stale(ex, w.node, 100)
    await ex.executor.nodes.check()  # a pass of the node watch, now
    assert await ex.node_status(w.node) == "ready"
    row = await ex.row(job_id)
    assert row["status"] == "running", row["status_reason"]


async def test_a_fresh_executor_calls_no_node_silent_before_listening_a_node_timeout(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.stop_executor()
    await _make_row_stale(ex, w.node, 100)  # the outage: nothing written for a long time
    await ex.start_executor()
    await ex.until(lambda: ex.executor.fence.leading and ex.executor._leading is not None, "the new executor leading")
    await ex.executor.nodes.check()  # a pass of the node watch, now
    assert await ex.node_status(w.node) == "ready" and (await ex.row(job_id))["status"] == "running"
    # Truly silent for a whole node timeout of listening: now it is lost.
    ex.clock.advance(ex.config.worker.node_timeout + 1)
    await ex.status_becomes(job_id, "pending")
    assert await ex.node_status(w.node) == "lost"
    w.running.clear()
    await w.beat()  # back, for whatever runs after
    await ex.until(lambda: ex.node_status(w.node), "node row")


async def test_a_trainer_started_while_the_node_watch_reads_its_jobs_is_not_stopped(ex):
    """The node watch reads the jobs of the trainers its heartbeats list; a beat arriving during that
    read lists a trainer started since. Once, that trainer (a job just placed, its first attempt) was
    taken for one without a job and stopped, and its exit cancelled the job."""
    w = await ex.worker(gpus=2)
    first = await ex.running_job(w)
    ex.clock.advance(1)
    await _beat_heard(ex, w)
    watch = ex.executor.nodes
    before = watch.last_beat[w.node]  # lists only `first`
    second = await ex.running_job(w, gpus=(1,))
    watch.last_beat[w.node] = before
    read = watch.store.by_ids

    async def read_while_a_beat_arrives(ids):
        jobs = await read(ids)
        ex.clock.advance(1)
        await _beat_heard(ex, w)  # now lists `second` too
        return jobs

    watch.store.by_ids = read_while_a_beat_arrives
    try:
        await watch.reconcile()
    finally:
        watch.store.by_ids = read
    assert "cancel" not in w.kinds(second) and "cancel" not in w.kinds(first), w.commands
    assert not ex.audited("node.reconciled")
    assert (await ex.row(second))["status"] == "running"
