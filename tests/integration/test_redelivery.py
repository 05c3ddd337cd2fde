"""What a consumer does with a message it cannot handle, on real NATS and a real Postgres:
while a dependency is down the message comes back, backing off, for as long as the outage
lasts (once, JetStream dropped it after 20 tries and a finished job's exit was never recorded);
a message that fails on its own is dead-lettered, audited, and the consumer moves on.

Each party connects as its bus role: a worker publishes the job events, the executor consumes
them with its own durable consumer, the admin (an operator) reads the dead letters."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from cli.local_services import LocalPostgres
from shared.contracts.messages import AuditEvent
from shared.infra.bus import Bus, Redelivery, consume
from tests.waits import until_async


async def _parties(isolated) -> tuple[Bus, Bus, Bus]:
    return await isolated.bus("executor"), await isolated.bus("worker-n1"), await isolated.bus("admin")


@pytest.fixture
def private_postgres():
    """A Postgres of this test's own, so it can really be stopped (the shared one serves others)."""
    folder = Path(tempfile.mkdtemp(prefix="adc-outage-", dir="/tmp"))
    folder.chmod(0o755)  # Postgres runs as the postgres user when we are root
    pg = LocalPostgres(folder / "pg", folder / "postgres.log", folder / "secrets")
    try:
        yield pg, pg.start().rsplit("/", 1)[0] + "/postgres"
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_message_outlives_a_postgres_outage_of_any_length(isolated, private_postgres):
    pg, url = private_postgres
    bus, worker, admin = await _parties(isolated)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    await pool.execute("CREATE TABLE seen (n int PRIMARY KEY)")
    deliveries: Counter[int] = Counter()

    async def handler(msg) -> None:
        n = int(msg.data)
        deliveries[n] += 1
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO seen VALUES ($1) ON CONFLICT DO NOTHING", n)
        await msg.ack()

    stop = asyncio.Event()
    subject = bus.subjects.job_events("outage", "n1")
    task = asyncio.create_task(
        consume(
            bus,
            bus.subjects.jobs_stream,
            subject,
            bus.subjects.consumer("executor-jobs"),
            handler,
            stop,
            redelivery=Redelivery(outage_first_s=0.05, outage_max_s=0.2, poison_after=3),
        )
    )
    try:
        await asyncio.to_thread(pg.stop)
        for n in (1, 2, 3):
            await worker.js.publish(subject, str(n).encode())
        # Far past the 20 deliveries JetStream used to allow, and past poison_after: still kept.
        await until_async(lambda: min(deliveries.values(), default=0) > 25, "25 deliveries during the outage", 60)
        await asyncio.to_thread(pg.start)

        async def all_stored() -> bool:
            try:
                return {r["n"] for r in await pool.fetch("SELECT n FROM seen")} == {1, 2, 3}
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):  # Postgres still coming back
                return False

        await until_async(all_stored, lambda: f"rows 1, 2, 3 stored once Postgres is back: {deliveries}", 60)
        dead = await admin.js.stream_info(admin.subjects.dead_letter_stream)
        assert dead.state.messages == 0
    finally:
        stop.set()
        await task
        await pool.close()
        for b in (bus, worker, admin):
            await b.close()


async def test_a_poison_message_is_dead_lettered_audited_and_passed(isolated):
    bus, worker, admin = await _parties(isolated)
    calls: Counter[bytes] = Counter()
    done: list[bytes] = []
    hooked: list[tuple[bytes, str]] = []

    async def handler(msg) -> None:
        calls[msg.data] += 1
        if msg.data == b"bad":
            raise ValueError("cannot store \x00 in text\nsecond line")
        done.append(msg.data)
        await msg.ack()

    async def on_dead_letter(msg, err) -> None:
        hooked.append((msg.data, str(err)))

    stop = asyncio.Event()
    subject = bus.subjects.job_events("poison", "n1")
    durable = bus.subjects.consumer("executor-jobs")
    task = asyncio.create_task(
        consume(
            bus,
            bus.subjects.jobs_stream,
            subject,
            durable,
            handler,
            stop,
            redelivery=Redelivery(retry_s=0.05, poison_after=3),
            on_dead_letter=on_dead_letter,
        )
    )
    try:
        await worker.js.publish(subject, b"bad")
        await worker.js.publish(subject, b"good")
        await until_async(lambda: hooked and b"good" in done, "the dead letter and the good message", 30)

        async def settled() -> bool:  # nothing left to deliver: a terminated message does not come back
            info = await bus.js.consumer_info(bus.subjects.jobs_stream, durable)
            return info.num_pending == 0 and info.num_ack_pending == 0

        await until_async(settled, "the consumer with nothing pending or unacked")
        assert calls[b"bad"] == 3 and done == [b"good"] and len(hooked) == 1
        dead = await admin.js.get_last_msg(admin.subjects.dead_letter_stream, admin.subjects.dead_letters(durable))
        assert dead.data == b"bad"
        assert dead.headers["Adc-Subject"] == subject
        assert dead.headers["Adc-Error"].startswith("ValueError: cannot store  in text second line")
        audit = await admin.js.get_last_msg(admin.subjects.audit_stream, admin.subjects.audit)
        event = AuditEvent.decode(audit.data)
        assert event.kind == "message.dead_lettered" and event.data["deliveries"] == 3
        assert event.data["subject"] == subject and "\x00" not in event.reason
    finally:
        stop.set()
        await task
        for b in (bus, worker, admin):
            await b.close()
