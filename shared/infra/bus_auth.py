"""Who may say what on the bus: an nkey per role, and the nats-server authorization that holds
each role to the subjects its job needs.

Roles: `admin` (creates and updates the streams, as the migration role does the tables),
`api`, `decider`, `executor`, `audit-sink`, and per node `worker-<node>` and `collector-<node>`.
Each connection authenticates with its role's seed (`<dir>/<role>.nk`, mode 0600; the server
holds only public keys). Permissions are allow-lists: the server refuses anything else.

Why a worker may publish what it does: its own node's heartbeat and refusal reports, and job
events on its own node's subjects only (`<prefix>.jobs.<node>.*.events`; the executor, decider
and api take a trainer event only from a node of the job's placement, services/executor/senders.py),
and it answers only the requests it received (`allow_responses`): the executor's commands and the api's
chat completion requests for its serving jobs (`<prefix>.nodes.<node>.chat`, which only the api may
send). The api publishes job events (submissions, cancel requests) on its own source,
`<prefix>.jobs._api.*.events`. Replies come back
on a per-role inbox (`_INBOX.<prefix>.<role>.>`), so no role reads another's replies.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nkeys

from shared.contracts.subjects import API_SOURCE, Subjects
from shared.infra.bus_tls import CA_FILE, ServerTls
from shared.infra.config import AdcConfig, ConfigError

SERVICE_ROLES = ("admin", "api", "decider", "executor", "audit-sink")
_API = "$JS.API"


def worker_role(node: str) -> str:
    return f"worker-{node}"


def collector_role(node: str) -> str:
    return f"collector-{node}"


def inbox_prefix(subjects: Subjects, role: str) -> str:
    return f"_INBOX.{subjects.prefix}.{role}"


# --- credentials -----------------------------------------------------------------------


@dataclass(frozen=True)
class BusCredential:
    """A role's identity on the bus: its name and the file holding its seed (never the seed itself,
    so it is not copied into configs, logs or a child's environment)."""

    role: str
    seed_file: Path
    ca_file: Path | None = None  # the bus CA beside the keys (shared/infra/bus_tls.py): then TLS only, verified

    def keypair(self) -> nkeys.KeyPair:
        return nkeys.from_seed(bytearray(self.seed_file.read_bytes().strip()))

    def __repr__(self) -> str:  # the path is no secret, but say only what identifies the role
        return f"BusCredential(role={self.role!r})"


class CredentialStore:
    """A folder of seeds (`<role>.nk`, owner-only) and public keys (`<role>.pub`)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def seed_file(self, role: str) -> Path:
        _check_role(role)
        return self.directory / f"{role}.nk"

    def credential(self, role: str) -> BusCredential:
        path = self.seed_file(role)
        if not path.is_file():
            raise FileNotFoundError(f"no bus credential for role {role!r} in {self.directory} (run `adc secrets init`)")
        ca = self.directory / CA_FILE
        return BusCredential(role, path, ca if ca.is_file() else None)

    def public_key(self, role: str) -> str:
        _check_role(role)
        return (self.directory / f"{role}.pub").read_text().strip()

    def ensure(self, roles: Iterable[str]) -> list[str]:
        """Mint a key for each role that has none; existing keys are kept. Returns the roles minted."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        minted = []
        for role in roles:
            seed_path = self.seed_file(role)
            if seed_path.exists():
                continue
            seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
            public = nkeys.from_seed(bytearray(seed)).public_key.decode()
            (self.directory / f"{role}.pub").write_text(public + "\n")  # first: a seed never lacks its .pub
            fd = os.open(seed_path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(seed + b"\n")
            os.replace(seed_path.with_suffix(".tmp"), seed_path)
            minted.append(role)
        return minted


def _check_role(role: str) -> None:
    # Roles name files and subject tokens: lowercase letters, digits, '-' and '_' only.
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,79}", role):
        raise ValueError(f"invalid bus role name {role!r}")


def bus_credential(config: AdcConfig, role: str) -> BusCredential:
    """This process's bus credential, from `bus.credentials_dir`; an error naming the key if there is none."""
    if not config.bus.credentials_dir:
        raise ConfigError(
            "bus.credentials_dir",
            [
                "not set: every bus connection authenticates; run `adc secrets init`"
                " and point bus.credentials_dir (or ADC_BUS_CREDENTIALS_DIR) at it"
            ],
        )
    try:
        return CredentialStore(config.bus.credentials_dir).credential(role)
    except FileNotFoundError as err:
        raise ConfigError("bus.credentials_dir", [str(err)]) from None


# --- permissions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may answer requests it received (a worker's command replies), nothing else
    publish_deny: tuple[str, ...] = ()  # carved out of a wildcard in `publish`


def _durable(stream: str, durable: str) -> list[str]:
    """A durable pull consumer, created, read and acked by its one owner."""
    return [
        f"{_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{_API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{_API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _kv_reader(bucket: str) -> list[str]:
    return [f"{_API}.STREAM.INFO.KV_{bucket}", f"{_API}.DIRECT.GET.KV_{bucket}.>", f"{_API}.STREAM.MSG.GET.KV_{bucket}"]


def _kv_owner(bucket: str) -> list[str]:
    """Creates the bucket, writes and lists its keys (an ordered consumer, with flow control)."""
    stream = f"KV_{bucket}"
    return [
        *_kv_reader(bucket),
        f"{_API}.STREAM.CREATE.{stream}",
        f"$KV.{bucket}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _dead_letters(s: Subjects, *durables: str) -> list[str]:
    return [s.dead_letters(d) for d in durables]


def stream_names(s: Subjects) -> list[str]:
    """Every JetStream stream one installation uses: its five streams and its two KV buckets."""
    return [*s.streams(), f"KV_{s.pending_reasons_bucket}", f"KV_{s.leader_bucket}"]


def permissions(role: str, s: Subjects) -> Permissions:
    inbox = f"{inbox_prefix(s, role)}.>"
    if role == "admin":
        ops = ("CREATE", "UPDATE", "INFO", "DELETE", "PURGE", "MSG.GET")  # MSG.GET: reading dead letters
        return Permissions(
            publish=(
                *(f"{_API}.STREAM.{op}.{name}" for name in stream_names(s) for op in ops),
                f"{_API}.STREAM.NAMES",
                f"{_API}.STREAM.LIST",
                f"{_API}.INFO",
            ),
            subscribe=(inbox,),
        )
    if role == "api":
        jobs = s.jobs_stream  # job history: a short-lived consumer per read (services/api/job_telemetry.py)
        return Permissions(
            publish=(
                s.audit,
                s.decisions,
                s.job_events("*", API_SOURCE),  # audit, manual actions, submitted/cancel requests
                s.chat("*"),  # chat completions for serving jobs, relayed by the job's worker (services/api/serving.py)
                f"{_API}.CONSUMER.CREATE.{jobs}",
                f"{_API}.CONSUMER.CREATE.{jobs}.>",
                f"{_API}.CONSUMER.INFO.{jobs}.*",
                f"{_API}.CONSUMER.MSG.NEXT.{jobs}.*",
                f"{_API}.CONSUMER.DELETE.{jobs}.*",
                *_kv_reader(s.pending_reasons_bucket),
            ),
            subscribe=(s.metrics("*"), s.job_events(), inbox),
            # its short-lived consumers have random names, so wildcards above; never the executor's
            publish_deny=(
                *(
                    f"{_API}.CONSUMER.{op}.{jobs}.{s.consumer('executor-jobs')}"
                    for op in ("MSG.NEXT", "DELETE", "CREATE")
                ),
                f"{_API}.CONSUMER.CREATE.{jobs}.{s.consumer('executor-jobs')}.>",
            ),
        )
    if role == "decider":
        return Permissions(
            publish=(s.decisions, s.audit, *_kv_owner(s.pending_reasons_bucket), *_kv_owner(s.leader_bucket)),
            subscribe=(s.heartbeat("*"), s.metrics("*"), s.job_events(), s.audit, s.decisions, inbox),
        )
    if role == "executor":
        decisions, jobs = s.consumer("executor"), s.consumer("executor-jobs")
        return Permissions(
            publish=(
                s.command("*"),
                s.audit,
                *_kv_owner(s.leader_bucket),
                *_durable(s.decisions_stream, decisions),
                *_durable(s.jobs_stream, jobs),
                *_dead_letters(s, decisions, jobs),
            ),
            subscribe=(s.heartbeat("*"), inbox),
        )
    if role == "audit-sink":
        sink, refusals = s.consumer("audit-sink"), s.consumer("audit-refusals")
        return Permissions(
            publish=(
                s.audit,
                *_durable(s.audit_stream, sink),
                *_durable(s.refusals_stream, refusals),
                *_dead_letters(s, sink, refusals),
            ),
            subscribe=(inbox,),
        )
    if role.startswith("worker-"):
        node = role.removeprefix("worker-")
        return Permissions(
            publish=(s.heartbeat(node), s.command_refusals(node), s.job_events("*", node)),
            subscribe=(s.command(node), s.chat(node), inbox),
            allow_responses=True,
        )
    if role.startswith("collector-"):
        node = role.removeprefix("collector-")
        return Permissions(publish=(s.metrics(node),), subscribe=(s.heartbeat(node), inbox))
    raise ValueError(f"unknown bus role {role!r}")


# --- one installation on a server ------------------------------------------------------


@dataclass(frozen=True)
class BusDeployment:
    """One ADC installation's users on a NATS server: its subject prefix, its nodes, its keys."""

    prefix: str
    nodes: tuple[str, ...]
    keys: CredentialStore

    def __post_init__(self) -> None:  # both end up in subjects and in the server's config file
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.prefix):
            raise ValueError(f"invalid bus prefix {self.prefix!r}: lowercase letters and digits, a letter first")
        for node in self.nodes:  # a letter or digit first: no node takes the api's event source (`_api`)
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", node):
                raise ValueError(
                    f"invalid node name {node!r}: lowercase letters, digits, '-' and '_', a letter or"
                    " digit first (at most 63)"
                )

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    def roles(self) -> list[str]:
        return [*SERVICE_ROLES, *map(worker_role, self.nodes), *map(collector_role, self.nodes)]

    def mint(self) -> list[str]:
        return self.keys.ensure(self.roles())


def _quoted(items: Iterable[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def authorization_block(deployments: Iterable[BusDeployment]) -> str:
    """nats-server's `authorization { users = [...] }` for these installations (supported since 2.2)."""
    users = []
    for d in deployments:
        for role in d.roles():
            p = permissions(role, d.subjects)
            responses = ", allow_responses: true" if p.allow_responses else ""
            deny = f", deny: {_quoted(p.publish_deny)}" if p.publish_deny else ""
            users.append(
                f'    {{ nkey: "{d.keys.public_key(role)}",  # {d.prefix} {role}\n'
                f"      permissions: {{ publish: {{ allow: {_quoted(p.publish)}{deny} }},\n"
                f"                     subscribe: {{ allow: {_quoted(p.subscribe)} }}{responses} }} }}"
            )
    return "authorization {\n  users: [\n" + ",\n".join(users) + "\n  ]\n}\n"


def write_server_config(path: Path, deployments: Iterable[BusDeployment], tls: ServerTls | None = None) -> Path:
    """The authorization config a nats-server is started (or reloaded) with: `nats-server -c PATH`;
    with `tls`, clients must speak TLS first and the server shows that certificate."""
    deployments = list(deployments)
    for d in deployments:
        d.mint()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        "# Generated by ADC (shared/infra/bus_auth.py): one nkey user per role, least privilege.\n"
        + (tls.config_block() if tls else "")
        + authorization_block(deployments)
    )
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
