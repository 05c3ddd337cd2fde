"""The job book's periodic reconcile reads every live job beside the passes, on the real Postgres:
no pass waits for it, a later pass takes its result over, and what the view heard from the bus
while it ran (a trainer's progress) is not put back to the older read, nor counted as a repair."""

from __future__ import annotations

from services.decider.job_book import JobBook
from shared.infra.db import create_pool, service_url


async def test_a_reconcile_read_beside_the_passes_keeps_what_the_bus_said_meanwhile(isolated):
    admin = await create_pool(isolated.database_url)
    pool = await create_pool(service_url(isolated.database_url, "decider"))
    try:
        for job_id, node in (("a", "n1"), ("b", "n2")):
            await admin.execute(
                "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, status,"
                " attempt, placement, started_at) VALUES ($1, $1, 't', 'default', 'low', 1, 1, true, '{}', 'running',"
                " 1, $2, now())",
                job_id,
                [{"node": node, "gpus": [0]}],
            )
        book = JobBook(pool, reconcile_s=10.0, checkpoints={})
        await book.refresh(0.0, {})  # the first read is whole, within the pass
        assert set(book.jobs) == {"a", "b"} and book.reconciles == 1

        await admin.execute("UPDATE jobs SET status = 'cancelled' WHERE id = 'b'")  # a change no message told
        await book.refresh(10.0, {})  # due: the read starts beside this pass, which does not wait for it
        read = book._background
        assert read is not None and book.reconciles == 1 and "b" in book.jobs
        book.progress("a", 1, "n1", {"step": 42, "step_time_s": 0.5})  # heard before the read has its rows
        await read
        assert book.reconciles == 1  # read, not yet taken over
        await book.refresh(11.0, {})  # the next pass takes it over
        assert book.reconciles == 2 and "b" not in book.jobs  # the lost change repaired ...
        assert book.jobs["a"].step == 42  # ... and the newer progress kept (Postgres has none for it)
        assert book.repaired == 1
    finally:
        await pool.close()
        await admin.close()
