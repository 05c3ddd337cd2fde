"""The whole ADC stack as local processes: what `adc up` runs, and what end-to-end tests drive.

NATS and Postgres are used when given (NATS_URL with the role keys that server knows,
ADC_BUS_CREDENTIALS_DIR; DATABASE_URL) and started otherwise: a NATS started here gets a key per
role in <home>/secrets/nats and runs with ADC's authorization (shared/infra/bus_auth.py). Then the
database is migrated and the streams created (as the bus admin), and api, audit sink, decider,
executor, and a worker plus a collector per node start, each as its own bus and database role,
each with its log under <home>/logs.
With `replicas` N, each of the four runs N times ("decider", "decider-2", ...): deciders and
executors elect one leader each (shared/infra/leases.py), audit sinks and apis all serve (idempotent
consumers, stateless HTTP).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from cli.local_services import LocalNats, LocalPostgres, die_with_parent, ensure_database, free_port, wait_for_port
from shared.infra.audit_chain import write_new_chain_key
from shared.infra.bus import init_streams
from shared.infra.bus_auth import BusDeployment, CredentialStore
from shared.infra.config import DEFAULT_CONFIG_FILE
from shared.infra.db import connect, ensure_role_passwords, migrate, service_url, set_role_passwords
from worker.inventory import node_cores

REPO_ROOT = Path(__file__).resolve().parent.parent


def bus_keys_from_env() -> Path | None:
    """The role keys of the NATS that NATS_URL names (ADC_BUS_CREDENTIALS_DIR), if given."""
    found = os.environ.get("ADC_BUS_CREDENTIALS_DIR")
    return Path(found) if found else None


@dataclass
class StackOptions:
    home: Path
    workers: int = 1
    simulate_gpus: int = 0
    gpu_memory: str = "80GiB"
    cpu_slots: int = 1
    api_port: int = 8080
    nats_url: str | None = None
    bus_credentials: Path | None = None  # with nats_url: the roles' keys that server was configured with
    database_url: str | None = None
    prefix: str = "adc"
    config_file: Path = DEFAULT_CONFIG_FILE
    overrides: dict = field(default_factory=dict)
    simulated_usage_dir: Path | None = (
        None  # each node's collector reads <dir>/<node>.json for simulated GPU memory use
    )
    die_with_parent: bool = False  # `adc up`: children get SIGTERM if it dies (tests keep control themselves)
    worker_args: dict[str, list[str]] = field(default_factory=dict)  # node -> extra worker flags (e.g. a memory cap)
    # node -> environment its worker gets besides the stack's (e.g. NATS_URL of a relay a test can cut)
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Folders the local admin's team ("default") may read; none given: the folder `adc up` runs in.
    roots: list[Path] = field(default_factory=list)
    replicas: int = 1  # instances of each controller and of the api
    backend: str = "local"  # what runs the trainers: the workers themselves, or Slurm (worker/backend.py)


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.o = options
        self.home = options.home.resolve()
        self.logs = self.home / "logs"
        self.chain_key_file = self.home / "secrets" / "audit_chain.key"  # outside Postgres, like any secret
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list[str]] = {}
        self.envs: dict[str, dict[str, str]] = {}  # what a process gets besides the stack's environment
        self._nats: LocalNats | None = None
        self.bus: BusDeployment | None = None  # the prefix, nodes and role keys of this installation
        self._pg: LocalPostgres | None = None
        self.nats_url = options.nats_url
        self.database_url = options.database_url  # the administrator's: migrations, and tests' own view
        self.db_passwords = self.home / "secrets" / "pg"  # a local Postgres's superuser and role passwords
        self.db_passwords_dir: Path | None = None  # where the services' role passwords are, if any
        self.api_url = ""
        self.api_urls: list[str] = []  # every api replica's; api_url is the first
        self.collector_metrics_urls: dict[str, str] = {}  # node -> its collector's /metrics
        self.token = ""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(f"node-{i}" for i in range(1, self.o.workers + 1))

    # --- lifecycle -------------------------------------------------------------------

    def start(self, progress=print) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if not self.nats_url:
            self.bus = BusDeployment(self.o.prefix, self.nodes, CredentialStore(self.home / "secrets" / "nats"))
            self._nats = LocalNats(self.home / "nats", self.logs / "nats.log", self._preexec())
            self.nats_url = self._nats.start(self.bus)
            progress(
                f"nats      {self.nats_url} (started here with authorization, a key per role in"
                f" {self.bus.keys.directory}; JetStream in {self.home / 'nats'})"
            )
        else:
            if self.o.bus_credentials is None:
                raise RuntimeError(
                    "NATS_URL names a running server: give the role keys it was configured with"
                    " (ADC_BUS_CREDENTIALS_DIR, written by `adc secrets init`)"
                )
            self.bus = BusDeployment(self.o.prefix, self.nodes, CredentialStore(self.o.bus_credentials))
            for role in self.bus.roles():
                self.bus.keys.credential(role)  # each one there, or an error naming it
            progress(f"nats      {self.nats_url} (keys in {self.bus.keys.directory})")
        asyncio.run(init_streams(self.nats_url, self.bus))
        if not self.database_url:
            self._pg = LocalPostgres(self.home / "pg", self.logs / "postgres.log", self.db_passwords)
            self.database_url = self._pg.start()
            self.db_passwords_dir = self.db_passwords
            progress(
                f"postgres  {self._pg.url} (started here, data in {self.home / 'pg'}; a password per role in"
                f" {self.db_passwords})"
            )
        else:
            found = os.environ.get("ADC_DB_PASSWORDS_DIR")  # the roles' passwords of that server, if it has them
            self.db_passwords_dir = Path(found) if found else None
            progress(f"postgres  {_redact(self.database_url)}")
        applied = asyncio.run(self._prepare_database())
        progress(f"migrate   {len(applied)} migration(s) applied" + (f": {', '.join(applied)}" if applied else ""))
        port = self.o.api_port or free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        config_path = self._write_config(port)
        env = os.environ | {
            "ADC_CONFIG": str(config_path),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        for var in (
            "NATS_URL",
            "DATABASE_URL",
            "ADC_BUS_PREFIX",
            "ADC_BUS_CREDENTIALS_DIR",
            "ADC_STORAGE_ROOT",
            "ADC_DB_PASSWORDS_DIR",
        ):
            env.pop(var, None)  # the written config is the truth for the children
        self._env = env
        self.api_urls = [self.api_url]
        for name, module in (
            ("audit-sink", "services.audit"),
            ("api", "services.api"),
            ("executor", "services.executor"),
            ("decider", "services.decider"),
        ):
            for r in range(1, self.o.replicas + 1):
                extra = []
                if name == "api" and r > 1:
                    extra = ["--port", str(free_port())]
                    self.api_urls.append(f"http://127.0.0.1:{extra[1]}")
                self._spawn(name if r == 1 else f"{name}-{r}", ["-m", module, *extra])
        for node in self.nodes:
            sim = (
                ["--simulate-gpus", str(self.o.simulate_gpus), "--gpu-memory", self.o.gpu_memory]
                if self.o.simulate_gpus
                else []
            )
            # The workers of a local stack share the host's cores: each offers its trainers its share.
            cores = ["--cpu-cores", str(max(1, node_cores() // len(self.nodes)))]
            self._spawn(
                f"worker-{node}",
                [
                    "-m",
                    "worker",
                    "--node",
                    node,
                    "--cpu-slots",
                    str(self.o.cpu_slots),
                    *cores,
                    *sim,
                    *(["--backend", self.o.backend] if self.o.backend != "local" else []),
                    *self.o.worker_args.get(node, []),
                ],
                self.o.worker_env.get(node),
            )
            usage = (
                ["--simulated-usage", str(Path(self.o.simulated_usage_dir) / f"{node}.json")]
                if self.o.simulated_usage_dir
                else []
            )
            # Each collector serves its node's GPUs on /metrics with dcgm-exporter's names, as dcgm-exporter would.
            metrics_port = free_port()
            self.collector_metrics_urls[node] = f"http://127.0.0.1:{metrics_port}/metrics"
            self._spawn(
                f"collector-{node}",
                ["-m", "services.collector", "--node", node, *sim, *usage, "--metrics-port", str(metrics_port)],
            )
        self._wait_healthy()
        self.token = asyncio.run(self._bootstrap_token())
        (self.home / "credentials.json").write_text(json.dumps({"api_url": self.api_url, "token": self.token}))
        os.chmod(self.home / "credentials.json", 0o600)
        for name, proc in self.procs.items():
            progress(f"{name:<9} pid {proc.pid}, log {self.logs / (name + '.log')}")
        progress(f"api       {self.api_url}  (OpenAPI: {self.api_url}/docs, dashboard: {self.api_url}/ui)")
        for node, url in self.collector_metrics_urls.items():
            progress(
                f"metrics   {node}: {url}  (dcgm-exporter names; the api's {self.api_url}/metrics and /v1/metrics)"
            )

    async def _prepare_database(self) -> list[str]:
        """Migrate as the administrator; with a password folder, give each service role its password
        (generated the first time): after this, nothing connects as the administrator."""
        await ensure_database(self.database_url)
        applied = await migrate(self.database_url)
        if self.db_passwords_dir is not None:
            ensure_role_passwords(self.db_passwords_dir)
            await set_role_passwords(self.database_url, str(self.db_passwords_dir))
        return applied

    async def _bootstrap_token(self) -> str:
        from shared.infra.api_tokens import create_token

        conn = await connect(self._service_url("api"))  # the api's own role: it may insert tokens
        try:
            _, secret = await create_token(conn, "local-admin", "admin", "default")
        finally:
            await conn.close()
        return secret

    def _write_config(self, port: int) -> Path:
        config = yaml.safe_load(self.o.config_file.read_text()) or {}
        config.update(
            {
                "bus": {"url": self.nats_url, "prefix": self.o.prefix, "credentials_dir": str(self.bus.keys.directory)},
                # No password here: each service connects as its own role, with its own password.
                "database": {
                    "url": _without_password(self.database_url),
                    **({"passwords_dir": str(self.db_passwords_dir)} if self.db_passwords_dir else {}),
                },
                "storage": {"root": str(self.home / "data"), "data_root": str(Path.cwd())},
                "api": {**config.get("api", {}), "host": "127.0.0.1", "port": port},
                "audit": {"chain_key_file": str(write_new_chain_key(self.chain_key_file))},
            }
        )
        for section, values in self.o.overrides.items():
            config[section] = {**config.get(section, {}), **values}
        config["tenancy"] = self._local_tenancy(config.get("tenancy") or {})
        path = self.home / "adc_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _local_tenancy(self, tenancy: dict) -> dict:
        """One user out of the box: the admin's team reads the folder this runs in (or --root), and trainers
        never see this stack's own state (credentials, secrets, database files, other jobs)."""
        team_roots = dict(tenancy.get("team_roots") or {})
        roots = [str(Path(r).resolve()) for r in (self.o.roots or [Path.cwd()])] + [str(self.home / "models")]
        team_roots["default"] = list(dict.fromkeys([*team_roots.get("default", []), *roots]))
        sandbox = dict(tenancy.get("sandbox") or {})
        state = [self.home / name for name in ("credentials.json", "secrets", "pg", "nats", "logs", "adc_config.yaml")]
        sandbox["hidden_paths"] = list(dict.fromkeys([*sandbox.get("hidden_paths", []), *map(str, state)]))
        return {**tenancy, "team_roots": team_roots, "sandbox": sandbox}

    def _service_url(self, service: str) -> str:
        return service_url(self.database_url, service, str(self.db_passwords_dir) if self.db_passwords_dir else None)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv[name] = argv
        self.envs[name] = env or {}
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, *argv],
            env=self._env | self.envs[name],
            cwd=str(Path.cwd()),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=self._preexec(),
        )

    def _preexec(self):
        return die_with_parent if self.o.die_with_parent else None

    def _wait_healthy(self, timeout: float = 60) -> None:
        host, port = "127.0.0.1", int(self.api_url.rsplit(":", 1)[1])
        wait_for_port(host, port, timeout, "api", self.procs["api"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.logs / (name + '.log')}")
            try:
                if httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"api not ready within {timeout:.0f}s")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def restart(self, name: str) -> None:
        self._spawn(name, self.argv[name], self.envs[name])

    def check_alive(self) -> list[str]:
        """Names of processes that have died."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout: float = 20) -> None:
        # Workers first, so their trainers stop while the bus is still there to report it.
        order = sorted(self.procs, key=lambda n: (not n.startswith("worker"), n))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._nats is not None:
            self._nats.stop()
        if self._pg is not None:
            self._pg.stop()


def _redact(url: str) -> str:
    """Keep passwords out of what is printed."""
    from urllib.parse import urlparse

    p = urlparse(url)
    if p.password:
        return p._replace(netloc=f"{p.username}:***@{p.hostname}" + (f":{p.port}" if p.port else "")).geturl()
    return url


def _without_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(url)
    if p.password is None:
        return url
    host = f"[{p.hostname}]" if p.hostname and ":" in p.hostname else (p.hostname or "")
    return urlunsplit(p._replace(netloc=f"{p.username}@{host}" + (f":{p.port}" if p.port else "")))
