"""The Postgres pool every service uses, and the migration runner behind `adc db migrate`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
_MIGRATION_LOCK = 7_420_001  # advisory lock id: one migrator at a time
ROLE_GRANTS = Path("roles") / "grants.sql"  # beside the migrations: who may do what; applied after every run


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class PooledConnection(asyncpg.Connection):
    """A pool's connection, handed back without asyncpg's reset query (unlock advisory locks, close
    cursors, UNLISTEN, RESET ALL: a round trip on every pool call). ADC keeps no session state on a
    pooled connection: its advisory locks are transaction-scoped, LISTEN has a connection of its own,
    cursors live inside transactions and nothing runs a session-level SET (the architecture tests
    hold the code to that). asyncpg still rolls back a transaction left open."""

    def get_reset_query(self) -> str:
        return ""


async def create_pool(url: str, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, connection_class=PooledConnection
    )


async def connect(url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(url)
    await _init_connection(conn)
    return conn


# Each service's own Postgres role (migrations/015_roles.sql).
SERVICE_ROLES = {"api": "adc_api", "decider": "adc_decider", "executor": "adc_executor", "audit-sink": "adc_audit"}


def service_url(url: str, service: str, passwords_dir: str | None = None) -> str:
    """The URL a service connects with: `url`'s server and database, as the service's own role.
    No password is carried over from `url` (that one is the administrator's): the role's own is
    read from `<passwords_dir>/<role>.password` (written by `adc secrets init --db-passwords` or by
    `adc up`, set by `adc db migrate`), else from the service's pgpass file."""
    parsed = urlsplit(url)
    host = parsed.hostname or ""
    role = SERVICE_ROLES[service]
    secret = role_password(passwords_dir, role) if passwords_dir else None
    netloc = f"{role}{':' + quote(secret, safe='') if secret else ''}@{'[' + host + ']' if ':' in host else host}"
    if parsed.port:
        netloc += f":{parsed.port}"
    return urlunsplit(parsed._replace(netloc=netloc))


def role_password(passwords_dir: str, role: str) -> str | None:
    path = Path(passwords_dir) / f"{role}.password"
    return path.read_text().strip() if path.is_file() else None


def ensure_role_passwords(passwords_dir: str | Path) -> list[str]:
    """A generated password file (owner-only) for each service role that has none; the roles minted."""
    import os
    import secrets

    folder = Path(passwords_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    minted = []
    for role in SERVICE_ROLES.values():
        path = folder / f"{role}.password"
        if path.exists():
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        minted.append(role)
    return minted


async def set_role_passwords(url: str, passwords_dir: str) -> list[str]:
    """Give each service role the password in its file (as the administrator of `url`); the roles set."""
    conn = await asyncpg.connect(url)
    done = []
    try:
        for role in SERVICE_ROLES.values():
            if secret := role_password(passwords_dir, role):
                await conn.execute(
                    await conn.fetchval("SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)", role, secret)
                )
                done.append(role)
    finally:
        await conn.close()
    return done


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[tuple[int, Path]]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise ValueError(f"migration file {path.name} must be named NNN_lowercase_name.sql")
        found.append((int(m.group(1)), path))
    numbers = [n for n, _ in found]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"two migrations share a number in {directory}")
    return found


async def migrate(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction. Returns their names."""
    conn = await asyncpg.connect(url)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, path in migration_files(directory):
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, path.name)
            applied.append(path.name)
        if (grants := directory / ROLE_GRANTS).is_file():
            async with conn.transaction():  # every table, new ones too, owned and granted as it says
                await conn.execute(grants.read_text())
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
        await conn.close()
    return applied
