"""Migrations and the audit sink, against the real Postgres and NATS."""

import asyncio

import asyncpg
import pytest

from services.audit.sink import run_sink, write_event
from shared.contracts.messages import AuditEvent
from shared.infra.audit_chain import find_break
from shared.infra.db import connect, create_pool, migrate, service_url
from tests.waits import until_async


async def test_migrate_twice_is_a_noop(isolated):
    assert await migrate(isolated.database_url) == []  # the fixture already applied them all
    conn = await asyncpg.connect(isolated.database_url)
    try:
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")]
        from shared.infra.db import migration_files

        assert versions == [n for n, _ in migration_files()] and versions[:3] == [1, 2, 3]
    finally:
        await conn.close()


async def _rows(url):
    conn = await connect(url)
    try:
        return [dict(r) for r in await conn.fetch("SELECT * FROM audit_events ORDER BY id")]
    finally:
        await conn.close()


async def test_audit_is_append_only_and_chained(isolated):
    pool = await create_pool(isolated.database_url)
    try:
        for i in range(3):
            await write_event(
                pool,
                AuditEvent(
                    event_id=f"e{i}",
                    ts=1000.0 + i,
                    source="test",
                    kind="k",
                    evidence={"memory": [0.93, 0.94]},
                    data={"i": i},
                ),
            )
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await pool.execute("UPDATE audit_events SET reason = 'x' WHERE event_id = 'e1'")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await pool.execute("DELETE FROM audit_events")
        rows = await _rows(isolated.database_url)
        assert find_break(rows) is None
        # A superuser who disables the trigger can change a row, but the chain shows it.
        async with pool.acquire() as conn:
            await conn.execute("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete")
            await conn.execute("UPDATE audit_events SET evidence = '{\"memory\": [0.5]}' WHERE event_id = 'e1'")
        broken = find_break(await _rows(isolated.database_url))
        assert broken is not None and broken[0] == rows[1]["id"] and "altered" in broken[1]
    finally:
        await pool.close()


async def test_sink_writes_each_event_once_and_acks_after_commit(isolated):
    bus = await isolated.bus("audit-sink")
    pool = await create_pool(service_url(isolated.database_url, "audit-sink"))  # the sink's own role
    stop = asyncio.Event()
    try:
        events = [
            AuditEvent(event_id=f"ev{i}", ts=2000.0 + i, source="test", kind="decision", rule="r", reason=f"number {i}")
            for i in range(5)
        ]
        for e in events + events[:2]:  # two published twice, with the same ids
            await bus.publish_js(bus.subjects.audit, e, e.event_id + ":other-msg-id")
        sink = asyncio.create_task(run_sink(bus, pool, stop))

        async def consumed() -> bool:
            if len(await _rows(isolated.database_url)) < 5:  # the sink's consumer exists once it wrote
                return False
            info = await bus.js.consumer_info(bus.subjects.audit_stream, f"{isolated.prefix}-audit-sink")
            return info.num_ack_pending == 0 and info.num_pending == 0

        await until_async(consumed, "the sink wrote and acked every message", timeout=20)
        stop.set()
        await sink
        rows = await _rows(isolated.database_url)
        assert [r["event_id"] for r in rows] == [e.event_id for e in events]
        assert find_break(rows) is None
    finally:
        await bus.close()
        await pool.close()


async def test_the_pool_hands_a_connection_back_without_a_reset_round_trip_yet_rolls_back_an_open_transaction(
    isolated,
):
    pool = await create_pool(isolated.database_url, min_size=1, max_size=1)  # one connection: each acquire gets it
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            # Nothing in ADC sets a session setting on a pooled connection (tests/unit/test_architecture.py);
            # one made here shows whether asyncpg's RESET ALL ran at the release.
            await conn.execute("SET application_name = 'left-on-the-session'")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend
            assert await conn.fetchval("SHOW application_name") == "left-on-the-session"
            await conn.execute("RESET application_name")
            tr = conn.transaction()
            await tr.start()
            await conn.execute("CREATE TABLE left_open (n int)")  # never committed
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('left_open')") is None
    finally:
        await pool.close()
