"""A hostile trainer against its confinement (heavy: real trainers, run it under the shared lock).

The payload is a model folder's own Python, in a trusted code root with `trust_remote_code: true`, so
transformers imports it inside the real trainer that a real worker started (over the real NATS). It tries:
- the host's services: Postgres, NATS and a service listening on every address (where the api
  listens), at 127.0.0.1, ::1 and each of the host's own addresses;
- swapping every file the worker touches in its job folder (trainer.log, events.jsonl, stop, fence,
  team) for a symlink to a root-only file, to another team's job log, or to where root would create
  a file; then it exits 1, so the worker quotes its log in the exit event;
- outliving its worker: it forks a daemon in a session of its own and ignores SIGTERM; the worker is
  killed with SIGKILL (test_a_trainer_does_not_outlive_its_worker) or asks it to stop and it does not.
Every attempt must fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from shared.contracts.actions import NodeGpus
from shared.contracts.messages import CommandResult
from shared.infra.command_auth import SignatureVerifier
from tests.conftest import REPO_ROOT, Isolated
from tests.hostile_code import code_model, command, host_targets, stage_storage, tenancy_of, train_section, until
from worker.agent import NodeAgent
from worker.inventory import cpu_slots
from worker.sandbox import bubblewrap

NODE = "node-hostile"
ROOT_SECRET = "ROOT-ONLY-a8f3c1"
OTHER_TEAM_LOG = "OTHER-TEAMS-LOG-77e0b2"
DAEMON = ["sleep", "987654"]  # the payload's daemon, found again by its command line

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or bubblewrap() is None, reason="needs root and a working bwrap (scripts/install.sh installs it)"
)

PAYLOAD = r"""
import json, os, signal, socket, subprocess, sys, time
P = json.loads(%(params)r)
attempt = os.path.dirname(os.environ["ADC_STOP_FILE"])
job = os.path.dirname(os.environ["ADC_FENCE_FILE"])
report = {"connect": {}, "swap": {}}
for host, port in P["targets"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        report["connect"]["%%s:%%d" %% (host, port)] = "open"
    except OSError as err:
        report["connect"]["%%s:%%d" %% (host, port)] = repr(err)
    finally:
        s.close()
for folder, name, target in P["swaps"]:
    path = os.path.join(job if folder == "job" else attempt, name)
    try:
        os.symlink(target, path + ".evil")
        os.replace(path + ".evil", path)
        report["swap"][name] = "swapped"
    except OSError as err:
        report["swap"][name] = repr(err)
if P["mode"] == "outlive":
    subprocess.Popen(P["daemon"], start_new_session=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(job, "output", "attack.json.tmp"), "w") as f:
    json.dump(report, f)
os.replace(os.path.join(job, "output", "attack.json.tmp"), os.path.join(job, "output", "attack.json"))
print("payload ran", flush=True)
deadline = time.time() + 120
while P["mode"] == "outlive" or (time.time() < deadline and not os.path.exists(os.environ["ADC_STOP_FILE"])):
    time.sleep(0.2)
os._exit(1)
"""


class HostService:
    """A service listening on every address of the host, as the api does."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]


@pytest.fixture
def stage(tmp_path, tmp_path_factory, tiny_model):
    """A trusted code root, a root-only secret and another team's job log in the same storage."""
    trusted, storage, secret, other_log = stage_storage(
        tmp_path, tmp_path_factory, secret=ROOT_SECRET, other_log=OTHER_TEAM_LOG, other_team="beta"
    )
    yield trusted, storage, secret, other_log
    shutil.rmtree(trusted, ignore_errors=True)


def hostile_model(tiny_model: Path, trusted: Path, name: str, params: dict) -> Path:
    return code_model(tiny_model, trusted, name, PAYLOAD % {"params": json.dumps(params)})


async def _command(bus, **fields) -> CommandResult:
    return await command(bus, NODE, 60, **fields)


async def _until(predicate, what: str, timeout: float = 240.0):
    return await until(predicate, what, timeout)


def daemons() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[:2] == DAEMON:
            found.append(p)
    return found


async def test_a_hostile_trainer_reaches_no_host_service_and_no_file_the_worker_touches(stage, tiny_model, data_dir):
    trusted, storage, secret, other_log = stage
    env = await asyncio.to_thread(Isolated((NODE,)).open)
    service = HostService()
    nats_port = int(env.nats_url.rsplit(":", 1)[1])
    root_made = storage.parent / "made-by-root"
    params = {
        "mode": "files",
        "daemon": DAEMON,
        "targets": host_targets([5432, nats_port, service.port]),
        "swaps": [
            ["attempt", "trainer.log", str(secret)],
            ["attempt", "events.jsonl", str(other_log)],
            ["attempt", "stop", str(root_made)],
            ["attempt", "go", str(root_made)],  # a warm trainer's go: the worker's to write
            ["job", "fence", str(secret)],
            ["job", "team", str(other_log)],
        ],
    }
    model = hostile_model(tiny_model, trusted, "hostile", params)
    worker_bus = await env.bus(f"worker-{NODE}")
    executor_bus = await env.bus("executor")
    agent = NodeAgent(
        worker_bus,
        NODE,
        cpu_slots(1),
        storage,
        heartbeat_interval=0.5,
        tenancy=tenancy_of(trusted, data_dir),
        data_root=REPO_ROOT,
        commands=SignatureVerifier.from_store(env.keys),
        cores=2,
    )
    agent.stop_timeout_s = 20.0
    published: list[tuple[str, dict]] = []
    publish = agent._publish

    async def observed(job_id, attempt, msg_id, kind, data, until_sent=False):  # what goes on the bus, as sent
        published.append((kind, data))
        return await publish(job_id, attempt, msg_id, kind, data, until_sent)

    agent._publish = observed
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        start = dict(
            kind="start",
            attempt=1,
            train=train_section(model, data_dir, steps=1000),
            placement=[NodeGpus(node=NODE, gpus=[0])],
            team="alpha",
        )
        result = await _command(executor_bus, job_id="jhostile", **start)
        assert result.ok, result
        job_dir = Path(result.job_dir)
        attack = job_dir / "output" / "attack.json"
        await _until(attack.exists, "payload report")
        report = json.loads(attack.read_text())

        stopped = await asyncio.wait_for(_command(executor_bus, kind="stop", job_id="jhostile", attempt=1), 90)
        assert not stopped.ok, stopped  # it exited 1
        await _until(lambda: any(kind == "exited" for kind, _ in published), "exit event", 60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 90)
        await executor_bus.close()
        await worker_bus.close()
        service.sock.close()
        await asyncio.to_thread(env.close)

    opened = {target: how for target, how in report["connect"].items() if how == "open"}
    assert not opened, f"the trainer reached host services: {opened}"
    assert len(report["connect"]) >= 6, report  # 127.0.0.1 and ::1 at least, three ports each
    swapped = {name: how for name, how in report["swap"].items() if how == "swapped"}
    assert not swapped, f"the trainer replaced files the worker uses: {swapped}"
    attempt_dir = job_dir / "attempt-1"
    for path in (attempt_dir / "trainer.log", attempt_dir / "events.jsonl", job_dir / "fence", job_dir / "team"):
        assert not path.is_symlink(), path
    assert not root_made.exists() and not root_made.is_symlink(), "root created a file where the trainer chose"
    log_text = (attempt_dir / "trainer.log").read_text(errors="replace")  # what GET /v1/jobs/<id>/logs serves
    assert "payload ran" in log_text and ROOT_SECRET not in log_text and OTHER_TEAM_LOG not in log_text
    exited = next(data for kind, data in published if kind == "exited")
    text = json.dumps(exited)
    assert exited["outcome"] == "failed" and "payload ran" in exited["error"], exited
    assert ROOT_SECRET not in text and OTHER_TEAM_LOG not in text, exited
    assert (job_dir / "team").read_text() == "alpha\n"


def _start_worker(env: Isolated, storage: Path, config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker",
            "--node",
            NODE,
            "--config",
            str(config),
            "--storage-root",
            str(storage),
            "--cpu-slots",
            "1",
            "--cpu-cores",
            "2",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **env.service_env(f"worker-{NODE}"), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=open(storage.parent / "worker.log", "ab"),
    )


async def test_a_trainer_does_not_outlive_its_worker(stage, tiny_model, data_dir, tmp_path):
    trusted, storage, secret, other_log = stage
    assert not daemons(), "a daemon of an earlier run is still there"
    env = await asyncio.to_thread(Isolated((NODE,)).open)
    model = hostile_model(
        tiny_model, trusted, "outlive", {"mode": "outlive", "daemon": DAEMON, "targets": [], "swaps": []}
    )
    config = tmp_path / "adc_config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tenancy": {
                    "team_roots": {"alpha": [str(trusted)]},
                    "shared_roots": [str(data_dir)],
                    "trusted_code_roots": [str(trusted)],
                },
                "bus": {"credentials_dir": str(env.keys.directory)},
                "storage": {"data_root": str(REPO_ROOT)},
            }
        )
    )
    worker = _start_worker(env, storage, config)
    executor_bus = await env.bus("executor")
    tree: list[int] = []
    try:
        start = dict(
            kind="start",
            attempt=1,
            train=train_section(model, data_dir, steps=1000),
            placement=[NodeGpus(node=NODE, gpus=[0])],
            team="alpha",
        )
        result = await _command(executor_bus, job_id="joutlive", **start)
        assert result.ok, result
        await _until(lambda: (Path(result.job_dir) / "output" / "attack.json").exists(), "payload report")
        await _until(daemons, "the payload's daemon", 30)
        tree = [p.pid for p in psutil.Process(result.pid).children(recursive=True)] + [result.pid]
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        deadline = time.monotonic() + 15
        while (left := daemons() + [p for p in map(_process, tree) if p is not None]) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert not left, f"outlived its worker: {[(p.pid, p.cmdline()) for p in left]}"
    finally:
        for p in daemons() + [p for p in map(_process, tree) if p is not None]:  # what outlived it, on failure
            p.kill()
        if worker.poll() is None:
            worker.kill()
        await executor_bus.close()
        await asyncio.to_thread(env.close)


def _process(pid: int) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        return p if p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None
