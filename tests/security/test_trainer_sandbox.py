"""One real trainer, started by a real worker over the real NATS, seen from outside (heavy: run it under
the shared lock). The test plays the executor: it sends the worker its commands.

What it shows, on that one run:
- the trainer's process runs as an unprivileged uid and its environment (read from /proc/<pid>/environ)
  holds no credential of the worker's (DATABASE_URL, NATS_URL) and no PYTHONPATH from outside;
- a start whose env carries anything but NCCL tuning keys, and a job id that is not a path component,
  are refused;
- a relative `tokenized_path` is written by LLaMA-Factory inside the job's output folder;
- the attempt fences checkpoints: once a newer attempt has raised the fence, this trainer publishes
  none (it stops, saying it was superseded).
The worker's own stop when cut off from the bus is checked in tests/chaos/test_cut_off_worker.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import psutil
import pytest

from shared.contracts.actions import NodeGpus
from shared.contracts.messages import CommandError, CommandResult
from shared.infra.bus import Bus
from shared.infra.command_auth import SignatureVerifier
from shared.infra.config import parse_config
from tests.conftest import REPO_ROOT, Isolated, models_root
from tests.hostile_code import command, until
from worker.agent import NodeAgent
from worker.inventory import cpu_slots
from worker.trainer.events import read_events
from worker.trainer.fence import raise_fence

NODE = "node-sec"
SECRETS = {
    "DATABASE_URL": "postgresql://adc:hunter2@db/adc",
    "NATS_URL": "nats://worker:hunter2@bus:4222",
    "PYTHONPATH": "/attacker/site",
}


class Cuttable:
    """A TCP relay between the worker and NATS that the test can cut, as a network partition would."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("nats://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"nats://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers += [writer, up_writer]

        async def pipe(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        self.server.close()  # no reconnect either
        for writer in self.writers:
            writer.close()


async def _until(predicate, what: str, timeout: float = 120.0):
    return await until(predicate, what, timeout)


def _trainer_python(root_pid: int) -> psutil.Process | None:
    """The process running `python -m worker.trainer` under the worker's child (bwrap, setpriv)."""
    try:
        tree = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    return next((p for p in tree if p.name().startswith("python") and "worker.trainer" in " ".join(p.cmdline())), None)


@pytest.fixture
async def worker(tmp_path, tmp_path_factory):
    env = await asyncio.to_thread(Isolated((NODE,)).open)
    relay = Cuttable(env.nats_url)
    worker_bus = await Bus.connect(await relay.start(), env.prefix, "worker", env.credential(f"worker-{NODE}"))
    executor_bus = await env.bus("executor")
    tenancy = parse_config(
        {
            "tenancy": {
                "team_roots": {"alpha": [str(models_root(tmp_path_factory))]},
                "shared_roots": [str(REPO_ROOT / "examples")],
            }
        },
        env={},
    ).tenancy
    agent = NodeAgent(
        worker_bus,
        NODE,
        cpu_slots(1),
        tmp_path / "storage",
        heartbeat_interval=0.5,
        tenancy=tenancy,
        data_root=REPO_ROOT,
        node_timeout=3.0,
        commands=SignatureVerifier.from_store(env.keys),
        cores=3,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    saved = {key: os.environ.get(key) for key in SECRETS}
    os.environ.update(SECRETS)  # what a worker's own environment may hold
    try:
        yield agent, executor_bus, relay
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop.set()
        await asyncio.wait_for(task, 90)
        await asyncio.wait_for(executor_bus.close(), 10)
        try:
            await asyncio.wait_for(worker_bus.nc.close(), 10)  # still cut off: it was reconnecting
        except Exception:  # noqa: BLE001 - closing a connection that has no server is best effort
            pass
        await asyncio.to_thread(env.close)


async def _command(bus: Bus, **fields) -> CommandResult:
    return await command(bus, NODE, 30, **fields)


async def test_a_trainer_runs_unprivileged_without_credentials_and_obeys_the_fence(
    worker, tiny_model, data_dir, tmp_path_factory
):
    agent, bus, relay = worker
    assert tiny_model.parent == models_root(tmp_path_factory)
    train = {
        "model_name_or_path": str(tiny_model),
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(data_dir),
        "cutoff_len": 64,
        "template": "default",
        "per_device_train_batch_size": 1,
        "max_steps": 100000,
        "save_steps": 100000,
        "logging_steps": 1,
        "report_to": "none",
        "seed": 7,
        "tokenized_path": "tokenized",
    }  # LLaMA-Factory writes it: inside the job's folder, the sandbox's only writable one
    start = dict(kind="start", attempt=1, train=train, placement=[NodeGpus(node=NODE, gpus=[0])], team="alpha")

    trick = await _command(bus, job_id="jsec-env", env={"LD_PRELOAD": "/tmp/evil.so"}, **start)
    assert not trick.ok and trick.error == CommandError.REFUSED and "LD_PRELOAD" in trick.message, trick
    escape = await _command(bus, job_id="../../etc", **start)
    assert not escape.ok and escape.error == CommandError.BAD_COMMAND, escape
    foreign = await _command(bus, job_id="jsec-foreign", **(start | {"team": "beta"}))
    assert not foreign.ok and "outside the folders team 'beta' may read" in foreign.message, foreign

    result = await _command(bus, job_id="jsec", env={"NCCL_ALGO": "Ring"}, **start)
    assert result.ok, result
    job_dir = Path(result.job_dir)
    events = job_dir / "attempt-1" / "events.jsonl"
    await _until(lambda: any(e["event"] == "progress" for e in read_events(events)), "progress event")

    assert (job_dir / "output" / "tokenized" / "dataset_dict.json").is_file(), list((job_dir / "output").iterdir())
    trainer = _trainer_python(result.pid)
    assert trainer is not None, "no trainer process under the worker's child"
    status = Path(f"/proc/{trainer.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert all(int(u) != 0 for u in uids), status
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{trainer.pid}/environ").read_bytes().decode().split("\0")
        if "=" in item
    )
    assert not {k for k in environ if "DATABASE" in k or k.startswith("NATS") or k == "LD_PRELOAD"}, environ
    assert not [v for v in environ.values() if "hunter2" in v], "a credential reached the trainer"
    assert environ["PYTHONPATH"] == str(REPO_ROOT) and environ["NCCL_ALGO"] == "Ring", environ
    assert environ["OMP_NUM_THREADS"] == "3", environ  # the node's 3 cores, its one slot's share
    launch = json.loads((job_dir / "attempt-1" / "launch.json").read_text())
    assert launch["uid"] == int(uids[0]) and launch["bubblewrap"] is True, launch  # install.sh installs bwrap

    # Attempt 2 starts elsewhere on the shared folder (its worker raised the fence); attempt 1 is then
    # asked to checkpoint-stop: it may not publish that checkpoint.
    raise_fence(job_dir / "fence", 2)
    stopped = await _command(bus, kind="stop", job_id="jsec", attempt=1)
    assert not stopped.ok and stopped.error == CommandError.STOP_FAILED, stopped
    failed = [e for e in read_events(events) if e["event"] == "failed"]
    assert failed and "superseded by attempt 2" in failed[-1]["error"], read_events(events)[-3:]
    assert not list((job_dir / "output").glob("checkpoint-*")), "a superseded attempt published a checkpoint"
