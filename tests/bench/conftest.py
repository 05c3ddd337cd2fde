"""Running a bench/ script as a user would (`.venv/bin/python bench/NAME.py ...`), at its smallest size.

A bench that nobody runs breaks the first time an interface it uses changes; these smoke runs keep
every script working. They check that a script completes and prints its figure lines, never the
figures' values (the machine running the suite is shared: its timings mean nothing).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.local_services import free_port, nats_server_binary, wait_for_port
from tests.conftest import REPO_ROOT

BENCH = REPO_ROOT / "bench"


@dataclass
class BenchRun:
    returncode: int
    output: str  # stdout and stderr together, as a user's terminal shows them

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run_bench(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> BenchRun:
    """bench/<script> with `args`, in its own session (a timeout stops it and everything it started)."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        cwd=str(REPO_ROOT),
        env=os.environ | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)  # SIGTERM: the benches tear their stacks down in `finally`
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
        raise AssertionError(f"bench/{script} did not finish within {timeout:g} s:\n{out[-6000:]}") from None
    return BenchRun(proc.returncode, out)


def assert_completes(run: BenchRun, script: str, figure_lines: list[str]) -> None:
    """Exit 0, and every pattern (a regex matched at a line's start) among the printed lines."""
    assert run.returncode == 0, f"bench/{script} exited {run.returncode}:\n{run.tail()}"
    missing = [p for p in figure_lines if not re.search(p, run.output, re.MULTILINE)]
    assert not missing, f"bench/{script} did not print {missing}:\n{run.tail()}"


@pytest.fixture(scope="session")
def open_nats():
    """A nats-server without authorization (as scripts/services.sh runs one for the benches that play
    1,000 nodes' telemetry), of this session alone: its URL."""
    home = Path(tempfile.mkdtemp(prefix="adc-bench-nats-"))
    port = free_port()
    proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(home)],
        stdout=open(home / "nats.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port("127.0.0.1", port, 20, "nats-server", proc)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)
