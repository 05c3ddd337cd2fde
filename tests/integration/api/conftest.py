"""The api under test: the real app under uvicorn on a free port, with the real audit sink, on
the real NATS and Postgres (a fresh database and bus prefix per module).

Both run in one background event loop, so a test can stop and restart the api (a disconnect
its clients must survive) while the sink keeps writing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from cli.local_services import free_port
from services.api.app import create_app
from services.api.auth import create_token
from services.audit.sink import run_sink
from shared.contracts.messages import AuditEvent
from shared.infra.audit_chain import load_chain_key, write_new_chain_key
from shared.infra.bus import Bus
from shared.infra.config import AdcConfig, parse_config
from shared.infra.db import connect, create_pool, service_url
from tests.conftest import REPO_ROOT, Isolated
from tests.waits import until

ROLES = ("admin", "operator", "user")


@dataclass
class Tokens:
    admin: str
    operator: str
    user: str  # team alpha
    other_user: str  # team beta
    expired: str
    revoked: str

    def for_role(self, role: str) -> str:
        return getattr(self, role)


class ApiServer:
    def __init__(self, env: Isolated, storage_root: Path, overrides: dict | None = None) -> None:
        self.env = env
        self.port = free_port()
        data = {
            "bus": {"url": env.nats_url, "prefix": env.prefix, "credentials_dir": str(env.keys.directory)},
            "database": {"url": env.database_url, "pool_max": 6},
            "storage": {"root": str(storage_root), "data_root": str(REPO_ROOT)},
            "api": {"host": "127.0.0.1", "port": self.port},
            "audit": {"chain_key_file": str(write_new_chain_key(storage_root / "secrets" / "audit_chain.key"))},
            # Every team reads the examples' data and the test session's folders (models built there).
            "tenancy": {"shared_roots": [str(REPO_ROOT / "examples"), str(storage_root.parent)]},
        }
        for section, values in (overrides or {}).items():
            data[section] = {**data.get(section, {}), **values}
        self.config: AdcConfig = parse_config(data, env={})
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-under-test", daemon=True)
        self.server: uvicorn.Server | None = None
        self._serving: asyncio.Future | None = None

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ApiServer:
        self.thread.start()
        self.run(self._start_sink())
        self.start_api()
        return self

    async def _start_sink(self) -> None:
        self.bus = await self.env.bus("audit-sink")
        self._roles: dict[str, Bus] = {}
        self.pool = await create_pool(service_url(self.env.database_url, "audit-sink"), 1, 4)  # the sink's role
        self._sink_stop = asyncio.Event()
        key_file = self.config.audit.chain_key_file
        self._sink = asyncio.ensure_future(
            run_sink(self.bus, self.pool, self._sink_stop, load_chain_key(key_file) if key_file else None)
        )

    def start_api(self) -> None:
        async def serve() -> None:
            config = uvicorn.Config(
                create_app(self.config),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                timeout_graceful_shutdown=1,
                lifespan="on",
            )
            self.server = uvicorn.Server(config)
            self._serving = asyncio.ensure_future(self.server.serve())
            while not self.server.started:
                if self._serving.done():
                    self._serving.result()
                    raise RuntimeError("api did not start")
                await asyncio.sleep(0.02)

        self.run(serve())

    def stop_api(self) -> None:
        async def stop() -> None:
            self.server.should_exit = True
            await self._serving

        self.run(stop())

    def as_role(self, role: str) -> Bus:
        """A bus connection (in the server's loop) as a role the test plays, e.g. `worker-node-1`."""
        if role not in self._roles:
            self._roles[role] = self.run(self.env.bus(role))
        return self._roles[role]

    def publish_audit(self, event: AuditEvent) -> None:
        """Put an event on the audit stream, as any service does."""
        self.run(self.bus.audit(event))

    def sql(self, query: str, *args):
        return self.env.sql(query, *args)

    def close(self) -> None:
        try:
            if self.server is not None and not self._serving.done():
                self.stop_api()

            async def stop_sink() -> None:
                self._sink_stop.set()
                await self._sink
                for bus in [*self._roles.values(), self.bus]:
                    await bus.close()
                await self.pool.close()

            self.run(stop_sink())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


async def _make_tokens(url: str) -> Tokens:
    conn = await connect(url)
    try:
        secrets = {}
        for key, role, team in [
            ("admin", "admin", "platform"),
            ("operator", "operator", "sre"),
            ("user", "user", "alpha"),
            ("other_user", "user", "beta"),
            ("expired", "admin", "platform"),
            ("revoked", "admin", "platform"),
        ]:
            token_id, secrets[key] = await create_token(conn, f"{key.replace('_', '-')}-token", role, team)
            if key == "expired":
                await conn.execute(
                    "UPDATE api_tokens SET expires_at = now() - interval '1 minute' WHERE id = $1", token_id
                )
            if key == "revoked":
                await conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE id = $1", token_id)
        return Tokens(**secrets)
    finally:
        await conn.close()


class Api:
    """A started server, its tokens, and clients for each of them."""

    def __init__(self, server: ApiServer, tokens: Tokens, model_dir: Path) -> None:
        self.server = server
        self.tokens = tokens
        self.url = server.url
        self.model_dir = model_dir

    def client(self, token: str | None = "admin", **kw) -> httpx.Client:
        headers = {}
        if token is not None:
            secret = self.tokens.for_role(token) if hasattr(self.tokens, token) else token
            headers["Authorization"] = f"Bearer {secret}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)

    def job_spec(self, name: str = "api-test", **fields) -> dict:
        return {
            "name": name,
            "gpus": 1,
            **fields,
            "train": {
                "model_name_or_path": str(self.model_dir),
                "stage": "sft",
                "finetuning_type": "lora",
                "dataset": "alpaca_en_demo",
                "dataset_dir": str(REPO_ROOT / "examples" / "data"),
                "max_steps": 10,
            },
        }

    def submit(self, token: str = "user", **fields) -> dict:
        with self.client(token) as http:
            r = http.post("/v1/jobs", json=self.job_spec(**fields))
        assert r.status_code == 201, r.text
        return r.json()

    def cli(self, *argv: str, token: str = "admin", timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        env = os.environ | {
            "ADC_API_URL": self.url,
            "ADC_TOKEN": self.tokens.for_role(token),
            "ADC_HOME": "/nonexistent",
        }
        return subprocess.run(
            [sys.executable, "-m", "cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(REPO_ROOT),
            **kw,
        )

    def wait_audit(self, predicate, timeout: float = 10) -> list[dict]:
        """Audit rows (as the admin sees them) once one matches `predicate`."""
        rows: list[dict] = []
        with self.client("admin") as http:

            def matched() -> bool:
                rows[:] = http.get("/v1/audit", params={"last": 1000}).json()["items"]
                return any(predicate(r) for r in rows)

            until(matched, lambda: f"a matching audit event: {json.dumps(rows)[-2000:]}", timeout, poll=0.05)
        return rows


def decision(run: str, i: int) -> AuditEvent:
    """A decision as the decider audits it (source decider, kind decision, rule, action, evidence)."""
    return AuditEvent(
        event_id=f"{run}-{i}:decided",
        ts=time.time(),
        source="decider",
        kind="decision",
        job_id=f"j{run}{i}",
        node="node-1",
        decision_id=f"{run}-{i}",
        rule="oom_protection",
        action="migrate",
        reason=f"gpu memory 95% for 30s (#{i})",
        evidence={"memory": [0.95, 0.96]},
    )


def fake_model(folder: Path) -> Path:
    """The api checks only that a model folder with config.json exists, which the trainer's uid could
    read; nothing here trains."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    folder.chmod(0o755)
    folder.parent.chmod(0o755)
    folder.parent.parent.chmod(0o711)  # pytest's base folder, a shared root here: searchable, not listable
    return folder


def start_api(tmp_path_factory, overrides: dict | None = None):
    env = Isolated().open()
    storage = tmp_path_factory.mktemp("storage")
    server = ApiServer(env, storage, overrides)
    try:
        server.start()
        tokens = asyncio.run(_make_tokens(env.database_url))
    except BaseException:
        server.close()
        env.close()
        raise
    return env, server, Api(server, tokens, fake_model(tmp_path_factory.mktemp("models") / "tiny"))


def serving_api(tmp_path_factory, overrides: dict | None = None):
    """A started api (see `Api`) for as long as the caller iterates; stopped and cleaned after."""
    env, server, handle = start_api(tmp_path_factory, overrides)
    try:
        yield handle
    finally:
        server.close()
        env.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    yield from serving_api(tmp_path_factory)
