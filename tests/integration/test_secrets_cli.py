"""What docker-compose runs before the services: `adc secrets init` mints the keys and
nats-server's authorization, a nats-server runs with it, `adc bus init` creates the streams as
the admin role; running either twice changes no key."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import nats
import nats.errors
import pytest

from cli.local_services import free_port, nats_server_binary, wait_for_port
from shared.infra.bus import Bus
from shared.infra.bus_auth import CredentialStore
from shared.infra.bus_tls import client_context
from tests.conftest import REPO_ROOT


def adc(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", *argv],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        env=(os.environ | (env or {})),
        timeout=60,
    )


def test_secrets_init_then_bus_init_on_a_server_run_with_that_config(tmp_path):
    keys, conf, pg = tmp_path / "nats", tmp_path / "server" / "auth.conf", tmp_path / "pg"
    conf.parent.mkdir()
    init = [
        "secrets",
        "init",
        "--dir",
        str(keys),
        "--nats-config",
        str(conf),
        "--prefix",
        "cli",
        "--nodes",
        "gpu-1",
        "--db-passwords",
        str(pg),
        "--tls-host",
        "nats.example",
    ]
    assert adc(*init).returncode == 0
    tls = tmp_path / "nats-tls"  # beside --dir by default
    assert (
        oct((tls / "ca.key").stat().st_mode & 0o777) == "0o600"
        and (keys / "ca.pem").read_bytes() == (tls / "ca.pem").read_bytes()
    )
    ca_before = (tls / "ca.pem").read_bytes()
    seeds = {p.name: p.read_bytes() for p in keys.glob("*.nk")}
    assert set(seeds) == {
        f"{r}.nk" for r in ("admin", "api", "decider", "executor", "audit-sink", "worker-gpu-1", "collector-gpu-1")
    }
    assert all(oct((keys / n).stat().st_mode & 0o777) == "0o600" for n in seeds)
    assert {p.name for p in pg.iterdir()} == {
        f"{r}.password" for r in ("adc_api", "adc_decider", "adc_executor", "adc_audit")
    }
    assert adc(*init).returncode == 0 and {p.name: p.read_bytes() for p in keys.glob("*.nk")} == seeds  # kept
    assert (tls / "ca.pem").read_bytes() == ca_before  # the CA too: clients keep trusting it

    port = free_port()
    server = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port("127.0.0.1", port, 20, "nats-server", server)
        url = f"nats://127.0.0.1:{port}"
        env = {"NATS_URL": url, "ADC_BUS_PREFIX": "cli", "ADC_BUS_CREDENTIALS_DIR": str(keys)}
        run = adc("bus", "init", env=env)
        assert run.returncode == 0, run.stderr

        async def check() -> list[str]:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):  # past TLS, no key
                await nats.connect(
                    url,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    connect_timeout=3,
                    tls=client_context(keys / "ca.pem"),
                    tls_hostname="localhost",
                    tls_handshake_first=True,
                )
            admin = await Bus.connect(url, "cli", "t", CredentialStore(keys).credential("admin"))
            try:
                return sorted([(await admin.js.stream_info(n)).config.name for n in admin.subjects.streams()])
            finally:
                await admin.close()

        assert asyncio.run(check()) == ["CLI_AUDIT", "CLI_DEAD", "CLI_DECISIONS", "CLI_JOBS", "CLI_REFUSALS"]
    finally:
        server.terminate()
        server.wait(timeout=10)
