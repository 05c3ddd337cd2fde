"""A whole stack with its own NATS and Postgres (so a test can really restart or stop them), two
workers of two CPU slots each, each worker on the bus through its own relay (partition.py) so a
test can cut it off, and real trainers; faults are injected into it and the invariants read back
from Postgres and the job folders.

Only the rules that schedule (priority_fifo, priority_scheduling) and complete operators' moves
(drain) act: rules that move jobs on their own (defragmentation, elastic growth, load balance,
consolidation, queue-order displacement, comm jitter, which two gloo ranks on two busy cores set
off) would make the workload's moves unpredictable; each has its own tests under tests/decider."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from cli.stack import Stack, StackOptions
from shared.infra.db import connect
from tests.chaos.partition import Partition
from tests.conftest import REPO_ROOT, models_root
from tests.e2e.conftest import LiveStack
from tests.e2e.test_loop import lora_job as e2e_lora_job

# Short, so a lost node and a missing trainer are decided within a test; a worker stops its trainers
# after half of it without the bus, so it must also outlast a NATS restart's few seconds by a margin.
NODE_TIMEOUT_S = 8.0
UNPREDICTABLE_RULES = (
    "defragmentation",
    "elastic_scale",
    "load_balance",
    "consolidate",
    "queue_order",
    "comm_jitter",
    "oom_protection",
)
DONE = {"succeeded", "failed", "cancelled"}


class ChaosStack(LiveStack):
    """A LiveStack whose Postgres is its own: `stop_postgres` and `start_postgres` are real."""

    def __init__(self, stack: Stack, home: Path, partitions: dict[str, Partition]) -> None:
        super().__init__(stack, env=None)
        self.home = home
        self.partitions = partitions  # node -> the relay its worker reaches NATS through

    def sql(self, query: str, *args):
        async def fetch():
            conn = await connect(self.stack.database_url)  # with the json codecs the stack's services use
            try:
                return await conn.fetch(query, *args)
            finally:
                await conn.close()

        return asyncio.run(fetch())

    def stop_postgres(self) -> None:
        self.stack._pg.stop()

    def start_postgres(self) -> None:
        self.stack._pg.start()

    def restart_nats(self, down_s: float = 2.0) -> None:
        """Stop the stack's own NATS (JetStream on disk) and start it again on the same port and data."""
        self.stack._nats.restart(down_s)

    def leader(self, role: str) -> str:
        """The stack process name of the role's leader, from its lease in NATS KV."""

        async def read():
            from shared.infra.bus import Bus
            from shared.infra.leases import bucket_name

            # The decider's key: it reads the leases bucket (the bus lets no anonymous client in).
            bus = await Bus.connect(
                self.stack.nats_url, self.stack.o.prefix, "chaos-probe", self.stack.bus.keys.credential("decider")
            )
            try:
                kv = await bus.js.key_value(bucket_name(self.stack.o.prefix))
                return (await kv.get(role)).value.decode()
            finally:
                await bus.close()

        deadline = time.monotonic() + 30
        while True:
            try:
                pid = int(asyncio.run(read()).rsplit("-", 2)[-2])
                [name] = [n for n, p in self.stack.procs.items() if p.pid == pid and p.poll() is None]
                return name
            except Exception:  # noqa: BLE001 - no leader yet (or the lease names a dead one)
                assert time.monotonic() < deadline, f"no {role} leader"
                time.sleep(0.1)

    def job_folder(self, job_id: str) -> Path:
        return self.home / "data" / "jobs" / job_id

    def trainer_events(self, job_id: str, attempt: int = 1) -> list[dict]:
        path = self.job_folder(job_id) / f"attempt-{attempt}" / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_trainer_event(self, job_id: str, kind: str, timeout: float = 180, attempt: int = 1) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.trainer_events(job_id, attempt) if e.get("event") == kind]
            if found:
                return found[-1]
            time.sleep(0.1)
        seen = [e.get("event") for e in self.trainer_events(job_id, attempt) if e.get("event") != "progress"]
        raise AssertionError(
            f"no {kind} event from attempt {attempt} of {job_id} in {timeout}s; it wrote {seen}, "
            f"the job is {self.job(job_id)}"
        )

    def progress(self, job_id: str, attempt: int) -> list[int]:
        """The steps an attempt trained, in order, from its own events file."""
        return [e["step"] for e in self.trainer_events(job_id, attempt) if e.get("event") == "progress"]

    def history(self, job_id: str) -> list[str]:
        return [
            r["new_status"]
            for r in self.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)
        ]

    def wait_step(self, job_id: str, step: int, timeout: float = 120) -> dict:
        """The job once it runs at `step` or beyond, as the api shows it."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] == "running" and (job["progress"] or {}).get("step", 0) >= step:
                return job
            assert job["status"] not in DONE and time.monotonic() < deadline, (step, job)
            time.sleep(0.1)

    def healthy(self) -> None:
        """Every process alive, every api replica ready, every node ready."""
        import httpx

        self.wait_ready()
        for url in self.stack.api_urls:
            assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        assert self.stack.check_alive() == []
        self.wait_nodes(len(self.stack.nodes), timeout=30)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.http.get("/readyz").status_code == 200:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert time.monotonic() < deadline, "api not ready again"
            time.sleep(0.2)


@pytest.fixture(scope="package")
def chaos(tmp_path_factory):
    """One stack for the whole chaos folder (starting one costs more than most faults)."""
    # Postgres runs as the postgres user when we are root: its folder must be reachable (pytest's are 0700).
    home = Path(tempfile.mkdtemp(prefix="adc-chaos-", dir="/tmp"))
    home.chmod(0o755)
    # Its own NATS and Postgres, so both can really be stopped; the replicated topology.
    stack = Stack(
        StackOptions(
            home=home,
            workers=2,
            cpu_slots=2,
            api_port=0,
            nats_url=None,
            database_url=None,
            replicas=2,
            roots=[REPO_ROOT, models_root(tmp_path_factory)],  # the examples' data and the session's tiny model
            overrides={
                "controller": {"interval": 1},
                "worker": {"heartbeat_interval": 1, "node_timeout": NODE_TIMEOUT_S},
                "strategies": {rule: {"enabled": False} for rule in UNPREDICTABLE_RULES},
            },
        )
    )
    partitions = {node: Partition(lambda: stack.nats_url) for node in stack.nodes}
    stack.o.worker_env = {node: {"NATS_URL": relay.url} for node, relay in partitions.items()}
    try:
        stack.start(progress=lambda *_: None)
        live = ChaosStack(stack, home, partitions)
        live.wait_nodes(len(stack.nodes))
        yield live
    finally:
        stack.stop()
        for relay in partitions.values():
            relay.close()
        shutil.rmtree(home, ignore_errors=True)


def lora_job(tiny_model: Path, data_dir: Path, name: str, steps: int, save_steps: int) -> dict:
    # 32 samples of batch 2 are 16 steps an epoch: `steps` that is not a multiple of 16 is the case
    # where transformers would take one step more on a resume at max_steps.
    spec = e2e_lora_job(tiny_model, data_dir, name=name, steps=steps)
    spec["train"].update(logging_steps=1, save_steps=save_steps)
    return spec
