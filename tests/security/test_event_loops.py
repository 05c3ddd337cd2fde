"""The event loop each service runs on (shared/infra/service.py): uvloop's where it is installed, whose TLS
transport is C (every bus connection is TLS), except the worker, which spawns the trainers and stays
on asyncio's, because uvloop's subprocess spawn hands the child descriptors asyncio's closes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import yaml

from cli.local_services import api_ready, free_port

uvloop = pytest.importorskip("uvloop")

NODE = "loopnode"
UVLOOP = "uvloop.Loop"
SERVICES = {  # service -> (argv after -m, its bus role, the loop it must run on)
    "executor": (["services.executor"], "executor", UVLOOP),
    "decider": (["services.decider"], "decider", UVLOOP),
    "audit-sink": (["services.audit"], "audit-sink", UVLOOP),
    "collector": (["services.collector", "--node", NODE, "--simulate-gpus", "1"], f"collector-{NODE}", UVLOOP),
    "worker": (["worker", "--node", NODE, "--cpu-slots", "1"], f"worker-{NODE}", "asyncio."),
    "api": (["services.api"], "api", UVLOOP),
}


def test_each_service_runs_on_its_loop(isolated, tmp_path):
    """Each service, started as it is deployed, names the loop it runs on (its "started" line, the
    api's once uvicorn runs it): uvloop's, but the worker's asyncio's."""
    api_port = free_port()
    config = tmp_path / "adc_config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database": {"url": isolated.database_url},
                "storage": {"root": str(tmp_path / "storage")},
                "api": {"host": "127.0.0.1", "port": api_port},
            }
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in SERVICES}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *argv, "--config", str(config)],
            env=os.environ | isolated.service_env(role),
            stdout=open(logs[name], "wb"),
            stderr=subprocess.STDOUT,
        )
        for name, (argv, role, _) in SERVICES.items()
    }
    try:
        assert api_ready(f"http://127.0.0.1:{api_port}", procs["api"], 60), logs["api"].read_text()[-2000:]
        found: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while len(found) < len(SERVICES) and time.monotonic() < deadline:
            for name, log in logs.items():
                for line in log.read_text(errors="replace").splitlines():
                    if "event loop: " in line:
                        found[name] = line.split("event loop: ", 1)[1].strip()
            time.sleep(0.2)
        missing = {n: logs[n].read_text(errors="replace")[-1500:] for n in SERVICES if n not in found}
        assert not missing, missing
        for name, (_, _, loop) in SERVICES.items():
            assert found[name].startswith(loop), (name, found[name])
        assert all(p.poll() is None for p in procs.values()), {n: p.returncode for n, p in procs.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _child_descriptors() -> tuple[int, list[str]]:
    """An inheritable descriptor of ours, and the descriptors a child spawned the worker's way sees."""
    r, w = os.pipe()
    os.set_inheritable(w, True)  # as a descriptor handed down to the worker by whatever started it
    try:
        proc = await asyncio.create_subprocess_exec(
            "ls", "/proc/self/fd", stdout=asyncio.subprocess.PIPE, start_new_session=True
        )
        out, _ = await proc.communicate()
        return w, out.decode().split()
    finally:
        os.close(r)
        os.close(w)


def test_why_the_worker_stays_on_asyncio():
    """asyncio's spawn closes every descriptor but the child's own (close_fds); uvloop's hands the
    child the parent's inheritable ones. Should uvloop ever close them, this fails, and the worker's
    exception in shared/infra/service.py (ASYNCIO_LOOP_ONLY) can be looked at again."""
    from shared.infra.service import ASYNCIO_LOOP_ONLY, loop_factory

    assert "worker" in ASYNCIO_LOOP_ONLY and loop_factory("worker") is asyncio.new_event_loop
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        fd, seen = runner.run(_child_descriptors())
    assert str(fd) not in seen, seen
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        fd, seen = runner.run(_child_descriptors())
    assert str(fd) in seen, seen
