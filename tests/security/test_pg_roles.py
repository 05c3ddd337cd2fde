"""Each service's Postgres role (migrations/015_roles.sql) can do its job and nothing past it,
on the real Postgres: the api records requests but cannot change a job's status; only the audit
sink inserts audit rows, and nobody can rewrite them; no service role can disable or drop the
audit trail's triggers, which only the migration role (their owner) may alter."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from shared.infra.db import SERVICE_ROLES, connect, service_url

SERVICES = tuple(SERVICE_ROLES)  # api, decider, executor, audit-sink
TRIGGERS = ("audit_events_no_update_delete", "audit_events_no_truncate")


@pytest.fixture(scope="module")
def db():
    from tests.conftest import Isolated

    env = Isolated().open()
    env.sql(
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec)"
        " VALUES ('j1', 'j1', 'alice', 'alpha', 'low', 1, 1, true, '{}')"
    )
    yield env
    env.close()


def run_as(db, service: str, sql: str, *args):
    """One statement as a service's own role, in a transaction that is rolled back."""

    async def go():
        conn = await connect(service_url(db.database_url, service))
        try:
            tx = conn.transaction()
            await tx.start()
            try:
                return await conn.fetch(sql, *args)
            finally:
                await tx.rollback()
        finally:
            await conn.close()

    return asyncio.run(go())


def audit_insert(event_id: str) -> str:
    return (
        "INSERT INTO audit_events (event_id, ts, source, kind, prev_hash, hash)"
        f" VALUES ('{event_id}', now(), 'forger', 'job.succeeded', 'x', 'y')"
    )


def test_each_service_connects_as_its_own_role(db):
    for service, role in SERVICE_ROLES.items():
        assert run_as(db, service, "SELECT current_user AS u")[0]["u"] == role


def test_the_api_records_a_submission_but_cannot_change_a_jobs_status(db):
    inserted = run_as(
        db,
        "api",
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible,"
        " spec) VALUES ('j2', 'j2', 'bob', 'beta', 'low', 1, 1, true, '{}') RETURNING status",
    )
    assert inserted[0]["status"] == "pending"
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        run_as(db, "api", "UPDATE jobs SET status = 'running' WHERE id = 'j1'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):  # nor submit one that starts out running
        run_as(
            db,
            "api",
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec,"
            " status) VALUES ('j3', 'j3', 'bob', 'beta', 'low', 1, 1, true, '{}', 'running')",
        )
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        run_as(
            db,
            "api",
            "INSERT INTO job_status_history (job_id, old_status, new_status, reason)"
            " VALUES ('j1', 'pending', 'succeeded', 'forged')",
        )
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        run_as(db, "decider", "UPDATE jobs SET status = 'running' WHERE id = 'j1'")
    # The executor, the one writer of job state, can.
    assert run_as(db, "executor", "UPDATE jobs SET cancel_requested = true WHERE id = 'j1' RETURNING id")


def test_only_the_audit_sink_inserts_audit_rows_and_nobody_rewrites_them(db):
    for service in ("api", "decider", "executor"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            run_as(db, service, audit_insert(f"forged-by-{service}"))
    assert run_as(db, "audit-sink", audit_insert("written-by-the-sink") + " RETURNING id")
    for service in SERVICES:
        for sql in (
            "UPDATE audit_events SET reason = 'rewritten'",
            "DELETE FROM audit_events",
            "TRUNCATE audit_events",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                run_as(db, service, sql)


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_role_can_alter_or_drop_the_audit_triggers(db, service):
    for trigger in TRIGGERS:
        for sql in (
            f"ALTER TABLE audit_events DISABLE TRIGGER {trigger}",
            f"DROP TRIGGER {trigger} ON audit_events",
            f"ALTER TRIGGER {trigger} ON audit_events RENAME TO gone",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                run_as(db, service, sql)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        run_as(
            db,
            service,
            "CREATE OR REPLACE FUNCTION audit_events_append_only() RETURNS trigger"
            " AS $$ BEGIN RETURN NEW; END; $$ LANGUAGE plpgsql",
        )


def test_the_migration_role_owns_the_audit_triggers(db):
    async def go():
        conn = await asyncpg.connect(db.database_url.replace("postgres@", "adc_migrate@", 1))
        try:
            async with conn.transaction():
                await conn.execute("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete")
                await conn.execute("ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update_delete")
            return await conn.fetchval("SELECT tableowner FROM pg_tables WHERE tablename = 'audit_events'")
        finally:
            await conn.close()

    assert asyncio.run(go()) == "adc_migrate"


def test_migrating_many_databases_at_once_shares_the_roles(db):
    """Roles are cluster-wide: creating them is idempotent, and parallel migrations do not trip on each other."""
    from tests.conftest import _create_db, _drop_db

    names = [f"{db.db_name}_p{i}" for i in range(3)]

    async def together():
        return await asyncio.gather(*(_create_db(n) for n in names))

    try:
        urls = asyncio.run(together())
        for url in urls:

            async def whoami(u=url):
                conn = await connect(service_url(u, "api"))
                try:
                    return await conn.fetchval("SELECT current_user")
                finally:
                    await conn.close()

            assert asyncio.run(whoami()) == "adc_api"
    finally:
        for n in names:
            asyncio.run(_drop_db(n))
