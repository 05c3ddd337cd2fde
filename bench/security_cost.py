"""What security costs: submissions and decision -> command latency with the bus and database
authorization on, side by side with it off, and training step time in the trainer's network
namespace vs on the host's network, in one run, as paired ratios with confidence intervals.

on:  nats-server with ADC's authorization (an nkey per role, per-role permissions) and TLS (the
     installation's CA, TLS first: cli/local_services.LocalNats's default), the api as
     Postgres role adc_api, the executor as adc_executor signing every command, the worker
     checking each signature (worker/command_gate.py) before it answers.
off: the code as it was before: a nats-server without authorization or TLS, anonymous connections,
     every service as the Postgres superuser, unsigned commands, no check at the worker.
Only those differ: same code otherwise, same machine.
Each arm's node sends a heartbeat every 2 s, as a worker does, and the jobs a repetition started end
after it (the executor's store records them finished), so every repetition meets the same executor:
one node ready, no job piling up in the rows it reads on each start and once a second.

Robust on a shared, noisy host: both arms stay up, and the run is many short repetitions, paired and
interleaved (on, off, off, on, on, off ...: the order alternates so neither arm is always first).
Each pair gives a ratio on/off per figure; the run prints the median of those ratios with a
distribution-free confidence interval (order statistics of the paired ratios, >= 95 % where there
are 6 pairs or more), and for each criterion whether it is met (the whole interval within the
limit), not met (the whole interval beyond it) or undecided (the interval straddles it: more pairs).
A burst of load hits one pair's ratio, not the median. Figures, per repetition and arm:
1. wall time per submission: POST /v1/jobs accepted (a real api process, N concurrent clients);
   CPU per submission: CPU seconds the api process, the arm's nats-server and the Postgres backends
   serving its database used meanwhile (a process's CPU does not count time spent waiting for a
   core, so it is the fairer cost on a loaded host; the clients' own CPU is the same work in both
   arms and left out; read from the scheduler's per-thread counts, to the nanosecond);
   CPU per submission, at once: after each pair both arms take N submissions at the same moment and
   each arm's CPU is read from its own processes over that one window, so a burst of the host's load
   falls on both arms of a pair alike (the lower-variance figure);
2. decision -> command: from a Start decision published on ADC_DECISIONS to the start command
   arriving at the worker's subject (through a real executor: decision recorded, job moved,
   command sent; each decision published as the previous one's command arrives, or `--gap-ms` after it),
   the repetition's median (p95 over all repetitions beside it); CPU per decision:
   the CPU of this process (executor, the decider's publisher and the worker's door) and of the
   arm's nats-server, api and Postgres backends meanwhile, also printed by process (medians and the
   paired differences on - off), which says where the on arm's extra CPU goes;
   criterion for each: on/off <= 1.05;
3. training step time inside the trainer's network namespace vs outside it: real tiny trainers started
   the worker's way (worker/trainer_process.py, bwrap, its uid), one in its own namespace and one with
   the same sandbox on the host's network (as before); as root also a two-node job (one rank per
   "node", gloo), in namespaces on its job's switch vs on the host's loopback. Both arms' trainers run
   throughout, logging every step; once both have taken their first steps the arms take turns: one
   arm's processes run for a slice while the other's are stopped (SIGSTOP), the order alternating
   pair by pair, each rank on the same core in both arms (as root at nice -20, so the host's other
   work preempts a step less often). A step counts for its slice when it lies wholly inside it (its
   wall time from rank 0's step events); each pair of slices gives ns/host of their median step
   times; criterion ns/host <= 1.01. Two like trainers differ by a bias of their own (0.2-0.7 % in the
   --control runs) however many slices they take turns in, so with
   `--train-processes K` the slices are split among K fresh pairs of trainers, one pair after the other,
   and the verdict is on the K pairs' ratios (each the median of its slices'), which samples that bias
   rather than holding one draw of it.
Event loops: as deployed (shared/infra/service.py: uvloop's where installed, for the api and for this process,
which hosts the executor, the decider's publisher and the worker's door; the real worker stays on
asyncio's, and its door here runs on this process's loop); `--loop asyncio` puts both arms on asyncio's.
4. with `--trace N`, after the timed repetitions: N more Start decisions per arm, one at a time, each await of
   the executor on its way (every Postgres statement, BEGIN and COMMIT, JetStream publishes with their ack,
   requests, acks) timed from the decision's publication, printed as the path of a median decision with
   which steps come before the command; also the commits (writes made durable) and the executor's bus
   messages in and out per decision. The timed repetitions run without the instrumentation.
With `--baseline REV` the executor as it was at git revision REV (its services/executor, loaded beside the
current one under another package name; everything else is the current code) runs as two more arms, on and
off, interleaved with the others in every round: each arm pair's figures as above, and the current
executor's against the baseline's as paired ratios, for each of on and off.
Usage: .venv/bin/python bench/security_cost.py [--rounds 20] [--jobs 100] [--clients 8] [--decisions 30]
       [--control] [--no-tls] [--loop service|asyncio] [--train-rounds 400] [--slice-ms 60]
       [--train-processes 1] [--shapes one,two] [--trace 0] [--baseline REV] [--gap-ms 0]   (--train-rounds 0: no training)
(--control runs "off" against "off", and both training arms on the host's network: how far the ratios
wander on the host with nothing changed;
--no-tls runs the on arm without bus TLS, authorization, roles and signatures kept: what TLS adds.)
Needs Postgres at 127.0.0.1:5432 (as the tests do); starts its own two nats-servers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextvars
import importlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import asyncpg  # noqa: E402
import asyncpg.connection  # noqa: E402
import httpx  # noqa: E402
import nats.aio.msg  # noqa: E402
import yaml  # noqa: E402

from bench.paired import cpu_seconds, judged, median_ci, spent  # noqa: E402
from cli.local_services import LocalNats, api_ready, free_port, nats_server_binary, wait_for_port  # noqa: E402
from services.api.auth import create_token  # noqa: E402
from services.executor.executor import Executor  # noqa: E402
from services.executor.store import JobStore  # noqa: E402
from shared.contracts.actions import NodeGpus, Start  # noqa: E402
from shared.contracts.job_status import JobStatus  # noqa: E402
from shared.contracts.messages import AuditEvent, Command, CommandResult, Decision, Device, Heartbeat  # noqa: E402
from shared.infra.bus import Bus, init_streams  # noqa: E402
from shared.infra.bus_auth import BusDeployment, CredentialStore  # noqa: E402
from shared.infra.clock import SystemClock  # noqa: E402
from shared.infra.command_auth import SignatureVerifier  # noqa: E402
from shared.infra.config import (  # noqa: E402
    SandboxConfig,  # noqa: E402
    parse_config,  # noqa: E402
)
from shared.infra.db import connect, create_pool, migrate, service_url  # noqa: E402
from shared.infra.service import run_loop, running_loop_name  # noqa: E402
from worker.command_gate import CommandGate  # noqa: E402
from worker.inventory import cpu_slots  # noqa: E402
from worker.launch_check import code_folders  # noqa: E402
from worker.sandbox import SandboxPlan, bubblewrap, trainer_identity  # noqa: E402
from worker.trainer_network import TrainerNetwork, can_make_namespaces  # noqa: E402
from worker.trainer_process import JobFolder, TrainerProcess  # noqa: E402

PG_ADMIN_URL = os.environ.get("ADC_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
NODE = "bench-n1"
SLOTS = 512  # one device per Start decision of a repetition (its jobs end after it), so no start waits for one
TRAINER_NICENESS = -20  # the measured trainers, as root: the host's other work preempts a step less often
ENDLESS_STEPS = 1_000_000  # a bench trainer runs until the bench kills it
SLICE_STEPS = 3  # a training slice lasts at least this many steps (as timed while both arms ran)
SLICE_CAP = 50  # ...and at most this many times its length while waiting for a whole step in it
HEARTBEAT_S = 2.0  # the worker's default heartbeat_interval: the node stays ready, as a live worker's does
# The off arm's api: the same app, without a bus key and as the database's superuser.
UNSECURED_API = (
    "import services.api.app as app; app.bus_credential = lambda config, role: None;"
    " app.service_url = lambda url, service, passwords=None: url;"
)
API_MAIN = "import sys; from services.api.__main__ import main; sys.argv[0] = 'adc-api'; main()"
ASYNCIO_ONLY = "import shared.infra.service; shared.infra.service._uvloop = lambda: None;"  # --loop asyncio


class UnsignedBus(Bus):
    """The off arm's executor bus: commands go out unsigned, as before."""

    async def request(self, subject, msg, timeout, *, signed=False):
        return await super().request(subject, msg, timeout)


# --- the executor's path, step by step (--trace) -------------------------------------------

_traced_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("traced_job", default=None)


class PathTrace:
    """Each await of the executor on a traced decision's way, as (what, started, ended, durable) in
    perf_counter seconds, per job: Postgres statements (with BEGIN and COMMIT; `durable` where a commit
    makes a write durable: a COMMIT after a write, or a write outside a transaction), JetStream publishes
    (until their ack), requests (until their reply) and the acks and progress reports the executor sends.
    Installed for the trace pass only: the timed repetitions run without it."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[str, float, float, bool]]] = collections.defaultdict(list)
        self._wrote: set[int] = set()  # connections with a write in their open transaction
        self._undo: list[tuple[object, str, object]] = []

    def install(self) -> None:
        trace = self

        def timed(cls, name, label_of):
            original = getattr(cls, name)

            async def wrapper(self, *args, **kwargs):
                job = _traced_job.get()
                if job is None:
                    return await original(self, *args, **kwargs)
                label, durable = label_of(self, *args, **kwargs)
                started = time.perf_counter()
                try:
                    return await original(self, *args, **kwargs)
                finally:
                    trace.steps[job].append((label, started, time.perf_counter(), durable))

            trace._undo.append((cls, name, original))
            setattr(cls, name, wrapper)

        def sql(conn, query, *args, **kwargs):
            words = " ".join(query.split())
            head = words.split()[0].rstrip(";").upper()
            writes = any(w in words.upper() for w in ("INSERT ", "UPDATE ", "DELETE "))
            if head == "BEGIN":
                trace._wrote.discard(id(conn))
                return "BEGIN", False
            if head == "COMMIT":
                return "COMMIT", id(conn) in trace._wrote
            if conn.is_in_transaction():
                if writes:
                    trace._wrote.add(id(conn))
                return f"  {words[:60]}", False
            return f"{words[:60]} (autocommit)", writes

        for name in ("execute", "fetch", "fetchrow", "fetchval"):
            timed(asyncpg.connection.Connection, name, sql)

        def published(bus, subject, msg, msg_id, **kwargs):
            what = f"audit {msg.kind}" if isinstance(msg, AuditEvent) else subject.split(".", 1)[-1]
            return f"JetStream publish {what}, its ack", False

        timed(Bus, "publish_js", published)
        timed(Bus, "request", lambda bus, subject, msg, timeout, **kw: (f"request {msg.kind}, its reply", False))
        timed(nats.aio.msg.Msg, "ack", lambda msg: ("ack of the decision", False))
        timed(nats.aio.msg.Msg, "in_progress", lambda msg: ("in-progress report of the decision", False))

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._undo):
            setattr(cls, name, original)
        self._undo.clear()


def baseline_executor(rev: str, work: Path) -> type[Executor]:
    """The Executor class of services/executor as it was at git revision `rev`, loaded from a copy of that
    folder as package `baseline_executor` (its imports of its own modules rewritten; all else is current)."""
    package = "baseline_executor"
    folder = work / "baseline" / package
    folder.mkdir(parents=True)
    git = ["git", "-C", str(REPO_ROOT)]
    names = subprocess.run(
        [*git, "ls-tree", "--name-only", f"{rev}:services/executor"], check=True, capture_output=True, text=True
    ).stdout.split()
    for name in (n for n in names if n.endswith(".py")):
        text = subprocess.run(
            [*git, "show", f"{rev}:services/executor/{name}"], check=True, capture_output=True, text=True
        ).stdout
        (folder / name).write_text(
            text.replace("from services.executor import", f"from {package} import").replace(
                "services.executor.", f"{package}."
            )
        )
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module(f"{package}.executor").Executor


def compare_with_baseline(current: list[Arm], baseline: list[Arm], rev: str) -> None:
    """The current executor's figures against the baseline's, as ratios of the same round's repetitions."""
    print(f"  current executor / the executor at {rev}, median of {len(current[0].reps)} paired ratios [CI]:")
    figures = {
        "decision -> command p50": lambda r: statistics.median(r.latencies),
        "CPU per decision": lambda r: r.decide_cpu_s,
    }
    for name, figure in figures.items():
        for now, then in zip(current, baseline, strict=True):
            median, low, high, coverage = median_ci([figure(a) / figure(b) for a, b in zip(now.reps, then.reps)])
            print(
                f"    {name:<24} {now.name:<4} {statistics.median(figure(r) for r in now.reps) * 1000:6.2f} ms"
                f" against {statistics.median(figure(r) for r in then.reps) * 1000:6.2f} ms:"
                f" {median:6.3f} [{low:.3f}, {high:.3f}] ({coverage:.1%} CI)"
            )


def traced_executor(arm: Arm, received: dict[str, float]):
    """The executor with each decision's task marked as the trace's (the mark is inherited by what it spawns)."""

    class TracedExecutor(arm.executor_class):
        async def _on_heartbeat(self, msg) -> None:
            arm.heard += 1
            await super()._on_heartbeat(msg)

        async def _on_decision(self, msg) -> None:
            job = Decision.decode(msg.data).action.job_id
            received[job] = time.perf_counter()
            token = _traced_job.set(job)
            try:
                await super()._on_decision(msg)
            finally:
                _traced_job.reset(token)

    return TracedExecutor


@dataclass
class Repetition:
    """One arm's figures of one repetition."""

    submit_s: float  # wall seconds per submission
    submit_cpu_s: float  # api + nats-server + Postgres CPU seconds per submission
    latencies: list[float]  # decision -> command, seconds
    decide_cpu_s: float  # this process + nats-server + api + Postgres CPU seconds per decision
    decide_cpu_by: dict[str, float]  # the same, by process: "bench", "nats", "api", "postgres"
    together_cpu_s: float = 0.0  # CPU seconds per submission while both arms submit at once


class Arm:
    def __init__(
        self,
        name: str,
        secure: bool,
        work: Path,
        *,
        tls: bool = True,
        asyncio_only: bool = False,
        executor: type[Executor] = Executor,
    ) -> None:
        self.name, self.secure, self.work = name, secure, work / name
        self.executor_class = executor
        self.tls, self.asyncio_only = tls, asyncio_only
        self.work.mkdir(parents=True)
        self.prefix = f"b{secrets.token_hex(3)}"
        self.db_name = f"adc_bench_{self.prefix}"
        self.keys = CredentialStore(self.work / "keys")
        self.reps: list[Repetition] = []
        self.next_slot = 0
        self.trace: PathTrace | None = None
        self.received: dict[str, float] = {}  # job -> when its decision reached the executor (traced)
        self.heard = 0  # heartbeats the traced executor received
        self.gap_s = 0.0  # the pause before each decision (--gap-ms)

    # --- setup ---------------------------------------------------------------------

    async def start(self, model_dir: Path) -> None:
        admin = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await admin.execute(f'CREATE DATABASE "{self.db_name}"')
        finally:
            await admin.close()
        self.db_url = PG_ADMIN_URL.rpartition("/")[0] + f"/{self.db_name}"
        await migrate(self.db_url)
        self.admin = await asyncpg.connect(PG_ADMIN_URL)  # finds the database's backends for their CPU
        if self.secure:
            self.nats = LocalNats(self.work / "nats", self.work / "nats.log", tls=self.tls)
            self.url = self.nats.start(BusDeployment(self.prefix, (NODE,), self.keys))
        else:
            port = free_port()
            self.nats = subprocess.Popen(
                [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(self.work / "nats")],
                stdout=open(self.work / "nats.log", "wb"),
                stderr=subprocess.STDOUT,
            )
            wait_for_port("127.0.0.1", port, 20, "nats-server", self.nats)
            self.url = f"nats://127.0.0.1:{port}"
            self.keys.ensure(["admin"])  # only to create the streams the same way
        await init_streams(
            self.url, BusDeployment(self.prefix, (), self.keys)
        ) if self.secure else await self._plain_streams()
        conn = await connect(self.db_url)
        try:
            _, self.token = await create_token(conn, "bench", "admin", "default")
        finally:
            await conn.close()
        self.api_proc, self.api_url = self._start_api()
        self.spec = {
            "gpus": 1,
            "train": {
                "model_name_or_path": str(model_dir),
                "stage": "sft",
                "finetuning_type": "lora",
                "dataset": "alpaca_en_demo",
                "dataset_dir": str(REPO_ROOT / "examples" / "data"),
                "max_steps": 10,
            },
        }
        await self._start_control_plane()

    async def _plain_streams(self) -> None:
        bus = await Bus.connect(self.url, self.prefix, "bench-admin")
        try:
            await bus.ensure_streams()
        finally:
            await bus.close()

    def _start_api(self) -> tuple[subprocess.Popen, str]:
        port = free_port()
        config = {
            "bus": {
                "url": self.url,
                "prefix": self.prefix,
                **({"credentials_dir": str(self.keys.directory)} if self.secure else {}),
            },
            "database": {"url": self.db_url, "pool_max": 20},
            "storage": {"root": str(self.work / "data"), "data_root": str(REPO_ROOT)},
            "api": {"host": "127.0.0.1", "port": port},
            # the bench's model (in its work folder's parent) and the examples' data, as adc up declares them
            "tenancy": {"shared_roots": [str(self.work.parent), str(REPO_ROOT / "examples")]},
        }
        (self.work / "adc_config.yaml").write_text(yaml.safe_dump(config))
        code = (ASYNCIO_ONLY if self.asyncio_only else "") + ("" if self.secure else UNSECURED_API) + API_MAIN
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "DATABASE_", "ADC_"))}
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--config", str(self.work / "adc_config.yaml")],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=open(self.work / "api.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        if api_ready(url, proc, 60):
            return proc, url
        raise SystemExit(f"{self.name}: the api did not start; see {self.work / 'api.log'}")

    async def _bus(self, role: str, cls=Bus) -> Bus:
        return await cls.connect(
            self.url, self.prefix, f"bench-{role}", self.keys.credential(role) if self.secure else None
        )

    async def _start_control_plane(self) -> None:
        # One executor per arm and no election: a loaded host that starves the bench's event loop would
        # otherwise take its 2 s lease away in the middle of a repetition.
        self.config = parse_config(
            {
                "bus": {"url": self.url, "prefix": self.prefix},
                "database": {"url": self.db_url},
                "leases": {"enabled": False},
            },
            env={},
        )
        self.executor_bus = await self._bus("executor", Bus if self.secure else UnsignedBus)
        self.pool = await create_pool(service_url(self.db_url, "executor") if self.secure else self.db_url)
        self.stop = asyncio.Event()
        executor_class = traced_executor(self, self.received) if self.trace is not None else self.executor_class
        self.executor_task = asyncio.create_task(
            executor_class(self.executor_bus, self.pool, self.config).run(self.stop)
        )
        self.decider = await self._bus("decider")
        self.worker = await self._bus(f"worker-{NODE}")
        gate = CommandGate(self.worker, NODE, SignatureVerifier.from_store(self.keys)) if self.secure else None
        self.arrivals: dict[str, asyncio.Future] = {}
        self.arrived: dict[str, float] = {}  # job -> when its start command reached the worker
        self.sent: dict[str, float] = {}  # job -> when its decision was published

        async def on_command(msg) -> None:  # the worker's door, then an immediate ok
            arrived = time.perf_counter()
            if gate is not None and not await gate.admit(msg):
                raise SystemExit(f"{self.name}: the worker refused the executor's command")
            cmd = Command.decode(msg.data)
            waiter = self.arrivals.get(cmd.job_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(arrived)
                self.arrived[cmd.job_id] = arrived
            await msg.respond(CommandResult(command_id=cmd.command_id, ok=True, pid=1, job_dir="/x").encode())

        self.sub = await self.worker.nc.subscribe(self.worker.subjects.command(NODE), cb=on_command)
        self.beating = asyncio.create_task(self._heartbeats(time.time()))
        for _ in range(200):
            if await self.pool.fetchval("SELECT 1 FROM nodes WHERE id = $1", NODE):
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"{self.name}: the executor never registered the node")

    async def _heartbeats(self, started_at: float) -> None:
        """The node's heartbeat, as a worker sends it, for as long as the arm is up: a node silent for the
        executor's node timeout would be found lost in the middle of a repetition and its jobs requeued."""
        devices = [Device(index=i, kind="cpu") for i in range(SLOTS)]
        while True:
            beat = Heartbeat(node=NODE, ts=time.time(), started_at=started_at, devices=devices)
            await self.worker.nc.publish(self.worker.subjects.heartbeat(NODE), beat.encode())
            await asyncio.sleep(HEARTBEAT_S)

    async def _end_jobs(self, job_ids: list[str]) -> None:
        """The repetition's started jobs end (as if their trainers had finished, through the executor's store)
        and free their devices, so the jobs the executor reads on every start (the devices booked) and once
        a second (those that should have a trainer) do not pile up through the run: each repetition starts
        from the same few. A job is ended once the executor has recorded its launch."""
        store, left = JobStore(self.pool, SystemClock()), set(job_ids)
        for _ in range(400):
            for job_id in sorted(left):
                job = await store.get(job_id)
                if job is not None and job.status == JobStatus.STARTING:
                    await store.apply(job, "finish", reason="bench: repetition over", finished_at=store.clock.now())
                    left.discard(job_id)
            if not left:
                self.next_slot = 0
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"{self.name}: the executor did not record the launch of {sorted(left)}")

    # --- measurements --------------------------------------------------------------

    async def _servers(self) -> dict[int, float]:
        """CPU seconds so far of the arm's api, its nats-server and the Postgres backends serving its
        database (the roles and their row checks cost there), by process."""
        backends = await self.admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.db_name)
        return cpu_seconds([self.api_proc.pid, self._nats_pid(), *(r["pid"] for r in backends)])

    def _nats_pid(self) -> int:
        return (self.nats.proc if isinstance(self.nats, LocalNats) else self.nats).pid

    def _by_process(self, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
        """CPU seconds between two readings of _servers (and this process), by what each process is."""
        names = {os.getpid(): "bench", self._nats_pid(): "nats", self.api_proc.pid: "api"}
        out = dict.fromkeys(("bench", "nats", "api", "postgres"), 0.0)
        for pid, cpu in after.items():
            out[names.get(pid, "postgres")] += cpu - before.get(pid, 0.0)
        return out

    async def repetition(self, jobs: int, clients: int, decisions: int) -> Repetition:
        before = await self._servers()
        wall = await self.submit(jobs, clients)
        submit_cpu = spent(before, await self._servers())
        job_ids = await self._jobs(decisions)
        before = await self._servers() | cpu_seconds([os.getpid()])
        latencies = await self.decide(job_ids)
        by = self._by_process(before, await self._servers() | cpu_seconds([os.getpid()]))
        await self._end_jobs(job_ids)
        return Repetition(
            wall / jobs,
            submit_cpu / jobs,
            latencies,
            sum(by.values()) / decisions,
            {k: v / decisions for k, v in by.items()},
        )

    async def trace_path(self, count: int) -> tuple[int, int]:
        """`count` traced Start decisions (PathTrace), each carried out to its end; the executor's bus
        messages out and in over them (its nats client's counts, the node's heartbeats taken out)."""
        job_ids = await self._jobs(count)
        before, heard = dict(self.executor_bus.nc.stats), self.heard
        self.trace.install()
        try:
            await self.decide(job_ids)
            for _ in range(400):  # until the executor has finished every decision (the ledger's last write)
                left = await self.pool.fetchval(
                    "SELECT count(*) FROM decisions WHERE job_id = ANY($1::text[]) AND state = 'received'", job_ids
                )
                if not left:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the decisions' acks
        finally:
            self.trace.uninstall()
        after = self.executor_bus.nc.stats
        await self._end_jobs(job_ids)
        return after["out_msgs"] - before["out_msgs"], after["in_msgs"] - before["in_msgs"] - (self.heard - heard)

    async def submit(self, jobs: int, clients: int) -> float:
        """Wall seconds for `jobs` submissions by `clients` concurrent clients."""
        counter = iter(range(jobs))

        async def client(http: httpx.AsyncClient) -> None:
            for i in counter:
                r = await http.post("/v1/jobs", json=self.spec | {"name": f"bench-{i}"})
                if r.status_code != 201:
                    raise SystemExit(f"{self.name}: submission refused: {r.status_code} {r.text}")

        headers = {"Authorization": f"Bearer {self.token}"}
        https = [httpx.AsyncClient(base_url=self.api_url, timeout=30, headers=headers) for _ in range(clients)]
        try:
            for http in https:  # connected before the clock starts
                (await http.get("/healthz")).raise_for_status()
            started = time.perf_counter()
            await asyncio.gather(*(client(http) for http in https))
            return time.perf_counter() - started
        finally:
            for http in https:
                await http.aclose()

    async def _jobs(self, count: int) -> list[str]:
        """`count` pending job rows for Start decisions, written before the decisions are timed."""
        job_ids = [f"lat-{uuid.uuid4().hex[:10]}" for _ in range(count)]
        conn = await connect(self.db_url)
        try:
            await conn.executemany(
                "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec)"
                " VALUES ($1, $1, 'bench', 'default', 'low', 1, 1, true, $2)",
                [(job_id, {"name": job_id, "gpus": 1, "train": {"stage": "sft"}}) for job_id in job_ids],
            )
        finally:
            await conn.close()
        return job_ids

    async def decide(self, job_ids: list[str]) -> list[float]:
        """One Start decision at a time; from its publication to its command at the worker."""
        out = []
        for job_id in job_ids:
            if self.gap_s:  # the executor done with the previous decision's work after its command
                await asyncio.sleep(self.gap_s)
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            if slot >= SLOTS:
                raise SystemExit(f"at most {SLOTS} decisions per repetition")
            d = Decision(
                decision_id=uuid.uuid4().hex,
                ts=time.time(),
                rule="bench",
                snapshot_ts=time.time(),
                action=Start(job_id=job_id, reason="bench", placement=[NodeGpus(node=NODE, gpus=[slot])]),
            )
            arrived = self.arrivals[job_id] = asyncio.get_running_loop().create_future()
            sent = self.sent[job_id] = time.perf_counter()
            await self.decider.publish_js(self.decider.subjects.decisions, d, d.decision_id)
            try:
                out.append(await asyncio.wait_for(arrived, 60) - sent)
            except TimeoutError:
                raise SystemExit(f"{self.name}: no command for {job_id} within 60 s") from None
        return out

    async def close(self) -> None:
        self.beating.cancel()
        self.stop.set()
        await asyncio.wait_for(self.executor_task, 20)
        await self.sub.unsubscribe()
        for bus in (self.worker, self.decider, self.executor_bus):
            await bus.close()
        await self.pool.close()
        self.api_proc.terminate()
        self.api_proc.wait(timeout=20)
        if isinstance(self.nats, LocalNats):
            self.nats.stop()
        else:
            self.nats.terminate()
            self.nats.wait(timeout=10)
        try:
            await self.admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        finally:
            await self.admin.close()


class HostNetworkSandbox(SandboxPlan):
    """The same sandbox without a network namespace of its own: the trainer on the host's network, as before."""

    def wrap(self, argv, job_dir, *, own_network=True):
        return super().wrap(argv, job_dir, own_network=False)


@dataclass
class TrainerArm:
    """One arm's trainers (one per rank) running without end, and the progress events of its rank 0."""

    name: str
    trainers: list
    events: list[dict]
    follow: asyncio.Future

    def signal(self, sig: int) -> None:
        """To every trainer's process group: bwrap and everything in its sandbox."""
        for trainer in self.trainers:
            try:
                os.killpg(trainer.pid, sig)
            except ProcessLookupError:
                pass

    def settle(self, niceness: int | None) -> None:
        """Each rank's threads (every process in its trainer's process group) on a core of its own, the same
        core for the same rank in both arms, so that the two arms' steps meet the same core and what else
        runs on it; as root also at `niceness`, so that the host's other work takes the core less often."""
        cores = sorted(os.sched_getaffinity(0))
        groups = {trainer.pid: cores[-1 - rank % len(cores)] for rank, trainer in enumerate(self.trainers)}
        for proc in Path("/proc").iterdir():
            try:
                if not proc.name.isdigit() or (core := groups.get(os.getpgid(int(proc.name)))) is None:
                    continue
                for task in (proc / "task").iterdir():
                    os.sched_setaffinity(int(task.name), {core})
                    if niceness is not None:
                        os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
            except (ProcessLookupError, FileNotFoundError, PermissionError):
                pass

    def steps(self, since: int = 0) -> list[tuple[float, float]]:
        """(start, end) of each step rank 0 logged (from its `since`-th event on), on this host's clock: a
        step ends at its event."""
        return [
            (e["ts"] - e["step_time_s"], e["ts"])
            for e in self.events[since:]
            if e.get("event") == "progress" and e.get("step_time_s") and e.get("ts")
        ]


async def start_trainers(work: Path, model_dir: Path, name: str, *, isolated: bool, nodes: int) -> TrainerArm:
    """`nodes` one-rank trainers of a new tiny job, started the worker's way, logging every step and
    running until stopped (no step count ends them, no checkpoint is written)."""
    storage = work / "storage"
    job = f"bench-{uuid.uuid4().hex[:8]}"  # a new job each run: nothing resumes from an earlier one
    train = {
        "model_name_or_path": str(model_dir),
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(REPO_ROOT / "examples" / "data"),
        "cutoff_len": 64,
        "template": "default",
        "per_device_train_batch_size": 1,
        "max_steps": ENDLESS_STEPS,
        "save_steps": ENDLESS_STEPS * 10,
        "logging_steps": 1,
        "report_to": "none",
        "seed": 7,
    }
    plan = (SandboxPlan if isolated else HostNetworkSandbox)(
        identity=trainer_identity(SandboxConfig(), "bench", job),
        bwrap=bubblewrap(),
        readable=(model_dir, REPO_ROOT / "examples" / "data", *code_folders()),
        hidden=(storage,),
    )
    events: list[dict] = []

    async def keep(job_id, attempt, seq, event) -> None:
        events.append(event)

    async def ignore(job_id, attempt, seq, event) -> None:
        pass

    trainers, port = [], free_port()
    for rank in range(nodes):
        trainer = TrainerProcess(job, 1, [0], JobFolder(storage / "jobs" / job), threads_per_rank=1)
        if nodes > 1:
            trainer.node_rank, trainer.rank_offset, trainer.world_size, trainer.master_port = rank, rank, nodes, port
            trainer.rank_nodes = [f"bench-{r}" for r in range(nodes)]
            trainer.network = TrainerNetwork(f"bench-{rank}", job, 1, rank) if isolated else None
        await trainer.launch(train, cpu_slots(1), None, {}, plan)
        trainers.append(trainer)
    follow = asyncio.gather(*(t.follow(keep if t.node_rank == 0 else ignore) for t in trainers))
    return TrainerArm(name, trainers, events, follow)


async def interleaved_step_times(
    work: Path, model_dir: Path, pairs: int, slice_s: float, nodes: int, control: bool = False
) -> tuple[list[float], list[float], list[float], int, float]:
    """Both arms' trainers run at once until each has taken its first steps; from then on only one arm
    runs at a time (the other's processes stopped, SIGSTOP), in slices of `slice_s`, the order within a
    pair alternating; a slice lasts `slice_s` or SLICE_STEPS of the steps taken while both ran, whichever is
    longer, and longer still (up to SLICE_CAP times) until one whole step in it has been logged. A step
    counts for its slice when it began after the slice began and ended before it ended (a step a stop cut
    into is left out). Returns, per pair with steps in both slices, the median step time
    in the namespace, on the host's network and their ratio; the steps counted; the slice's length.
    `control`: the "ns" arm on the host's network too, so the ratio shows two like trainers' difference."""
    arms = [
        await start_trainers(work, model_dir, "ns", isolated=not control, nodes=nodes),
        await start_trainers(work, model_dir, "host", isolated=False, nodes=nodes),
    ]
    slices: list[tuple[int, str, float, float]] = []
    try:
        deadline = time.monotonic() + 600
        while any(len(arm.steps()) < 3 for arm in arms):  # both past their start (imports, model, data)
            if any(arm.follow.done() for arm in arms) or time.monotonic() > deadline:
                raise RuntimeError(f"a bench trainer ended or never stepped; see {work / 'storage' / 'jobs'}")
            await asyncio.sleep(0.2)
        for arm in arms:
            arm.signal(signal.SIGSTOP)
            arm.settle(TRAINER_NICENESS if os.geteuid() == 0 else None)
        # A slice holds several whole steps however long a step takes (two ranks meet once a step).
        first = max(statistics.median(end - start for start, end in arm.steps()) for arm in arms)
        slice_s = max(slice_s, SLICE_STEPS * first)
        for i in range(pairs):
            for arm in arms if i % 2 == 0 else arms[::-1]:
                seen = len(arm.events)  # the wait below reads only this slice's events
                arm.signal(signal.SIGCONT)
                began = time.time()
                await asyncio.sleep(slice_s)
                # On a loaded host a resumed trainer may take the whole slice to get the core back:
                # the slice goes on until it holds a whole step (its event read back), within a cap.
                cap = time.monotonic() + SLICE_CAP * slice_s
                while not any(start >= began for start, _ in arm.steps(seen)) and time.monotonic() < cap:
                    await asyncio.sleep(0.005)
                ended = time.time()
                arm.signal(signal.SIGSTOP)
                slices.append((i, arm.name, began, ended))
    finally:
        for arm in arms:
            arm.signal(signal.SIGKILL)  # a stopped process is killed as it is
        await asyncio.gather(*(arm.follow for arm in arms), return_exceptions=True)
    inside, outside, counted = [], [], 0
    per_slice: dict[tuple[int, str], list[float]] = {}
    steps = {arm.name: arm.steps() for arm in arms}
    for i, name, began, ended in slices:
        times = [end - start for start, end in steps[name] if start >= began and end <= ended]
        per_slice[(i, name)] = times
        counted += len(times)
    for i in range(pairs):
        ns, host = per_slice.get((i, "ns")), per_slice.get((i, "host"))
        if ns and host:
            inside.append(statistics.median(ns))
            outside.append(statistics.median(host))
    return inside, outside, [a / b for a, b in zip(inside, outside, strict=True)], counted, slice_s


async def training_cost(
    work: Path,
    model_dir: Path,
    slice_s: float,
    pairs: int,
    shapes: list[str],
    control: bool = False,
    processes: int = 1,
) -> None:
    known = {"one": ("one node, 1 rank", 1), "two": ("two nodes, 1 rank each (gloo)", 2)}
    if "two" in shapes and not can_make_namespaces():
        print("  (two nodes: left out, this process cannot make network namespaces)")
        shapes = [s for s in shapes if s != "two"]
    print(
        ("CONTROL (both arms on the host's network): " if control else "")
        + f"training step time: tiny Llama, one trainer per arm (one per rank) running throughout, the arms taking"
        f" turns in {pairs} pair(s) of slices of at least {slice_s * 1000:.0f} ms (the other arm stopped, SIGSTOP;"
        " the same core per rank for both arms"
        + (f", nice {TRAINER_NICENESS}" if os.geteuid() == 0 else "")
        + "); per slice the median wall time of the steps wholly inside it, from rank 0's step events"
        + ("" if bubblewrap() else " (NO bwrap here: both arms share the host's network)")
        + (
            f"; the slices split among {processes} fresh pairs of trainers, one pair after the other"
            if processes > 1
            else ""
        )
    )
    for label, nodes in (known[s] for s in shapes):
        inside, outside, ratios, per_process, counted, took_s = [], [], [], [], 0, 0.0
        for k in range(processes):
            share = pairs // processes + (1 if k < pairs % processes else 0)
            got_in, got_out, got, got_counted, got_s = await interleaved_step_times(
                work, model_dir, share, slice_s, nodes, control
            )
            inside.extend(got_in)
            outside.extend(got_out)
            ratios.extend(got)
            counted += got_counted
            took_s = max(took_s, got_s)  # each pair sizes its slices by its own first steps
            if got:
                per_process.append(statistics.median(got))
        if not ratios:
            print(f"  {label:<31} no slice held a whole step: longer slices (--slice-ms)")
            continue
        if control:
            first, second, ratio = "one arm", "the other", "ratio one/other"
        else:
            first, second, ratio = "in its namespace", "on the host's network", "ratio ns/host"
        print(
            f"  {label:<31} {first} {statistics.median(inside) * 1000:8.2f} ms/step   {second} "
            f"{statistics.median(outside) * 1000:8.2f} ms/step   {ratio} {judged(ratios, 1.01)}"
        )
        print(
            f"  {'':<31} ({len(ratios)} pairs with steps in both slices, slices of {took_s * 1000:.0f} ms,"
            f" {counted} steps counted)"
        )
        if processes > 1:
            print(f"  {'':<31} over the {len(per_process)} pairs of trainers: {judged(per_process, 1.01)}")


async def submit_together(arms: list[Arm], jobs: int, clients: int) -> None:
    """Both arms take `jobs` submissions at the same moment, each from its own `clients`: each arm's CPU
    per submission (its own api, nats-server and Postgres backends, told apart by process) is then read
    over one window, so a burst of the host's load falls on both alike rather than on one of a pair."""
    before = [await arm._servers() for arm in arms]
    await asyncio.gather(*(arm.submit(jobs, clients) for arm in arms))
    for arm, was in zip(arms, before, strict=True):
        arm.reps[-1].together_cpu_s = spent(was, await arm._servers()) / jobs


def control_plane_cost(arms: list[Arm], rounds: int, jobs: int, clients: int, decisions: int, control: bool) -> None:
    print(
        ("CONTROL (both arms off): " if control else "")
        + f"{rounds} pairs of repetitions, arms interleaved; {jobs} submissions ({clients} clients) and "
        f"{decisions} decisions per repetition and arm; medians over repetitions"
    )
    for arm in arms:
        latencies = [x for rep in arm.reps for x in rep.latencies]
        print(
            f"  auth {arm.name:<5}  submissions {1 / statistics.median(r.submit_s for r in arm.reps):7.1f} jobs/s"
            f"  CPU {statistics.median(r.submit_cpu_s for r in arm.reps) * 1000:6.2f} ms each   "
            f"decision -> command p50 {statistics.median(latencies) * 1000:6.2f} ms"
            f"  p95 {statistics.quantiles(latencies, n=20)[-1] * 1000:6.2f} ms"
            f"  CPU {statistics.median(r.decide_cpu_s for r in arm.reps) * 1000:6.2f} ms each"
        )
    on, off = arms
    pairs = list(zip(on.reps, off.reps, strict=True))
    print("  CPU per decision by process, medians (ms), and the median of the paired differences on - off [CI]:")
    for part in ("bench", "nats", "postgres", "api"):
        diff = median_ci([a.decide_cpu_by[part] - b.decide_cpu_by[part] for a, b in pairs])
        print(
            f"    {part:<9} {on.name} {statistics.median(r.decide_cpu_by[part] for r in on.reps) * 1000:6.3f}"
            f"  {off.name} {statistics.median(r.decide_cpu_by[part] for r in off.reps) * 1000:6.3f}"
            f"  difference {diff[0] * 1000:+6.3f} [{diff[1] * 1000:+.3f}, {diff[2] * 1000:+.3f}]"
        )
    print(
        "  CPU per submission with both arms submitting at once: "
        f"{on.name} {statistics.median(r.together_cpu_s for r in on.reps) * 1000:6.2f} ms, "
        f"{off.name} {statistics.median(r.together_cpu_s for r in off.reps) * 1000:6.2f} ms"
    )
    figures = {
        "wall time per submission": lambda r: r.submit_s,
        "CPU per submission": lambda r: r.submit_cpu_s,
        "CPU per submission, at once": lambda r: r.together_cpu_s,
        "decision -> command p50": lambda r: statistics.median(r.latencies),
        "CPU per decision": lambda r: r.decide_cpu_s,
    }
    print(f"  {on.name}/{off.name}, median of {len(pairs)} paired ratios [confidence interval]:")
    for name, figure in figures.items():
        print(f"    {name:<27} {judged([figure(a) / figure(b) for a, b in pairs], 1.05)}")


def print_path(arm: Arm, job_ids: list[str], messages: tuple[int, int]) -> None:
    """The traced awaits of the arm's decisions as one path: the most common sequence of steps, each with
    the median of its start (from the decision's publication) and of its duration, and whether it ends
    before the command reaches the worker ("path"; "sends": the start request, which carries the command)."""
    runs = {job: arm.trace.steps[job] for job in job_ids if job in arm.arrived and job in arm.received}
    shapes = collections.Counter(tuple(label for label, *_ in steps) for steps in runs.values())
    shape, seen = shapes.most_common(1)[0]
    same = [job for job, steps in runs.items() if tuple(label for label, *_ in steps) == shape]
    print(
        f"  auth {arm.name}: the executor's path of a Start decision, medians over {len(same)} of {len(runs)}"
        " decisions (those with the most common sequence); ms from the decision's publication"
    )
    print(f"    {'':>3} {'start':>7} {'took':>6}  {'':<6} what")
    delivered = statistics.median(arm.received[j] - arm.sent[j] for j in same) * 1000
    command = statistics.median(arm.arrived[j] - arm.sent[j] for j in same) * 1000
    print(f"    {'':>3} {delivered:7.2f} {'':>6}  {'':<6} decision delivered to the executor")
    rows, before_cmd, durable_before, durable_all = [], 0, 0, 0
    for i, label in enumerate(shape):
        start = statistics.median(runs[j][i][1] - arm.sent[j] for j in same) * 1000
        took = statistics.median(runs[j][i][2] - runs[j][i][1] for j in same) * 1000
        first = label.startswith("request start") or sum(runs[j][i][2] <= arm.arrived[j] for j in same) * 2 > len(same)
        durable = runs[same[0]][i][3]
        rows.append((start, took, first, durable, label))
        before_cmd += first
        durable_before += first and durable
        durable_all += durable
    last_on_path = max((n for n, row in enumerate(rows) if row[2]), default=-1)
    for n, (start, took, first, durable, label) in enumerate(rows):
        mark = ("sends" if label.startswith("request start") else "path" if first else "after") + (
            "*" if durable else ""
        )
        print(f"    {n + 1:>3} {start:7.2f} {took:6.2f}  {mark:<6} {label}")
        if n == last_on_path:
            print(f"    {'':>3} {command:7.2f} {'':>6}  {'':<6} start command at the worker")
    out, into = messages
    count = len(job_ids)
    print(
        f"    awaits before the command {before_cmd}, after it {len(rows) - before_cmd}; commits (* above) before"
        f" the command {durable_before}, in all {durable_all}; executor's bus messages per decision"
        f" {out / count:.2f} out, {into / count:.2f} in (its client's counts, heartbeats taken out)"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="pairs of repetitions (one per arm each)")
    parser.add_argument("--jobs", type=int, default=100, help="submissions per repetition and arm")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=30, help="Start decisions per repetition and arm")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) afterwards")
    parser.add_argument(
        "--train-rounds", type=int, default=400, help="pairs of training slices per shape, one per arm (0: none)"
    )
    parser.add_argument(
        "--slice-ms", type=int, default=60, help="the least a training slice runs one arm (longer for long steps)"
    )
    parser.add_argument(
        "--train-processes",
        type=int,
        default=1,
        help="fresh pairs of trainers the slices are split among, one pair after the other (6 or more for a verdict"
        " over pairs)",
    )
    parser.add_argument(
        "--shapes", default="one,two", help="training shapes: one (one node), two (two nodes, root only), or both"
    )
    parser.add_argument(
        "--trace", type=int, default=0, help="after the timed repetitions, this many traced decisions per arm"
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="a pause before each decision (default none: each follows the previous one's command at once)",
    )
    parser.add_argument(
        "--baseline", metavar="REV", help="also run the executor of this git revision beside the current one"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="both arms with authorization off, both training arms on the host's network: the ratios show the host's noise",
    )
    parser.add_argument(
        "--no-tls", action="store_true", help="the on arm without bus TLS (authorization, roles, signatures kept)"
    )
    parser.add_argument(
        "--loop",
        choices=("service", "asyncio"),
        default="service",
        help="event loops: as the services run (shared/infra/service.py), or asyncio's for the api and this process",
    )
    args = parser.parse_args()
    args.shapes = args.shapes.split(",")
    if args.rounds < 1 or args.jobs < 1 or args.decisions < 2 or not set(args.shapes) <= {"one", "two"}:
        parser.error("--rounds and --jobs at least 1, --decisions at least 2, --shapes of one,two")
    if not 1 <= args.train_processes <= max(1, args.train_rounds):
        parser.error("--train-processes from 1 to --train-rounds (each pair of trainers takes one slice pair at least)")
    return args


async def main(args: argparse.Namespace) -> None:
    shapes = args.shapes
    work = Path(tempfile.mkdtemp(prefix="adc-security-cost-"))
    os.chmod(work, 0o755)  # the tiny model in it is read by the trainer's unprivileged uid, as the api checks
    from worker.trainer.tiny_model import build_tiny_llama

    model_dir = build_tiny_llama(work / "tiny-llama")
    loops = {"asyncio_only": args.loop == "asyncio"}
    arms = (
        [Arm("off-a", False, work, **loops), Arm("off-b", False, work, **loops)]
        if args.control
        else [Arm("on", True, work, tls=not args.no_tls, **loops), Arm("off", False, work, **loops)]
    )
    pairs = [arms]
    if args.baseline:
        old = baseline_executor(args.baseline, work)
        pairs.append(
            [Arm(f"{arm.name}@{args.baseline}", arm.secure, work, tls=arm.tls, executor=old, **loops) for arm in arms]
        )
        arms = [*arms, *pairs[1]]
    print(f"event loop here: {running_loop_name()}; on arm: {'no TLS' if args.no_tls else 'TLS'}")
    try:
        for arm in arms:
            arm.gap_s = args.gap_ms / 1000
            if args.trace:
                arm.trace = PathTrace()
            await arm.start(model_dir)
        for arm in arms:  # warm up: connections, prepared statements, caches
            await arm.repetition(40, args.clients, 10)
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else arms[::-1]
            for arm in order:
                arm.reps.append(await arm.repetition(args.jobs, args.clients, args.decisions))
            for pair in pairs:
                await submit_together(pair if r % 2 == 0 else pair[::-1], args.jobs, args.clients)
        for pair in pairs:
            control_plane_cost(pair, args.rounds, args.jobs, args.clients, args.decisions, args.control)
        if args.baseline:
            compare_with_baseline(*pairs, args.baseline)
        if args.trace:
            for arm in arms:
                steps_before = set(arm.trace.steps)
                messages = await arm.trace_path(args.trace)
                print_path(arm, [j for j in arm.trace.steps if j not in steps_before], messages)
        if args.train_rounds > 0:
            for arm in arms:  # the control plane idles meanwhile: only the trainers share the cores
                await arm.close()
            arms = []
            await training_cost(
                work, model_dir, args.slice_ms / 1000, args.train_rounds, shapes, args.control, args.train_processes
            )
    finally:
        for arm in arms:
            try:
                await arm.close()
            except Exception as err:  # an arm that never started
                print(f"  ({arm.name}: cleanup: {type(err).__name__}: {err})", file=sys.stderr)
        if args.keep:
            print(f"  logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.loop == "asyncio":
        asyncio.run(main(arguments))
    else:  # the executor's, which this process hosts
        run_loop("executor", main(arguments))
