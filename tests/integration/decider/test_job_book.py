"""The decider's job view is kept from the bus, not re-read each pass: driven by the real executor
(with fake workers) on the real NATS and Postgres, it ends equal to a fresh read of Postgres
without a reconcile; a change whose message is lost is repaired by the periodic reconcile."""

from __future__ import annotations

import pytest
import pytest_asyncio

from services.decider.job_rows import job_from_row, live_statuses
from shared.contracts.actions import NodeGpus, Preempt, Start
from shared.contracts.messages import AuditEvent
from shared.infra.job_reads.rule_rows import rule_rows_in, rule_rows_of
from tests.integration.decider.live_decider import LiveDecider
from tests.integration.executor.harness import Harness


@pytest.fixture
def env(isolated):
    return isolated


@pytest_asyncio.fixture
async def ex(env):
    async with Harness(env) as harness:
        yield harness


async def fresh(live) -> dict:
    """The live jobs as a fresh read of Postgres gives them (what every pass did before)."""
    levels = {lv.name: lv.min_gpus for lv in live.engine.config.strategies.priority_scheduling.levels}
    rows = await rule_rows_in(live.pool, live_statuses())
    return {r["id"]: job_from_row(r, levels, live.engine.view.checkpoints) for r in rows}


async def submit(ex, gpus: int = 1) -> str:
    """A job as the api records it, with the api's two messages."""
    job_id = await ex.job(gpus=gpus)
    api = await ex.reporter("api")
    await api.audit(
        AuditEvent(
            event_id=f"{job_id}:submitted",
            ts=ex.clock.now(),
            source="api",
            kind="job.submitted",
            job_id=job_id,
            reason="test",
        )
    )
    await ex.event(job_id, "submitted", 0)  # as the api, signed
    return job_id


async def converged(live) -> dict:
    last: dict = {}

    async def same():
        last["truth"] = truth = await fresh(live)
        return truth if dict(live.engine.source.book.jobs) == truth else None

    try:
        return await live.wait_for_async(same, what="the job view equal to a fresh read")
    except AssertionError:
        book, truth = dict(live.engine.source.book.jobs), last.get("truth", {})
        differ = {j: (book.get(j), truth.get(j)) for j in book.keys() | truth.keys() if book.get(j) != truth.get(j)}
        raise AssertionError(f"the job view differs from a fresh read: {differ}") from None


async def free_devices_are(live, worker, free: tuple[int, ...]) -> None:
    """The snapshot's free devices follow the book (they are derived from its placements)."""
    await worker.beat()  # the decider may have subscribed after the worker's first heartbeat
    node = worker.node

    def snapshot_says():
        snap = live.engine.last_snapshot
        return snap is not None and node in snap.nodes and snap.nodes[node].free == free

    await live.wait_for(snapshot_says, what=f"{node} with free devices {free}")


async def paused_decider(env, tmp_path, **decider) -> LiveDecider:
    # No lease: the test itself sends the executor its decisions (the executor fences off decisions
    # older than a leading decider's).
    live = LiveDecider(env, tmp_path, leases={"enabled": False}, **decider)
    await live.__aenter__()
    await live.pool.execute("UPDATE controller_state SET paused = true, reason = 'the test drives the executor'")
    return live


async def test_the_view_follows_the_executor_and_equals_a_fresh_read(env, ex, tmp_path):
    live = await paused_decider(env, tmp_path, reconcile_s=3600)
    try:
        w = await ex.worker()
        running, done, waiting = await submit(ex), await submit(ex), await submit(ex, gpus=2)
        for job_id, gpu in ((running, 0), (done, 1)):
            await ex.settled(
                await ex.decide(Start(job_id=job_id, reason="t", placement=[NodeGpus(node=w.node, gpus=(gpu,))]))
            )
            await ex.event(job_id, "started", 1, w.node)
            await ex.status_becomes(job_id, "running")
        await ex.event(
            running, "progress", 1, w.node, step=12, max_steps=100, step_time_s=0.5, peak_memory_bytes=3 * 2**30
        )
        await ex.event(running, "checkpointed", 1, w.node, step=10, path=f"/jobs/{running}/output/checkpoint-10")
        # One the executor refuses (not in the job's folder): the view keeps what the executor kept.
        await ex.event(running, "checkpointed", 1, w.node, step=15, path="/elsewhere/checkpoint-15")
        await ex.event(done, "exited", 1, w.node, exit_code=0, outcome="succeeded")
        await ex.status_becomes(done, "succeeded")
        view = await converged(live)
        assert set(view) == {running, waiting}  # the finished job left the view
        w.running.pop(done, None)
        await free_devices_are(live, w, (1,))  # the finished job's device is free again, the running one's not
        assert view[running].step == 12 and view[running].max_steps == 100 and view[running].last_checkpoint_step == 10
        assert view[running].last_checkpoint_at is not None and view[waiting].status == "pending"

        # A preemption moves it through checkpointing back to the queue, with its checkpoint to resume from.
        await ex.settled(await ex.decide(Preempt(job_id=running, reason="t")))
        view = await converged(live)
        assert view[running].status == "pending" and view[running].resume_from.endswith("checkpoint-20")
        await free_devices_are(live, w, (0, 1))
        book = live.engine.source.book
        assert book.reconciles == 1 and book.repaired == 0  # the first read only: the rest came from the bus
    finally:
        await live.__aexit__(None, None, None)


async def test_lost_messages_are_repaired_by_the_periodic_reconcile(env, ex, tmp_path):
    live = await paused_decider(env, tmp_path, reconcile_s=1.0)
    try:
        book = live.engine.source.book
        await live.wait_for(lambda: book.reconciles, what="the first read")
        # A submission whose messages were both lost (nothing on the bus ever names this job):
        job_id = await ex.job()
        await live.wait_for(lambda: job_id in book.jobs, what="the job found by a reconcile")
        assert book.repaired == 1
        # and a change nobody announces: the view is wrong until the next reconcile.
        await ex.pool.execute("UPDATE jobs SET status = 'cancelled', status_reason = 'lost' WHERE id = $1", job_id)
        await live.wait_for(lambda: job_id not in book.jobs, what="the job gone after a reconcile")
        assert book.repaired == 2 and dict(book.jobs) == await fresh(live)
    finally:
        await live.__aexit__(None, None, None)


async def test_a_move_request_audited_before_its_commit_still_reaches_the_snapshot(env, ex, tmp_path):
    """The api audits a move request inside its transaction: the decider may look before the commit."""
    live = await paused_decider(env, tmp_path, reconcile_s=3600)
    try:
        job_id = await submit(ex)
        await converged(live)
        async with ex.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO move_requests (id, job_id, target_node, actor, reason)"
                " VALUES ('req-1', $1, NULL, 'admin', 'test')",
                job_id,
            )
            await (await ex.reporter("api")).audit(
                AuditEvent(
                    event_id="req-1:requested",
                    ts=ex.clock.now(),
                    source="api",
                    kind="job.move_requested",
                    job_id=job_id,
                    reason="test",
                    data={"request_id": "req-1"},
                )
            )
            passes = live.engine.source.book.reconciles, id(live.engine.last_snapshot)
            await live.wait_for(lambda: id(live.engine.last_snapshot) != passes[1], what="a pass before the commit")
        await live.wait_for(
            lambda: [r for r in live.engine.last_snapshot.move_requests if r.id == "req-1"],
            what="the request in a snapshot after the commit",
        )
    finally:
        await live.__aexit__(None, None, None)


async def test_rules_see_the_batch_and_gradient_checkpointing_a_start_will_get(ex):
    """spec.train with train_overrides laid over it, as the next start gets them."""

    async def read(job_id):
        [row] = await rule_rows_of(ex.pool, [job_id])
        return row

    plain = await ex.job()
    off = await ex.job()
    await ex.pool.execute(
        "UPDATE jobs SET spec = jsonb_set(spec, '{train,disable_gradient_checkpointing}', 'true') WHERE id = $1", off
    )
    overridden = await ex.job()
    await ex.pool.execute(
        "UPDATE jobs SET spec = jsonb_set(spec, '{train,disable_gradient_checkpointing}', 'true'),"
        ' train_overrides = \'{"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,'
        ' "disable_gradient_checkpointing": false}\' WHERE id = $1',
        overridden,
    )
    views = {j: job_from_row(await read(j), {}, {}) for j in (plain, off, overridden)}
    assert (views[plain].micro_batch, views[plain].grad_accum, views[plain].gradient_checkpointing) == (4, None, True)
    assert views[off].gradient_checkpointing is False
    assert (views[overridden].micro_batch, views[overridden].grad_accum) == (2, 2)
    assert views[overridden].gradient_checkpointing is True
