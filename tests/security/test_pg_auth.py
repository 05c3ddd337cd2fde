"""The Postgres `adc up` starts trusts no connection: code in a trainer shares the host's network,
and once logged in as `postgres` (trust authentication) it inserted an admin token, read other
teams' files with `pg_read_file` and ran commands with `COPY ... FROM PROGRAM`.

Against a real stack with its own Postgres (the path `adc up` takes without DATABASE_URL): a
connection without a password is refused, by TCP and by the Unix socket; each service connects
as its own role with its own generated password, none as the superuser; and the api's password
gives nothing beyond the api's grants.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

import asyncpg
import pytest
import yaml

from cli.local_services import LocalPostgres, _as_postgres_user, _pg_bin
from cli.stack import Stack, StackOptions
from shared.infra.db import SERVICE_ROLES, role_password, service_url
from tests.conftest import REPO_ROOT, Isolated

REFUSED = (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)


def reachable_folder(prefix: str) -> Path:
    """A folder the postgres user can reach (Postgres runs as it when we are root; pytest's are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def stack():
    env = Isolated(nodes=("node-1",)).open()
    home = reachable_folder("adc-pgauth-")
    s = Stack(
        StackOptions(
            home=home,
            workers=1,
            api_port=0,
            nats_url=env.nats_url,
            bus_credentials=env.keys.directory,
            database_url=None,
            prefix=env.prefix,
            roots=[REPO_ROOT],
        )
    )
    try:
        s.start(progress=lambda line: None)
        yield s
    finally:
        s.stop()
        env.close()
        shutil.rmtree(home, ignore_errors=True)


def run(coro):
    return asyncio.run(coro)


async def _try(url: str, **kw) -> None:
    conn = await asyncpg.connect(url, timeout=10, **kw)
    await conn.close()


def test_a_connection_without_a_password_is_refused(stack):
    port = stack._pg.port
    for role in ("postgres", *SERVICE_ROLES.values(), "adc_migrate"):
        with pytest.raises(REFUSED):
            run(_try(f"postgresql://{role}@127.0.0.1:{port}/adc"))
        with pytest.raises(REFUSED):  # the Unix socket too
            run(_try(f"postgresql://{role}@/adc?host={stack._pg.data_dir}&port={port}"))
    with pytest.raises(REFUSED):
        run(_try(f"postgresql://postgres:wrong@127.0.0.1:{port}/adc"))
    hba = (stack._pg.data_dir / "pg_hba.conf").read_text()
    assert "trust" not in [line.split()[-1] for line in hba.splitlines() if line.strip() and not line.startswith("#")]


def test_every_password_is_generated_and_owner_only(stack):
    folder = stack.db_passwords
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(f"{r}.password" for r in ("postgres", *SERVICE_ROLES.values()))
    secrets = [(folder / n).read_text().strip() for n in names]
    assert len(set(secrets)) == len(secrets) and all(len(s) >= 32 for s in secrets)
    assert all((folder / n).stat().st_mode & 0o077 == 0 for n in names) and folder.stat().st_mode & 0o077 == 0
    config = yaml.safe_load((stack.home / "adc_config.yaml").read_text())
    text = (stack.home / "adc_config.yaml").read_text()
    assert not any(s in text for s in secrets), "a password in the services' config"
    assert config["database"]["passwords_dir"] == str(folder)


def test_services_connect_as_their_own_roles_never_as_the_superuser(stack):
    async def who() -> set[str]:
        conn = await asyncpg.connect(stack.database_url)
        try:
            for _ in range(100):  # the audit sink and the api connect when they start; all are up by now
                rows = await conn.fetch(
                    "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'adc'"
                    " AND pid <> pg_backend_pid() AND usename IS NOT NULL"
                )
                names = {r["usename"] for r in rows}
                if {"adc_api", "adc_executor", "adc_decider", "adc_audit"} <= names:
                    return names
                await asyncio.sleep(0.2)
            return names
        finally:
            await conn.close()

    assert run(who()) == {"adc_api", "adc_executor", "adc_decider", "adc_audit"}


def test_the_api_roles_password_gives_nothing_beyond_the_apis_grants(stack):
    url = service_url(stack._pg.url, "api", str(stack.db_passwords))

    async def probe() -> dict[str, str]:
        conn = await asyncpg.connect(url)
        found = {}
        try:
            assert await conn.fetchval("SELECT current_user") == "adc_api"
            assert not await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            for name, sql in {
                "role passwords": "SELECT rolpassword FROM pg_authid",
                "a server file": "SELECT pg_read_file('postgresql.conf')",
                "a command": "COPY (SELECT 1) TO PROGRAM 'id'",
                "the audit role's insert": "INSERT INTO audit_events (event_id, ts, source, kind) VALUES"
                " ('x', now(), 'x', 'x')",
                "the executor's job status": "UPDATE jobs SET status = 'running'",
                "another role": "SET ROLE adc_executor",
            }.items():
                try:
                    await conn.execute(sql)
                    found[name] = "allowed"
                except asyncpg.PostgresError as err:
                    found[name] = type(err).__name__
        finally:
            await conn.close()
        return found

    found = run(probe())
    assert found == {name: "InsufficientPrivilegeError" for name in found}, found


def test_a_cluster_made_with_trust_is_given_passwords_at_its_next_start():
    """A home an older `adc up` made: initdb -A trust, no superuser password."""
    tmp_path = reachable_folder("adc-pgtrust-")
    data, secrets = tmp_path / "pg", tmp_path / "secrets"
    pg = LocalPostgres(data, tmp_path / "postgres.log", secrets)
    data.mkdir()
    subprocess.run(["chown", "postgres:postgres", str(data)], check=True)
    subprocess.run(
        _as_postgres_user([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-instructions"]),
        check=True,
        capture_output=True,
    )
    try:
        admin = pg.start()
        run(_try(admin.rsplit("/", 1)[0] + "/postgres"))  # the generated password works
        with pytest.raises(REFUSED):
            run(_try(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"))
        assert role_password(str(secrets), "postgres") and "trust" not in (data / "pg_hba.conf").read_text()
    finally:
        pg.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)
