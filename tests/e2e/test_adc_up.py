"""`adc up` as a supervisor: the API URL on a line of its own; SIGINT, SIGTERM (also when a
script started it with `&`, which leaves SIGINT ignored) stop every process; a service that
dies is restarted; and if `adc up` itself is killed outright, its services do not linger."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT, Isolated

SERVICES = 6  # audit sink, api, executor, decider, one worker, one collector


class UpInBackground:
    """`adc up` started the way a script starts it: `adc up > log &`, so not our child."""

    def __init__(self, home: Path, env: Isolated, own_database: bool = False) -> None:
        self.log = home.parent / "up.log"
        self.env = env
        script = f'"{sys.executable}" -m cli up --home "{home}" --port 0 --workers 1 > "{self.log}" 2>&1 &\necho $!\n'
        given = {
            "NATS_URL": env.nats_url,
            "ADC_BUS_PREFIX": env.prefix,
            "ADC_BUS_CREDENTIALS_DIR": str(env.keys.directory),
            **({} if own_database else {"DATABASE_URL": env.database_url}),
        }
        environ = {k: v for k, v in os.environ.items() if not (own_database and k == "DATABASE_URL")}
        out = subprocess.run(
            ["bash", "-c", script], cwd=str(REPO_ROOT), capture_output=True, text=True, check=True, env=environ | given
        )
        self.pid = int(out.stdout.strip())
        self.url = self.wait_for_line(r"http://127\.0\.0\.1:\d+", 90).strip()
        self.pids = {name: int(pid) for name, pid in re.findall(r"^(\S+)\s+pid (\d+),", self.text(), re.M)}
        assert len(self.pids) == SERVICES, self.text()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := re.search(f"^{pattern}$", self.text(), re.M):
                return found.group(0)
            assert alive(self.pid), f"adc up exited:\n{self.text()}"
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{self.text()}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def up(tmp_path):
    env = Isolated(nodes=("node-1",)).open()
    started = None
    try:
        started = UpInBackground(tmp_path / "home", env)
        yield started
    finally:
        if started is not None:  # whatever the test left, restarted services included
            for pid in [started.pid, *map(int, re.findall(r"pid (\d+)", started.text()))]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        env.close()


def test_adc_up_from_a_script_stops_every_process_on_ctrl_c(up):
    assert httpx.get(f"{up.url}/readyz", timeout=5).status_code == 200
    # Each node's collector serves its own /metrics, as dcgm-exporter would, at the URL printed.
    metrics = re.search(r"^metrics\s+node-1: (http://127\.0\.0\.1:\d+/metrics)", up.text(), re.M)
    assert metrics, up.text()
    assert "adc_node_cpu_percent{" in httpx.get(metrics.group(1), timeout=5).text
    os.kill(up.pid, signal.SIGINT)
    assert not wait_gone([up.pid], 60), up.text()
    assert "SIGINT received" in up.text()
    assert not wait_gone(up.pids.values(), 5), f"still running after Ctrl-C: {up.text()}"


def test_adc_up_restarts_a_dead_service_and_stops_everything_on_sigterm(up):
    os.kill(up.pids["executor"], signal.SIGKILL)
    line = up.wait_for_line(r"adc: executor restarted \(restart #1\), pid \d+", 30)
    new_pid = int(line.rsplit(" ", 1)[1])
    assert new_pid != up.pids["executor"] and alive(new_pid)
    assert re.search(r"^adc: executor exited with code -9; restart #1 in 1 s", up.text(), re.M), up.text()
    assert httpx.get(f"{up.url}/readyz", timeout=5).status_code == 200
    os.kill(up.pid, signal.SIGTERM)
    assert not wait_gone([up.pid], 60), up.text()
    assert not wait_gone([*up.pids.values(), new_pid], 5), f"left running after SIGTERM: {up.text()}"


def test_services_of_a_killed_adc_up_do_not_linger(up):
    from shared.infra.config import load_config

    timeout = load_config().worker.node_timeout
    os.kill(up.pid, signal.SIGKILL)
    left = wait_gone(up.pids.values(), timeout)
    assert not left, f"still running {timeout}s after adc up was killed: {left}"


@pytest.fixture
def up_own_postgres():
    """`adc up` without DATABASE_URL: it starts its own Postgres (in a folder the postgres user can reach)."""
    env = Isolated(nodes=("node-1",)).open()
    folder = Path(tempfile.mkdtemp(prefix="adc-up-", dir="/tmp"))
    folder.chmod(0o755)
    started = None
    try:
        started = UpInBackground(folder / "home", env, own_database=True)
        yield started
    finally:
        if started is not None:
            for pid in [started.pid, *map(int, re.findall(r"pid (\d+)", started.text()))]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        if (folder / "home" / "pg" / "postmaster.pid").exists():  # a Postgres its killed `adc up` left
            from cli.local_services import _as_postgres_user, _pg_bin

            subprocess.run(
                _as_postgres_user(
                    [_pg_bin("pg_ctl"), "-D", str(folder / "home" / "pg"), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
            )
        env.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_adc_up_with_its_own_postgres_asks_every_connection_for_a_password(up_own_postgres):
    import asyncio

    import asyncpg

    up = up_own_postgres
    port = int(
        re.search(r"^postgres\s+postgresql://postgres@127\.0\.0\.1:(\d+)/adc \(started here", up.text(), re.M).group(1)
    )
    assert httpx.get(f"{up.url}/readyz", timeout=5).status_code == 200  # every service got in with its password

    async def without_password() -> None:
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/adc", timeout=10)
        await conn.close()

    with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        asyncio.run(without_password())
    os.kill(up.pid, signal.SIGINT)
    assert not wait_gone([up.pid], 60), up.text()
    assert not wait_gone(up.pids.values(), 5), f"still running after Ctrl-C: {up.text()}"
    assert not (up.log.parent / "home" / "pg" / "postmaster.pid").exists(), "its Postgres still runs"
