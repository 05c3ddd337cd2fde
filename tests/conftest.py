"""Fixtures over the real services: NATS with JetStream and Postgres (never mocked).

Each test gets its own database and its own bus prefix, so it can run beside a developer's
`adc up` and leaves nothing behind. NATS runs with ADC's authorization, as `adc up` runs it:
the session starts one nats-server (cli/local_services.LocalNats, the same code and config
`adc up` uses, TLS on: each keys folder gets the server's CA as `ca.pem`, so every connection
verifies the server); each Isolated adds its installation's role keys to it, and a test connects
as the role it plays (`await isolated.bus("decider")`). A node a test makes up gets its own
worker key when first asked for, and the server reloads.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import shutil
import signal
import tempfile
from pathlib import Path

import asyncpg
import pytest

from cli.local_services import LocalNats
from shared.infra.bus import Bus, init_streams
from shared.infra.bus_auth import BusCredential, BusDeployment, CredentialStore, stream_names
from shared.infra.db import connect, migrate

REPO_ROOT = Path(__file__).resolve().parent.parent


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # SIGTERM (scripts/test.sh stopping its second process, a CI timeout) ends the run as Ctrl-C does:
    # fixtures tear their stacks down instead of leaving services and trainers running.
    signal.signal(signal.SIGTERM, _interrupt)


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


_server: LocalNats | None = None


def bus_server(deployment: BusDeployment) -> str:
    """The session's nats-server, started with the first installation, told of each later one. Its URL."""
    global _server
    if _server is None:
        home = Path(tempfile.mkdtemp(prefix="adc-test-nats-"))
        _server = LocalNats(home, home / "nats.log")
        _server.start(deployment)

        def stop(server=_server) -> None:
            server.stop()
            if not os.environ.get("ADC_TEST_KEEP_NATS"):  # set it to read the server's log (refusals) afterwards
                shutil.rmtree(server.home, ignore_errors=True)

        atexit.register(stop)
    else:
        _server.add(deployment)
    return _server.url


async def _drop_streams(url: str, deployment: BusDeployment) -> None:
    bus = await Bus.connect(url, deployment.prefix, "test-cleanup", deployment.keys.credential("admin"))
    try:
        for name in stream_names(bus.subjects):
            try:
                await bus.js.delete_stream(name)
            except Exception:  # never created (a KV bucket nobody used)
                pass
    finally:
        await bus.close()


class Isolated:
    """A fresh database, bus prefix and set of bus role keys; cleaned up when closed."""

    def __init__(self, nodes: tuple[str, ...] = ()) -> None:
        tag = secrets.token_hex(4)
        self.db_name = f"adc_test_{tag}"
        self.prefix = f"t{tag}"
        self.database_url = ""
        self.nats_url = ""
        self.home = Path(tempfile.mkdtemp(prefix=f"adc-{self.prefix}-"))
        self.keys = CredentialStore(self.home / "secrets" / "nats")
        self.nodes = list(nodes)

    @property
    def deployment(self) -> BusDeployment:
        return BusDeployment(self.prefix, tuple(self.nodes), self.keys)

    def open(self) -> Isolated:
        self.database_url = asyncio.run(_create_db(self.db_name))
        self.nats_url = bus_server(self.deployment)
        asyncio.run(init_streams(self.nats_url, self.deployment))
        return self

    def credential(self, role: str) -> BusCredential:
        """A role's key; a node not seen yet gets its worker and collector keys, and the server reloads."""
        kind, _, node = role.partition("-")
        if kind in ("worker", "collector") and node not in self.nodes:
            self.nodes.append(node)
            bus_server(self.deployment)
        return self.keys.credential(role)

    async def bus(self, role: str, name: str | None = None) -> Bus:
        """A bus connection as `role`, with exactly that role's permissions."""
        return await Bus.connect(self.nats_url, self.prefix, name or f"test-{role}", self.credential(role))

    def service_env(self, role: str) -> dict[str, str]:
        """Environment for a service process started by a test as `role` (its key minted first)."""
        self.credential(role)
        return {
            "NATS_URL": self.nats_url,
            "ADC_BUS_PREFIX": self.prefix,
            "ADC_BUS_CREDENTIALS_DIR": str(self.keys.directory),
        }

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
        if self.nats_url:
            asyncio.run(_drop_streams(self.nats_url, self.deployment))
            _server.forget(self.prefix)  # the session's config stays small
        shutil.rmtree(self.home, ignore_errors=True)


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


LAYERS = ("unit", "integration", "e2e", "chaos", "security", "simulation", "browser", "bench")


def pytest_collection_modifyitems(config, items):
    """Each test carries the marker of its layer, the first folder under tests/, so
    `pytest -m unit` (or integration, e2e, ...) runs one layer alone."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT / "tests").parts
        if parts and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
