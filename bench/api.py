"""API throughput: job submissions per second, and audit query latency over 1M audit rows.

Prints:
1. submissions: jobs accepted per second through POST /v1/jobs (authentication, spec validation
   against LLaMA-Factory's schema, the team's tenant roots, quota check, insert, audit + job event
   on JetStream inside the transaction) with N concurrent clients, the p50/p99 of one submission,
   and the api's CPU time per submission (user + system, from /proc: the figure that holds on a
   machine others use too), beside that of the Postgres backends, the nats-server and the bench's own clients;
2. the bulk load: 1,000,000 hash-chained audit rows (chained exactly as the audit sink does,
   so the verifier accepts them), written with COPY;
3. audit queries over those rows through GET /v1/audit, p50/p99 per query shape (by job,
   kind, rule, actor, node, an hour of time, a deep cursor, the last N, a user's team view);
4. GET /v1/audit/verify over the whole chain: rows per second.

With `--baseline REV` the same run also measures the code of commit REV (`git archive`, its api
started from there, on the same database, bus and machine): submissions in alternating rounds,
REV's api first; audit queries on REV's schema and api, then, after this tree's migrations, on
this tree's. Each figure is printed beside REV's.

The jobs table also holds `--past-jobs` finished jobs of 50 other teams, as a cluster with that
much audit history would: a user's view looks names up among them to hide other teams' jobs.

Everything runs in a throwaway database and bus prefix, against real api processes (`--api-processes`
of them, each on its port as `adc up --replicas N` runs them, the clients spread over them).
The clients speak HTTP/1.1 over one kept-alive connection each, written here so that the bench's
own CPU stays small beside the api's on a machine with few cores.
Usage: .venv/bin/python bench/api.py [--rows 1000000] [--jobs 2000] [--clients 16] [--queries 200]
                                     [--past-jobs 100000] [--api-processes 1] [--rounds 2] [--baseline REV]
Needs Postgres at 127.0.0.1:5432 (as the tests do); starts its own nats-server with ADC's
authorization (as `adc up` does).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import os
import random
import secrets
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import asyncpg  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402

from cli.local_services import LocalNats, api_ready, free_port  # noqa: E402
from services.api.auth import create_token  # noqa: E402
from shared.infra.audit_chain import CHAINED_FIELDS, GENESIS, row_hash  # noqa: E402
from shared.infra.bus import init_streams  # noqa: E402
from shared.infra.bus_auth import BusDeployment, CredentialStore  # noqa: E402
from shared.infra.db import MIGRATIONS_DIR, migrate  # noqa: E402
from shared.specs.train_spec import schema_path  # noqa: E402

PG_ADMIN_URL = os.environ.get("ADC_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
COLUMNS = [*CHAINED_FIELDS, "prev_hash", "hash"]  # an audit row as the sink writes it
NODES = [f"node-{i}" for i in range(1, 65)]
RULES = ["priority_fifo", "oom_protection", "load_balance", "comm_jitter", "priority_scheduling", "manual"]
ACTORS = [
    f"{name} (user, team {team})"
    for name in ("ci-bot", "alice", "bob", "carol")
    for team in ("vision", "nlp", "speech")
]
TEAM = "bench"  # the submitting user's team


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- setup ----------------------------------------------------------------------------


async def create_database(name: str, migrations: Path) -> str:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = PG_ADMIN_URL.rpartition("/")[0] + f"/{name}"
    await migrate(url, migrations)
    return url


async def drop_database(db_name: str) -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    finally:
        await admin.close()


def export_tree(rev: str, into: Path) -> Path:
    """The files of commit `rev` (git archive), to run its api from."""
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {archive.stderr.decode().strip()}")
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


@dataclass
class Api:
    """One or more api processes of one code tree; `label` names the tree in what is printed."""

    label: str
    tree: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def start(self, work: Path, database_url: str, bus: BusDeployment, nats_url: str, processes: int) -> None:
        for i in range(processes):
            port = free_port()
            config = {
                "bus": {"url": nats_url, "prefix": bus.prefix, "credentials_dir": str(bus.keys.directory)},
                "database": {"url": database_url, "pool_max": 20},
                "storage": {"root": str(work / "data"), "data_root": str(REPO_ROOT)},
                "api": {"host": "127.0.0.1", "port": port},
                # As an admin declares them: the bench team owns its models folder; the example
                # datasets are shared with every team.
                "tenancy": {
                    "team_roots": {TEAM: [str(work / "models")]},
                    "shared_roots": [str(REPO_ROOT / "examples" / "data")],
                },
            }
            name = f"api-{self.label.split()[0]}-{i + 1}"
            config_file = work / f"{name}.yaml"
            config_file.write_text(yaml.safe_dump(config))
            env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL", "ADC_BUS_PREFIX")}
            # Another tree validates against the same exported LLaMA-Factory schema as this one.
            env |= {"PYTHONPATH": str(self.tree), "ADC_LLAMAFACTORY_SCHEMA": str(schema_path().resolve())}
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.api", "--config", str(config_file)],
                cwd=str(self.tree),
                env=env,
                stdout=open(work / f"{name}.log", "wb"),
                stderr=subprocess.STDOUT,
            )
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
            if not api_ready(self.urls[-1], proc, 60):
                raise SystemExit(f"the api ({self.label}) did not start; see {work / (name + '.log')}")

    def cpu_seconds(self) -> float:
        return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(15)


class Http:
    """One kept-alive HTTP/1.1 connection; a request answers (status, body). A few lines of asyncio
    instead of a full client, so the bench spends little CPU per request beside the api."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
            + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else "")
            + "\r\n"
        )
        self.writer.write(head.encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                self.writer = None
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --- 1. submissions ---------------------------------------------------------------------


@dataclass
class Others:
    """The CPU the rest of a submission costs: the Postgres backends serving the bench's database (not
    the server's background writers) and the bench's own nats-server."""

    database_url: str
    nats_pid: int

    async def sample(self) -> dict[tuple[str, int], float]:
        conn = await asyncpg.connect(self.database_url)
        try:
            pids = [
                r["pid"]
                for r in await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
        finally:
            await conn.close()
        out = {}
        for kind, pid in [("nats", self.nats_pid), *(("pg", p) for p in pids)]:
            try:
                out[(kind, pid)] = sum(psutil.Process(pid).cpu_times()[:2])
            except psutil.Error:
                pass
        return out

    @staticmethod
    def spent(before: dict, after: dict) -> dict[str, float]:
        """CPU seconds by kind between two samples; a backend started in between counts whole."""
        spent = {"pg": 0.0, "nats": 0.0}
        for key, cpu in after.items():
            spent[key[0]] += cpu - before.get(key, 0.0)
        return spent


@dataclass
class Submissions:
    jobs: int = 0
    elapsed: float = 0.0
    cpu: float = 0.0  # the api processes' CPU seconds
    pg_cpu: float = 0.0  # the database's backends'
    nats_cpu: float = 0.0
    clients_cpu: float = 0.0  # this process's, which runs nothing but the clients while they submit
    latencies: list[float] = field(default_factory=list)

    def cpu_line(self) -> str:
        per = [self.cpu / self.jobs * 1000, self.pg_cpu / self.jobs * 1000, self.nats_cpu / self.jobs * 1000]
        total = sum(per)
        clients = self.clients_cpu / self.jobs * 1000
        cores = os.cpu_count() or 1
        return (
            f"CPU per submission: api {per[0]:.2f} + Postgres {per[1]:.2f} + NATS {per[2]:.2f} = {total:.2f} ms"
            f" (at most {1000 / total * cores:,.0f}/s on {cores} cores, the clients aside);"
            f" + clients {clients:.2f} = {total + clients:.2f} ms (at most {1000 / (total + clients) * cores:,.0f}/s)"
        )

    def line(self, clients: int, processes: int) -> str:
        return (
            f"{self.jobs} jobs, {clients} concurrent clients, {processes} api process"
            f"{'es' if processes > 1 else ''}: {self.jobs / self.elapsed:,.0f} jobs/s "
            f"(p50 {percentile(self.latencies, 0.5) * 1000:.1f} ms, p99 {percentile(self.latencies, 0.99) * 1000:.1f} ms); "
            f"api CPU {self.cpu / self.jobs * 1000:.2f} ms per submission"
        )


async def submit_round(
    api: Api, token: str, model_dir: Path, jobs: int, clients: int, into: Submissions, ids: list[str], others: Others
) -> None:
    spec = {
        "gpus": 1,
        "train": {
            "model_name_or_path": str(model_dir),
            "stage": "sft",
            "finetuning_type": "lora",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(REPO_ROOT / "examples" / "data"),
            "max_steps": 100,
        },
    }
    counter = iter(range(into.jobs, into.jobs + jobs))

    async def client(url: str) -> None:
        http = Http(url)
        try:
            for i in counter:
                body = json.dumps(spec | {"name": f"bench-{i}"}).encode()
                started = time.perf_counter()
                status, answer = await http.request("POST", "/v1/jobs", token, body)
                into.latencies.append(time.perf_counter() - started)
                if status != 201:
                    raise SystemExit(f"submission refused ({api.label}): {status} {answer.decode()[:2000]}")
                ids.append(json.loads(answer)["id"])
        finally:
            await http.close()

    before = await others.sample()
    cpu, started, own = api.cpu_seconds(), time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(url) for url, _ in zip(itertools.cycle(api.urls), range(clients))))
    into.elapsed += time.perf_counter() - started
    into.clients_cpu += time.process_time() - own
    into.cpu += api.cpu_seconds() - cpu
    spent = Others.spent(before, await others.sample())
    into.pg_cpu += spent["pg"]
    into.nats_cpu += spent["nats"]
    into.jobs += jobs


async def bench_submissions(
    apis: list[Api], token: str, model_dir: Path, jobs: int, clients: int, rounds: int, others: Others
) -> list[str]:
    """`jobs` submissions per api tree, in `rounds` rounds alternating between the trees."""
    ids: list[str] = []
    results = {api.label: Submissions() for api in apis}
    per_round = [jobs // rounds + (1 if r < jobs % rounds else 0) for r in range(rounds)]
    for count in per_round:
        for api in apis:
            await submit_round(api, token, model_dir, count, clients, results[api.label], ids, others)
    processes = len(apis[0].procs)
    if len(apis) == 1:
        print(f"submissions: {results[apis[0].label].line(clients, processes)}")
        print(f"  {results[apis[0].label].cpu_line()}")
    else:
        print(f"submissions, {rounds} rounds alternating:")
        for api in apis:
            print(f"  {api.label:<28} {results[api.label].line(clients, processes)}")
            print(f"  {'':<28} {results[api.label].cpu_line()}")
        before, after = (results[api.label] for api in apis)
        print(
            f"  after / before: {(after.jobs / after.elapsed) / (before.jobs / before.elapsed):.2f}x the rate, "
            f"{(after.cpu / after.jobs) / (before.cpu / before.jobs):.2f}x the api CPU per submission"
        )
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
            row = {
                "source": "decider",
                "kind": "decision",
                "actor": None,
                "job_id": job,
                "node": rng.choice(NODES),
                "decision_id": f"d{i}",
                "rule": rng.choice(RULES),
                "action": "start",
                "reason": "queue position 1; best fit",
                "evidence": {"gpus_needed": 1, "free": rng.randint(1, 8)},
                "data": {"rule_ms": 0.42},
            }
        elif roll < 0.8:
            row = {
                "source": "executor",
                "kind": rng.choice(("job.scheduled", "job.starting", "job.running", "job.succeeded")),
                "actor": None,
                "job_id": job,
                "node": rng.choice(NODES),
                "decision_id": None,
                "rule": None,
                "action": None,
                "reason": "moved by the executor",
                "evidence": {},
                "data": {"attempt": 1},
            }
        elif roll < 0.95:
            row = {
                "source": "executor",
                "kind": "command.start",
                "actor": None,
                "job_id": job,
                "node": rng.choice(NODES),
                "decision_id": f"d{i}",
                "rule": None,
                "action": "start",
                "reason": "trainer started",
                "evidence": {},
                "data": {"ok": True},
            }
        else:
            row = {
                "source": "api",
                "kind": "job.submitted",
                "actor": rng.choice(ACTORS),
                "job_id": job,
                "node": None,
                "decision_id": None,
                "rule": None,
                "action": None,
                "reason": "submitted",
                "evidence": {},
                "data": {"gpus": 1},
            }
        row["event_id"] = f"bench:{i}"
        row["ts"] = ts
        digest = row_hash(prev, row)
        yield (
            row["event_id"],
            ts,
            row["source"],
            row["kind"],
            row["actor"],
            row["job_id"],
            row["node"],
            row["decision_id"],
            row["rule"],
            row["action"],
            row["reason"],
            json.dumps(row["evidence"]),
            json.dumps(row["data"]),
            prev,
            digest,
        )
        prev = digest


async def load_audit(database_url: str, count: int, job_ids: list[str], start: datetime) -> None:
    conn = await asyncpg.connect(database_url)
    rng = random.Random(7)
    started = time.perf_counter()
    hashing = 0.0
    # A schema with audit_events.team (migration 026): the sink writes each row's job's team beside it;
    # every row here is of one of the bench team's jobs. An older schema's migration fills it in later.
    with_team = await conn.fetchval(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'audit_events' AND column_name = 'team'"
    )
    try:
        rows = audit_rows(count, job_ids, start, rng)
        while True:
            t0 = time.perf_counter()
            chunk = [r for _, r in zip(range(50_000), rows)]
            hashing += time.perf_counter() - t0
            if not chunk:
                break
            if with_team:
                chunk = [(*r, TEAM if r[5] is not None else None) for r in chunk]
            columns = [*COLUMNS, "team"] if with_team else COLUMNS
            await conn.copy_records_to_table("audit_events", records=chunk, columns=columns)
        await conn.execute("ANALYZE")  # every table: the planner then knows the jobs just submitted too
    finally:
        await conn.close()
    elapsed = time.perf_counter() - started
    print(
        f"bulk load: {count:,} chained audit rows in {elapsed:.1f} s ({count / elapsed:,.0f} rows/s; "
        f"hashing {hashing:.1f} s of it)"
    )


# --- 3. queries ---------------------------------------------------------------------------


def query_shapes(admin: str, user: str, job_ids: list[str], start: datetime, rows: int, seed: int = 11):
    """(name, token, parameters of the next query) per shape; the same seed gives the same queries."""
    rng = random.Random(seed)

    def hour() -> dict:
        at = start + timedelta(seconds=rng.uniform(0, 29 * 24 * 3600))
        return {"since": at.isoformat(), "until": (at + timedelta(hours=1)).isoformat()}

    return [
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


async def query_times(api: Api, shapes, queries: int) -> dict[str, tuple[float, float, float, float]]:
    """name -> (p50 ms, p99 ms, rows per answer, api CPU ms per query) of `queries` GET /v1/audit of each
    shape, one at a time."""
    http = Http(api.urls[0])
    figures = {}
    try:
        for name, token, params in shapes:
            times, returned = [], 0
            cpu = api.cpu_seconds()
            for _ in range(queries):
                started = time.perf_counter()
                status, body = await http.request("GET", f"/v1/audit?{urlencode(params())}", token)
                times.append(time.perf_counter() - started)
                if status != 200:
                    raise SystemExit(f"{name} ({api.label}): {status} {body.decode()[:2000]}")
                returned += len(json.loads(body)["items"])
            figures[name] = (
                percentile(times, 0.5) * 1000,
                percentile(times, 0.99) * 1000,
                returned / queries,
                (api.cpu_seconds() - cpu) / queries * 1000,
            )
    finally:
        await http.close()
    return figures


def print_queries(rows: int, queries: int, apis: list[Api], figures: list[dict]) -> None:
    print(f"audit queries over {rows:,} rows, {queries} each, through GET /v1/audit (limit 100):")
    if len(figures) == 2:
        print(f"  {'':<24} {'before: ' + apis[0].label:<49} after: {apis[1].label}")
    for name in figures[0]:
        cells = "   ".join(
            f"p50 {f[name][0]:6.1f} ms  p99 {f[name][1]:6.1f} ms  CPU {f[name][3]:5.2f} ms" for f in figures
        )
        print(f"  {name:<24} {cells}   ({figures[-1][name][2]:.0f} rows/answer)")


async def bench_verify(api: Api, admin: str) -> None:
    http = Http(api.urls[0])
    try:
        started = time.perf_counter()
        _, body = await http.request("GET", "/v1/audit/verify", admin)
        elapsed = time.perf_counter() - started
    finally:
        await http.close()
    r = json.loads(body)
    state = "intact" if r["ok"] else f"BROKEN at #{r['broken']['id']}"
    print(f"verify: {r['rows_checked']:,} rows {state} in {elapsed:.1f} s ({r['rows_checked'] / elapsed:,.0f} rows/s)")


# --- main ---------------------------------------------------------------------------------


async def prepare(database_url: str, work: Path, past_jobs: int) -> tuple[str, str, Path]:
    conn = await asyncpg.connect(database_url)
    try:
        _, admin = await create_token(conn, "bench-admin", "admin", "platform")
        _, user = await create_token(conn, "bench-user", "user", TEAM)
        # The history a cluster with a million audit rows has: finished jobs of 50 other teams. A user's
        # view looks their names up to hide them.
        await conn.execute(
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, status)"
            " SELECT 'jpast' || lpad(to_hex(g), 11, '0'), 'job-' || g, 'someone', 'team-' || (g % 50), 'low', 1, 1,"
            " true, '{}', 'succeeded' FROM generate_series(1, $1) g",
            past_jobs,
        )
        await conn.execute("ANALYZE jobs")
    finally:
        await conn.close()
    model = work / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # the api checks that a model folder exists; nothing trains
    return admin, user, model


async def apply_migrations(database_url: str) -> list[str]:
    applied = await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        # A migration that rewrote rows (026 fills audit_events.team in) leaves their old versions behind
        # until autovacuum's next pass: that pass, now, so the queries read the table as it will stay.
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=2000, help="submissions per code tree")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--past-jobs", type=int, default=100_000, help="finished jobs of other teams in the jobs table")
    parser.add_argument("--api-processes", type=int, default=1, help="api processes per code tree")
    parser.add_argument("--rounds", type=int, default=2, help="submission rounds per code tree (alternating)")
    parser.add_argument("--baseline", metavar="REV", help="also measure commit REV's api, beside this tree's")
    args = parser.parse_args()
    tag = secrets.token_hex(4)
    db_name, prefix = f"adc_bench_{tag}", f"bench{tag}"
    apis: list[Api] = []
    with tempfile.TemporaryDirectory(prefix="adc-bench-api-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        if args.baseline:
            rev = (
                subprocess.run(
                    ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", args.baseline], capture_output=True, text=True
                ).stdout.strip()
                or args.baseline
            )
            apis.append(
                Api(
                    f"{rev} ({args.baseline})" if rev != args.baseline else rev,
                    export_tree(args.baseline, work / "baseline"),
                )
            )
        apis.append(Api("this tree", REPO_ROOT))
        bus = BusDeployment(prefix, (), CredentialStore(work / "keys"))
        nats_server = LocalNats(work / "nats", work / "nats.log")
        try:
            nats_url = nats_server.start(bus)
            asyncio.run(init_streams(nats_url, bus))
            # The baseline's schema first: its queries run on its own indexes.
            database_url = asyncio.run(
                create_database(db_name, apis[0].tree / "migrations" if args.baseline else MIGRATIONS_DIR)
            )
            admin, user, model = asyncio.run(prepare(database_url, work, args.past_jobs))
            for api in apis:
                api.start(work, database_url, bus, nats_url, args.api_processes)
            others = Others(database_url, nats_server.proc.pid)
            job_ids = asyncio.run(bench_submissions(apis, user, model, args.jobs, args.clients, args.rounds, others))
            start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=30)
            asyncio.run(load_audit(database_url, args.rows, job_ids, start))
            figures = []
            for api in apis:
                if api is apis[-1] and args.baseline:
                    applied = asyncio.run(apply_migrations(database_url))
                    print(
                        f"(this tree's migrations applied after {apis[0].label}'s queries: "
                        f"{', '.join(applied) or 'none'})"
                    )
                shapes = query_shapes(admin, user, job_ids, start, args.rows)
                figures.append(asyncio.run(query_times(api, shapes, args.queries)))
            print_queries(args.rows, args.queries, apis, figures)
            asyncio.run(bench_verify(apis[-1], admin))
        finally:
            for api in apis:
                api.stop()
            nats_server.stop()
            asyncio.run(drop_database(db_name))


if __name__ == "__main__":
    main()
