"""The whole stack in processes, on the real NATS and Postgres, with real trainer subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack, StackOptions
from tests.conftest import REPO_ROOT, Isolated, models_root


class LiveStack:
    def __init__(self, stack: Stack, env: Isolated) -> None:
        self.stack = stack
        self.env = env
        self.http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)

    def submit(self, spec: dict) -> dict:
        r = self.http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()

    def job(self, job_id: str) -> dict:
        r = self.http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_for(
        self, job_id: str, statuses: set[str], timeout: float = 180, may_be_dead: set[str] = frozenset()
    ) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            dead = set(self.stack.check_alive()) - may_be_dead
            assert not dead, f"stack processes died: {dead}"
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} still {job['status']} after {timeout}s: {job}")

    def chain_breaks(self):
        """Where the audit hash chain (keyed, as the stack keys it) breaks; None if it holds."""
        from shared.infra.audit_chain import find_break, load_chain_key

        rows = [dict(r) for r in self.sql("SELECT * FROM audit_events ORDER BY id")]
        return find_break(rows, key=load_chain_key(self.stack.chain_key_file))

    def audit(self, **params) -> list[dict]:
        r = self.http.get("/v1/audit", params={"limit": 1000, **params})
        assert r.status_code == 200, r.text
        return r.json()["items"]

    def wait_audit(self, done, timeout: float = 30, **params) -> list[dict]:
        """The audit trail (filtered by `params`) once `done(trail)` holds: the sink writes it after the
        status changed, so a test waits for the events it reads, not for the status."""
        deadline = time.monotonic() + timeout
        while True:
            trail = self.audit(**params)
            if done(trail):
                return trail
            assert time.monotonic() < deadline, f"audit never showed what was awaited: {[e['kind'] for e in trail]}"
            time.sleep(0.2)

    def sql(self, query: str, *args):
        return self.env.sql(query, *args)

    def trainer_record(self, job_id: str, node: str) -> dict:
        """The node's worker's record of the job's trainer (pid, attempt, ...), from its registry."""
        return json.loads((self.stack.home / "data" / "nodes" / node / "trainers" / f"{job_id}.json").read_text())

    def freeze(self, job_id: str) -> int:
        """SIGSTOP to the process group of the job's current trainer (its first node's): a frozen trainer
        trains no step, so a test decides when a move begins rather than racing a tiny model to its end.
        Returns the group to `thaw`."""
        job = self.job(job_id)
        record = self.trainer_record(job_id, job["placement"][0]["node"])
        assert record["attempt"] == job["attempt"], (record, job)
        os.killpg(record["pid"], signal.SIGSTOP)
        return record["pid"]

    @staticmethod
    def thaw(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)

    @contextlib.contextmanager
    def trainer_held(self, job_id: str):
        """The job's trainer frozen for the block: a move asked inside it begins before the job can finish."""
        pgid = self.freeze(job_id)
        try:
            yield
        finally:
            self.thaw(pgid)

    def wait_nodes(self, count: int, timeout: float = 60) -> None:
        """Until `count` nodes have registered and are ready: a test that cordons or moves onto a node
        right after start would otherwise race the workers' registration."""
        deadline = time.monotonic() + timeout
        while len(self.sql("SELECT 1 FROM nodes WHERE status = 'ready'")) < count:
            assert time.monotonic() < deadline, f"fewer than {count} nodes ready after {timeout}s"
            time.sleep(0.2)


def running_stack(
    tmp_path_factory,
    workers: int = 2,
    cpu_slots: int = 1,
    controller: dict | None = None,
    worker: dict | None = None,
    strategies: dict | None = None,
    worker_args: dict[str, list[str]] | None = None,
    simulate_gpus: int = 0,
    simulated_usage_dir: Path | None = None,
    roots: list[Path] | None = None,
    trusted_code_roots: list[Path] | None = None,
    backend: str = "local",
):
    """A whole stack on its own database and bus prefix, for a test module; stopped and cleaned after.
    `roots`: more folders its team may read (beyond the repo and the session's models);
    `trusted_code_roots`: model folders whose own code may run (`trust_remote_code: true`)."""
    env = Isolated(nodes=tuple(f"node-{i}" for i in range(1, workers + 1))).open()
    stack = Stack(
        StackOptions(
            home=tmp_path_factory.mktemp("stack"),
            workers=workers,
            cpu_slots=cpu_slots,
            api_port=0,
            simulate_gpus=simulate_gpus,
            simulated_usage_dir=simulated_usage_dir,
            nats_url=env.nats_url,
            bus_credentials=env.keys.directory,
            database_url=env.database_url,
            prefix=env.prefix,
            roots=[REPO_ROOT, *(roots or [])],  # adc up's default root, and what the module adds
            overrides={
                "controller": {"interval": 1, **(controller or {})},
                # No standby trainers unless a test is about them: each imports the trainer's libraries
                # (seconds of CPU) at every stack start, which the suite's many stacks would all pay.
                "worker": {"heartbeat_interval": 1, "standby_trainers": 0, **(worker or {})},
                # Every team (the admin's, and the browser tests' alpha and beta) reads the examples' data
                # and the session's models; the admin's team also the repo (adc up's default root).
                "tenancy": {
                    "shared_roots": [str(REPO_ROOT / "examples"), str(models_root(tmp_path_factory))],
                    "trusted_code_roots": [str(r) for r in trusted_code_roots or []],
                },
                **({"strategies": strategies} if strategies else {}),
            },
            worker_args=worker_args or {},
            backend=backend,
        )
    )
    try:
        stack.start(progress=lambda *_: None)
        live = LiveStack(stack, env)
        live.wait_nodes(workers)
        yield live
    finally:
        stack.stop()
        env.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    yield from running_stack(tmp_path_factory)
