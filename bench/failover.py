"""Leader failover: the time from `kill -9` of the decider (or executor) leader to the first action
taken by its successor, over N tries each, on the real stack (`adc up --replicas 2`, its own
NATS and Postgres, one worker with simulated GPUs, real tiny LoRA trainers).

Each try: find the leader from its lease (NATS KV), SIGKILL it, submit a job at once, and time
  decider:  kill -> the new leader's start decision for that job (the decision's own timestamp);
  executor: kill -> the job's `scheduled` transition, the successor's first act on the decision
            the (still running) decider published for it.
The killed process is restarted as the new standby, the job cancelled, and the next try kills
whoever leads now. At the end, from Postgres and the decisions stream: every decision published
is in the executor's ledger and finished (none lost), no job was scheduled twice for one attempt
and no decision was carried out twice (none executed twice).

    .venv/bin/python bench/failover.py [--tries 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cli.stack import Stack, StackOptions  # noqa: E402
from shared.contracts.job_status import JobStatus  # noqa: E402
from shared.contracts.messages import Decision  # noqa: E402
from shared.infra.bus import Bus  # noqa: E402
from shared.infra.db import connect  # noqa: E402
from shared.infra.job_reads.one_job import job_row  # noqa: E402
from shared.infra.leases import bucket_name  # noqa: E402


def job_spec(model: Path, name: str) -> dict:
    return {
        "name": name,
        "gpus": 1,
        "train": {
            "model_name_or_path": str(model),
            "stage": "sft",
            "finetuning_type": "lora",
            "lora_rank": 4,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(REPO / "examples" / "data"),
            "cutoff_len": 32,
            "max_samples": 8,
            "per_device_train_batch_size": 2,
            "max_steps": 400,
            "save_steps": 1000,
        },
    }


class Bench:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)

    async def open(self) -> None:
        # As the admin role, over the stack's TLS: reads the lease bucket and the decisions stream.
        bus = await Bus.connect(
            self.stack.nats_url, self.stack.o.prefix, "bench-failover", self.stack.bus.keys.credential("admin")
        )
        self.nc = bus.nc
        self.kv = None
        self.db = await connect(self.stack.database_url)

    async def leader(self, role: str, timeout: float = 30) -> tuple[str, int]:
        """The stack process name and lease token of the role's current leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.kv = self.kv or await self.nc.jetstream().key_value(bucket_name(self.stack.o.prefix))
                entry = await self.kv.get(role)
                pid = int(entry.value.decode().rsplit("-", 2)[-2])
                for name, proc in self.stack.procs.items():
                    if proc.pid == pid and proc.poll() is None:
                        return name, entry.revision
            except Exception:  # noqa: BLE001 - no leader yet
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no {role} leader within {timeout}s")

    async def wait_row(self, query: str, *args, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = await self.db.fetchrow(query, *args)
            if row is not None:
                return row
            await asyncio.sleep(0.02)
        raise RuntimeError(f"nothing for {query} {args} within {timeout}s")

    def submit(self, spec: dict) -> str:
        r = self.http.post("/v1/jobs", json=spec)
        r.raise_for_status()
        return r.json()["id"]

    async def standby_up(self, name: str, role: str) -> None:
        """Restart the killed instance and wait until it is a live standby (its process has been up a while)."""
        self.stack.restart(name)
        await asyncio.sleep(2.5)  # imports and connecting; a standby needs nothing more
        if self.stack.procs[name].poll() is not None:
            raise RuntimeError(f"{name} did not come back; see {self.stack.logs / (name + '.log')}")

    async def finish(self, job_id: str, timeout: float = 90) -> None:
        self.http.post(f"/v1/jobs/{job_id}/cancel")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = await job_row(self.db, job_id)
            if row is not None and JobStatus(row["status"]).terminal:
                return
            await asyncio.sleep(0.02)
        raise RuntimeError(f"job {job_id} did not end within {timeout}s")

    async def try_decider(self, model: Path, i: int) -> float:
        name, token = await self.leader("decider")
        killed_at = time.time()
        os.kill(self.stack.procs[name].pid, signal.SIGKILL)
        self.stack.procs[name].wait()
        job_id = self.submit(job_spec(model, f"failover-decider-{i}"))
        row = await self.wait_row("SELECT payload FROM decisions WHERE job_id = $1 AND action = 'start'", job_id)
        decision = Decision.model_validate(row["payload"])
        assert decision.fence is not None and decision.fence > token, (decision.fence, token)
        took = decision.ts - killed_at
        await self.standby_up(name, "decider")
        await self.finish(job_id)
        return took

    async def try_executor(self, model: Path, i: int) -> float:
        name, token = await self.leader("executor")
        killed_at = time.time()
        os.kill(self.stack.procs[name].pid, signal.SIGKILL)
        self.stack.procs[name].wait()
        job_id = self.submit(job_spec(model, f"failover-executor-{i}"))
        row = await self.wait_row(
            "SELECT extract(epoch FROM at) AS at FROM job_status_history"
            " WHERE job_id = $1 AND new_status = 'scheduled'",
            job_id,
        )
        took = float(row["at"]) - killed_at
        await self.standby_up(name, "executor")
        await self.finish(job_id)
        return took

    async def published_decisions(self) -> list[Decision]:
        js = self.nc.jetstream()
        stream = f"{self.stack.o.prefix.upper()}_DECISIONS"
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                found.append(Decision.decode((await js.get_msg(stream, seq)).data))
            except Exception:  # noqa: BLE001 - a deleted sequence
                pass
        return found

    async def check(self) -> dict:
        await asyncio.sleep(3)  # the last decisions settle
        published = await self.published_decisions()
        ledger = {r["decision_id"]: r["state"] for r in await self.db.fetch("SELECT decision_id, state FROM decisions")}
        lost = [d.decision_id for d in published if d.decision_id not in ledger]
        unfinished = [d for d, s in ledger.items() if s == "received"]
        twice = []  # jobs scheduled more often than they have had attempts
        for r in await self.db.fetch(
            "SELECT job_id, count(*) AS n FROM job_status_history WHERE new_status = 'scheduled' GROUP BY job_id"
        ):
            job = await job_row(self.db, r["job_id"])
            if job is not None and r["n"] > job["attempt"]:
                twice.append({"job_id": r["job_id"], "attempt": job["attempt"], "n": r["n"]})
        carried_twice = await self.db.fetch(
            "SELECT decision_id, count(*) AS n FROM job_status_history WHERE new_status = 'scheduled'"
            " AND decision_id IS NOT NULL GROUP BY decision_id HAVING count(*) > 1"
        )
        refused = await self.db.fetchval("SELECT count(*) FROM decisions WHERE state = 'refused'")
        return {
            "published": len(published),
            "in_ledger": len(ledger),
            "lost": lost,
            "unfinished": unfinished,
            "jobs_scheduled_twice": twice,
            "decisions_carried_twice": [dict(r) for r in carried_twice],
            "refused": refused,
        }


def summary(name: str, times: list[float]) -> str:
    return (
        f"{name:<9} failover over {len(times)} tries: p50 {statistics.median(times):.2f} s, max {max(times):.2f} s"
        f"  ({', '.join(f'{t:.2f}' for t in times)})"
    )


def main(tries: int, home: Path) -> int:
    from worker.trainer.tiny_model import build_tiny_llama

    model = build_tiny_llama(home / "models" / "tiny-llama")
    stack = Stack(
        StackOptions(
            home=home / "stack",
            workers=1,
            simulate_gpus=8,
            replicas=2,
            api_port=0,
            prefix="fobench",
            roots=[REPO, home / "models"],
            # No standby trainer: what is timed is the controllers' failover, not a trainer's start.
            overrides={"controller": {"interval": 1}, "worker": {"heartbeat_interval": 1, "standby_trainers": 0}},
        )
    )
    try:
        stack.start(progress=lambda *_: None)
        return asyncio.run(measure(Bench(stack), model, tries))
    finally:
        stack.stop()


async def measure(bench: Bench, model: Path, tries: int) -> int:
    await bench.open()
    lease_s = 2.0
    decider, executor = [], []
    for i in range(tries):
        decider.append(await bench.try_decider(model, i))
        executor.append(await bench.try_executor(model, i))
        print(f"try {i + 1}: decider {decider[-1]:.2f} s, executor {executor[-1]:.2f} s", flush=True)
    checked = await bench.check()
    print(summary("decider", decider))
    print(summary("executor", executor))
    print(f"lease {lease_s:g} s (leases.lease_s); decisions: {json.dumps(checked)}")
    ok = not (
        checked["lost"]
        or checked["unfinished"]
        or checked["jobs_scheduled_twice"]
        or checked["decisions_carried_twice"]
    )
    print("no decision lost or executed twice" if ok else "INVARIANT BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="adc-failover-", dir="/tmp"))
    home.chmod(0o755)  # Postgres runs as the postgres user when we are root
    try:
        sys.exit(main(args.tries, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
