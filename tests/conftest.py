"""Fixtures over the real services: NATS with JetStream and Postgres (never mocked).

Each test session gets its own database and its own bus prefix, so it can run beside a
developer's `adc up` and leaves nothing behind.
"""
from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import asyncpg
import nats
import pytest

from shared.db import connect, migrate

REPO_ROOT = Path(__file__).resolve().parent.parent
NATS_URL = os.environ.get("ADC_TEST_NATS_URL", "nats://127.0.0.1:4222")
PG_ADMIN_URL = os.environ.get("ADC_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _db_url(name: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


async def _create_db(name: str) -> str:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = _db_url(name)
    await migrate(url)
    return url


async def _drop_db(name: str) -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _drop_streams(prefix: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream()
        # The prefix is random per session: every stream and KV bucket (KV_<name>) naming it is ours.
        for info in await js.streams_info():
            if prefix.lower() in info.config.name.lower():
                try:
                    await js.delete_stream(info.config.name)
                except Exception:
                    pass
    finally:
        await nc.close()


class Isolated:
    """A fresh database and bus prefix; cleaned up when closed."""

    def __init__(self) -> None:
        tag = secrets.token_hex(4)
        self.db_name = f"adc_test_{tag}"
        self.prefix = f"t{tag}"
        self.database_url = ""
        self.nats_url = NATS_URL

    def open(self) -> "Isolated":
        self.database_url = asyncio.run(_create_db(self.db_name))
        return self

    def sql(self, query: str, *args):
        """Rows of one query on this database, from synchronous test code."""
        async def fetch():
            conn = await connect(self.database_url)
            try:
                return await conn.fetch(query, *args)
            finally:
                await conn.close()

        return asyncio.run(fetch())

    def close(self) -> None:
        asyncio.run(_drop_db(self.db_name))
        asyncio.run(_drop_streams(self.prefix))


@pytest.fixture
def isolated():
    env = Isolated().open()
    yield env
    env.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from worker.trainer.tiny_model import build_tiny_llama

    out = models_root(tmp_path_factory) / "tiny-llama"
    build_tiny_llama(out)
    return out


def models_root(tmp_path_factory) -> Path:
    """Where the session's models are built: a folder stacks declare as a root of their team, readable by
    the trainers' unprivileged uid (pytest's own folders are the owner's only)."""
    root = tmp_path_factory.getbasetemp() / "models"
    root.mkdir(mode=0o755, exist_ok=True)
    root.chmod(0o755)
    return root


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return REPO_ROOT / "examples" / "data"


LAYERS = ("unit", "integration", "e2e", "chaos", "security", "simulation", "browser")


def pytest_collection_modifyitems(config, items):
    """Each test carries the marker of its layer, the first folder under tests/, so
    `pytest -m unit` (or integration, e2e, ...) runs one layer alone."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT / "tests").parts
        if parts and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
