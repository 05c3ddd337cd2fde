"""API throughput: job submissions per second, and audit query latency over 1M audit rows.

Prints:
1. submissions: jobs accepted per second through POST /v1/jobs (spec validation, quota check,
   insert, audit + job event on JetStream inside the transaction) with N concurrent clients,
   and the p50/p99 of one submission;
2. the bulk load: 1,000,000 hash-chained audit rows (chained exactly as the audit sink does,
   so the verifier accepts them), written with COPY;
3. audit queries over those rows through GET /v1/audit, p50/p99 per query shape (by job,
   kind, rule, actor, node, an hour of time, a deep cursor, the last N, a user's team view);
4. GET /v1/audit/verify over the whole chain: rows per second.

Everything runs in a throwaway database and bus prefix, against a real api process.
Usage: .venv/bin/python bench/api.py [--rows 1000000] [--jobs 2000] [--clients 16] [--queries 200]
Needs Postgres at 127.0.0.1:5432 (as the tests do); starts its own nats-server with ADC's
authorization (as `adc up` does).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import asyncpg  # noqa: E402
import httpx  # noqa: E402
import yaml  # noqa: E402

from cli.local_services import LocalNats, api_ready, free_port  # noqa: E402
from services.api.auth import create_token  # noqa: E402
from shared.audit_chain import GENESIS, row_hash  # noqa: E402
from shared.bus import init_streams  # noqa: E402
from shared.bus_auth import BusDeployment, CredentialStore  # noqa: E402
from shared.db import migrate  # noqa: E402

PG_ADMIN_URL = os.environ.get("ADC_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
COLUMNS = ["event_id", "ts", "source", "kind", "actor", "job_id", "node", "decision_id", "rule", "action", "reason",
           "evidence", "data", "prev_hash", "hash"]
NODES = [f"node-{i}" for i in range(1, 65)]
RULES = ["priority_fifo", "oom_protection", "load_balance", "comm_jitter", "priority_scheduling", "manual"]
ACTORS = [f"{name} (user, team {team})" for name in ("ci-bot", "alice", "bob", "carol") for team in
          ("vision", "nlp", "speech")]
TEAM = "bench"  # the submitting user's team


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- setup ----------------------------------------------------------------------------

async def create_database(name: str) -> str:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = PG_ADMIN_URL.rpartition("/")[0] + f"/{name}"
    await migrate(url)
    return url


async def drop_database(db_name: str) -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    finally:
        await admin.close()


def start_api(work: Path, database_url: str, bus: BusDeployment, nats_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {"bus": {"url": nats_url, "prefix": bus.prefix, "credentials_dir": str(bus.keys.directory)},
              "database": {"url": database_url, "pool_max": 20},
              "storage": {"root": str(work / "data"), "data_root": str(REPO_ROOT)},
              "api": {"host": "127.0.0.1", "port": port},
              # As an admin declares them: the bench team owns its models folder; the example datasets are shared.
              "tenancy": {"team_roots": {TEAM: [str(work / "models")]},
                          "shared_roots": [str(REPO_ROOT / "examples" / "data")]}}
    (work / "adc_config.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL", "ADC_BUS_PREFIX")}
    proc = subprocess.Popen([sys.executable, "-m", "services.api", "--config", str(work / "adc_config.yaml")],
                            cwd=str(REPO_ROOT), env=env, stdout=open(work / "api.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if api_ready(url, proc, 30):
        return proc, url
    raise SystemExit(f"the api did not start; see {work / 'api.log'}")


# --- 1. submissions ---------------------------------------------------------------------

async def bench_submissions(url: str, token: str, model_dir: Path, jobs: int, clients: int) -> list[str]:
    spec = {"gpus": 1, "train": {"model_name_or_path": str(model_dir), "stage": "sft", "finetuning_type": "lora",
                                 "dataset": "alpaca_en_demo", "dataset_dir": str(REPO_ROOT / "examples" / "data"),
                                 "max_steps": 100}}
    latencies: list[float] = []
    ids: list[str] = []
    counter = iter(range(jobs))

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            for i in counter:
                started = time.perf_counter()
                r = await http.post("/v1/jobs", json=spec | {"name": f"bench-{i}"})
                latencies.append(time.perf_counter() - started)
                if r.status_code != 201:
                    raise SystemExit(f"submission refused: {r.status_code} {r.text}")
                ids.append(r.json()["id"])

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    print(f"submissions: {jobs} jobs, {clients} concurrent clients: {jobs / elapsed:,.0f} jobs/s "
          f"(p50 {percentile(latencies, 0.5) * 1000:.1f} ms, p99 {percentile(latencies, 0.99) * 1000:.1f} ms)")
    return ids


# --- 2. a million chained rows -------------------------------------------------------------

def audit_rows(count: int, job_ids: list[str], start: datetime, rng: random.Random):
    """Rows as the sink would write them, chained; yields COPY-ready tuples."""
    prev = GENESIS
    step = timedelta(days=30) / count
    for i in range(count):
        ts = start + step * i
        roll = rng.random()
        job = rng.choice(job_ids)
        if roll < 0.3:
            row = {"source": "decider", "kind": "decision", "actor": None, "job_id": job, "node": rng.choice(NODES),
                   "decision_id": f"d{i}", "rule": rng.choice(RULES), "action": "start",
                   "reason": "queue position 1; best fit", "evidence": {"gpus_needed": 1, "free": rng.randint(1, 8)},
                   "data": {"rule_ms": 0.42}}
        elif roll < 0.8:
            row = {"source": "executor", "kind": rng.choice(("job.scheduled", "job.starting", "job.running",
                                                              "job.succeeded")),
                   "actor": None, "job_id": job, "node": rng.choice(NODES), "decision_id": None, "rule": None,
                   "action": None, "reason": "moved by the executor", "evidence": {}, "data": {"attempt": 1}}
        elif roll < 0.95:
            row = {"source": "executor", "kind": "command.start", "actor": None, "job_id": job,
                   "node": rng.choice(NODES), "decision_id": f"d{i}", "rule": None, "action": "start",
                   "reason": "trainer started", "evidence": {}, "data": {"ok": True}}
        else:
            row = {"source": "api", "kind": "job.submitted", "actor": rng.choice(ACTORS), "job_id": job,
                   "node": None, "decision_id": None, "rule": None, "action": None, "reason": "submitted",
                   "evidence": {}, "data": {"gpus": 1}}
        row["event_id"] = f"bench:{i}"
        row["ts"] = ts
        digest = row_hash(prev, row)
        yield (row["event_id"], ts, row["source"], row["kind"], row["actor"], row["job_id"], row["node"],
               row["decision_id"], row["rule"], row["action"], row["reason"], json.dumps(row["evidence"]),
               json.dumps(row["data"]), prev, digest)
        prev = digest


async def load_audit(database_url: str, count: int, job_ids: list[str], start: datetime) -> None:
    conn = await asyncpg.connect(database_url)
    rng = random.Random(7)
    started = time.perf_counter()
    hashing = 0.0
    try:
        rows = audit_rows(count, job_ids, start, rng)
        while True:
            t0 = time.perf_counter()
            chunk = [r for _, r in zip(range(50_000), rows)]
            hashing += time.perf_counter() - t0
            if not chunk:
                break
            await conn.copy_records_to_table("audit_events", records=chunk, columns=COLUMNS)
        await conn.execute("ANALYZE audit_events")
    finally:
        await conn.close()
    elapsed = time.perf_counter() - started
    print(f"bulk load: {count:,} chained audit rows in {elapsed:.1f} s ({count / elapsed:,.0f} rows/s; "
          f"hashing {hashing:.1f} s of it)")


# --- 3. queries ---------------------------------------------------------------------------

async def bench_queries(url: str, admin: str, user: str, job_ids: list[str], start: datetime, rows: int,
                        queries: int) -> None:
    rng = random.Random(11)

    def hour() -> dict:
        at = start + timedelta(seconds=rng.uniform(0, 29 * 24 * 3600))
        return {"since": at.isoformat(), "until": (at + timedelta(hours=1)).isoformat()}

    shapes = [
        ("by job", admin, lambda: {"job_id": rng.choice(job_ids)}),
        ("by kind (decision)", admin, lambda: {"kind": "decision", "after_id": rng.randint(0, rows)}),
        ("by rule", admin, lambda: {"rule": rng.choice(RULES), "after_id": rng.randint(0, rows)}),
        ("by actor", admin, lambda: {"actor": rng.choice(ACTORS)}),
        ("by node", admin, lambda: {"node": rng.choice(NODES), "after_id": rng.randint(0, rows)}),
        ("one hour of time", admin, hour),
        ("deep cursor, no filter", admin, lambda: {"after_id": rng.randint(rows // 2, rows)}),
        ("the last 100", admin, lambda: {"last": 100}),
        ("a user's team, by job", user, lambda: {"job_id": rng.choice(job_ids)}),
        ("a user's team, all", user, lambda: {"after_id": rng.randint(0, rows)}),
    ]
    print(f"audit queries over {rows:,} rows, {queries} each, through GET /v1/audit (limit 100):")
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for name, token, params in shapes:
            times, returned = [], 0
            for _ in range(queries):
                started = time.perf_counter()
                r = await http.get("/v1/audit", params=params(), headers={"Authorization": f"Bearer {token}"})
                times.append(time.perf_counter() - started)
                if r.status_code != 200:
                    raise SystemExit(f"{name}: {r.status_code} {r.text}")
                returned += len(r.json()["items"])
            p50, p99 = percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000
            print(f"  {name:<24} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   ({returned / queries:.0f} rows/answer)")


async def bench_verify(url: str, admin: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
        started = time.perf_counter()
        r = (await http.get("/v1/audit/verify", headers={"Authorization": f"Bearer {admin}"})).json()
        elapsed = time.perf_counter() - started
    state = "intact" if r["ok"] else f"BROKEN at #{r['broken']['id']}"
    print(f"verify: {r['rows_checked']:,} rows {state} in {elapsed:.1f} s ({r['rows_checked'] / elapsed:,.0f} rows/s)")


# --- main ---------------------------------------------------------------------------------

async def prepare(database_url: str, work: Path) -> tuple[str, str, Path]:
    conn = await asyncpg.connect(database_url)
    try:
        _, admin = await create_token(conn, "bench-admin", "admin", "platform")
        _, user = await create_token(conn, "bench-user", "user", TEAM)
    finally:
        await conn.close()
    model = work / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # the api checks that a model folder exists; nothing trains
    return admin, user, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    tag = secrets.token_hex(4)
    db_name, prefix = f"adc_bench_{tag}", f"bench{tag}"
    api = None
    with tempfile.TemporaryDirectory(prefix="adc-bench-api-") as tmp:
        work = Path(tmp)
        bus = BusDeployment(prefix, (), CredentialStore(work / "keys"))
        nats_server = LocalNats(work / "nats", work / "nats.log")
        try:
            nats_url = nats_server.start(bus)
            asyncio.run(init_streams(nats_url, bus))
            database_url = asyncio.run(create_database(db_name))
            admin, user, model = asyncio.run(prepare(database_url, work))
            api, url = start_api(work, database_url, bus, nats_url)
            job_ids = asyncio.run(bench_submissions(url, user, model, args.jobs, args.clients))
            start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(days=30)
            asyncio.run(load_audit(database_url, args.rows, job_ids, start))
            asyncio.run(bench_queries(url, admin, user, job_ids, start, args.rows, args.queries))
            asyncio.run(bench_verify(url, admin))
        finally:
            if api is not None:
                api.terminate()
                api.wait(15)
            nats_server.stop()
            asyncio.run(drop_database(db_name))


if __name__ == "__main__":
    main()
