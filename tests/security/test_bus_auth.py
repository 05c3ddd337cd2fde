"""Attacks on the bus, against a real nats-server running ADC's authorization (the one `adc up`
runs, tests/conftest.py) and a real worker agent and audit sink.

Who is refused: a connection without a key or with an unknown one; a worker's key publishing
a decision, a command, an audit event or another node's heartbeat, or reading another node's
commands. A command that reaches a worker without the executor's signature (unsigned, signed
by another key, or signed for another node) is refused, never run, and lands in the audit log
as `command.refused`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

import nats
import nats.errors
import nkeys
import pytest
import pytest_asyncio

from services.audit.sink import run_sink
from shared.contracts.actions import NodeGpus, Start
from shared.contracts.messages import AuditEvent, Command, CommandError, CommandResult, Decision, Heartbeat
from shared.infra.bus import Bus
from shared.infra.bus_auth import BusCredential
from shared.infra.bus_tls import client_context
from shared.infra.command_auth import SIGNATURE_HEADER, SignatureVerifier, sign
from shared.infra.db import create_pool, service_url
from tests.conftest import Isolated
from worker.agent import NodeAgent
from worker.inventory import cpu_slots


@pytest.fixture(scope="module")
def env():
    e = Isolated(nodes=("n1", "n2")).open()
    yield e
    e.close()


class Refusals:
    """The asynchronous errors the server sends a connection (permission violations arrive so)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, err: Exception) -> None:
        self.seen.append(str(err).lower())

    async def wait_for(self, subject: str, timeout: float = 5) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := [s for s in self.seen if "permissions violation" in s and f'"{subject.lower()}"' in s]:
                return found[0]
            await asyncio.sleep(0.02)
        raise AssertionError(f"no permissions violation for {subject}; errors seen: {self.seen}")


async def connect_as(env: Isolated, role: str) -> tuple[Bus, Refusals]:
    bus = await env.bus(role)
    refusals = Refusals()
    bus.nc._error_cb = refusals  # nats-py calls it with each -ERR the server sends
    return bus, refusals


async def stream_messages(env: Isolated, stream: str) -> int:
    admin = await env.bus("admin")
    try:
        return (await admin.js.stream_info(stream)).state.messages
    finally:
        await admin.close()


def over_tls(env: Isolated) -> dict:
    """What a client needs to get past the server's TLS (tests/security/test_bus_tls.py), to reach its authorization."""
    return {"tls": client_context(env.keys.directory / "ca.pem"), "tls_handshake_first": True}


async def test_a_connection_without_a_key_is_refused(env):
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            env.nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **over_tls(env)
        )


async def test_a_key_the_server_does_not_know_is_refused(env, tmp_path):
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            env.nats_url,
            nkeys_seed=str(stranger),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
            **over_tls(env),
        )


async def test_a_worker_key_cannot_publish_decisions_commands_or_audit_events(env):
    worker, refusals = await connect_as(env, "worker-n1")
    victim = await env.bus("worker-n2")  # would see a forged command on its subject
    seen_commands: list[bytes] = []

    async def on_command(msg) -> None:
        seen_commands.append(msg.data)

    sub = await victim.nc.subscribe(victim.subjects.command("n2"), cb=on_command)
    s = worker.subjects
    before = {st: await stream_messages(env, st) for st in (s.decisions_stream, s.audit_stream)}
    try:
        decision = Decision(
            decision_id="forged-decision",
            ts=time.time(),
            rule="forged",
            snapshot_ts=time.time(),
            action=Start(job_id="victim", reason="x", placement=[NodeGpus(node="n1", gpus=[0])]),
        )
        forged_audit = AuditEvent(
            event_id="forged-1",
            ts=time.time(),
            source="executor",
            kind="job.succeeded",
            job_id="victim",
            reason="suppressing the real trail",
        )
        for subject, msg in (
            (s.decisions, decision),
            (s.audit, forged_audit),
            (s.command("n2"), Command(kind="cancel", job_id="victim", attempt=1)),
        ):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await worker.js.publish(subject, msg.encode(), timeout=1)  # JetStream never acknowledges it
            await refusals.wait_for(subject)
        await victim.nc.flush()
        assert seen_commands == []
        assert {st: await stream_messages(env, st) for st in before} == before
    finally:
        await sub.unsubscribe()
        await victim.close()
        await worker.close()


async def test_a_worker_key_speaks_for_its_own_node_only(env):
    worker, refusals = await connect_as(env, "worker-n1")
    decider = await env.bus("decider")
    beats: list[str] = []

    async def on_beat(msg) -> None:
        beats.append(msg.subject)

    sub = await decider.nc.subscribe(decider.subjects.heartbeat("*"), cb=on_beat)
    try:
        s = worker.subjects
        beat = Heartbeat(node="n2", ts=time.time(), started_at=time.time(), devices=cpu_slots(1))
        await worker.nc.publish(s.heartbeat("n2"), beat.encode())  # another node's
        await refusals.wait_for(s.heartbeat("n2"))
        await worker.nc.subscribe(s.command("n2"))  # another node's commands
        await refusals.wait_for(s.command("n2"))
        await worker.nc.publish(s.heartbeat("n1"), beat.model_copy(update={"node": "n1"}).encode())  # its own
        await worker.nc.flush()
        deadline = time.monotonic() + 5
        while s.heartbeat("n1") not in beats and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert beats == [s.heartbeat("n1")]
    finally:
        await sub.unsubscribe()
        await decider.close()
        await worker.close()


@pytest_asyncio.fixture(scope="module")
async def node(env, tmp_path_factory):
    """A real worker agent on n1 (verifying with the executor's public key) and the real audit sink."""
    worker = await env.bus("worker-n1", name="worker")
    sink_bus = await env.bus("audit-sink")
    pool = await create_pool(service_url(env.database_url, "audit-sink"))
    stop = asyncio.Event()
    agent = NodeAgent(
        worker,
        "n1",
        cpu_slots(1),
        tmp_path_factory.mktemp("storage"),
        heartbeat_interval=0.5,
        commands=SignatureVerifier.from_store(env.keys),
    )
    tasks = [asyncio.create_task(agent.run(stop)), asyncio.create_task(run_sink(sink_bus, pool, stop))]
    executor = await env.bus("executor")
    await asyncio.sleep(0.3)  # the agent has subscribed
    yield agent, executor
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for bus in (executor, sink_bus, worker):
        await bus.close()
    await pool.close()


def hostile_start(job_id: str) -> Command:
    """What an attacker on the bus once sent: a start whose environment ran a shell command."""
    return Command(
        kind="start",
        job_id=job_id,
        attempt=1,
        placement=[NodeGpus(node="n1", gpus=[0])],
        train={"stage": "sft"},
        env={"BASH_ENV": "/tmp/pwn.sh", "LD_PRELOAD": "/tmp/evil.so"},
    )


async def send(executor: Bus, subject: str, cmd: Command, headers: dict[str, str] | None) -> CommandResult:
    reply = await executor.nc.request(subject, cmd.encode(), timeout=5, headers=headers)
    return CommandResult.decode(reply.data)


async def refused_rows(env: Isolated, job_id: str, timeout: float = 10) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = await asyncio.to_thread(
            env.sql,
            "SELECT * FROM audit_events WHERE kind = 'command.refused' AND data->'claimed'->>'job_id' = $1",
            job_id,
        )
        if rows:
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"no command.refused audit row for {job_id}")


@pytest.mark.parametrize("forgery", ["unsigned", "wrong key", "signed for another node", "payload altered"])
async def test_a_command_the_executor_did_not_sign_is_refused_reported_and_never_run(env, node, forgery):
    agent, executor = node
    job_id = f"forged-{forgery.replace(' ', '-')}"
    cmd = hostile_start(job_id)
    subject, payload = executor.subjects.command("n1"), cmd.encode()
    headers = {
        "unsigned": None,
        "wrong key": sign(
            nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))), subject, payload
        ),
        "signed for another node": sign(executor.credential.keypair(), executor.subjects.command("n2"), payload),
        "payload altered": sign(executor.credential.keypair(), subject, hostile_start("some-other-job").encode()),
    }[forgery]
    result = await send(executor, subject, cmd, headers)
    assert not result.ok and result.error == CommandError.UNAUTHENTICATED
    assert job_id not in agent.trainers
    [row] = await refused_rows(env, job_id)
    assert row["source"] == "worker-n1" and row["node"] == "n1" and row["action"] == "start"
    assert row["reason"].startswith("worker on n1 refused a command: ")


async def test_a_command_the_executor_signed_is_carried_out(env, node):
    """The control: the same door lets the executor's own signature through."""
    agent, executor = node
    cmd = Command(kind="stop", job_id="not-here", attempt=1)
    result = await executor.request(executor.subjects.command("n1"), cmd, timeout=5, signed=True)
    assert CommandResult.decode(result.data).error == CommandError.NOT_RUNNING  # handled, not refused


async def test_a_garbled_signature_is_refused(env, node):
    agent, executor = node
    cmd = hostile_start("forged-garbled")
    result = await send(
        executor,
        executor.subjects.command("n1"),
        cmd,
        {SIGNATURE_HEADER: base64.b64encode(b"\x00" * 10).decode() + "!!"},
    )
    assert result.error == CommandError.UNAUTHENTICATED
    assert (await refused_rows(env, "forged-garbled"))[0]["reason"].endswith("not signed by the executor")


async def test_only_the_api_asks_a_node_for_chat_completions_and_only_that_worker_hears(env, node):
    """The chat subject of a node (serving jobs, docs/serving.md): another node's worker may neither read
    nor send there, nor may the executor send; the api's request reaches the real worker agent of n1,
    which answers for its trainers only."""
    import json

    other, refusals = await connect_as(env, "worker-n2")
    executor, executor_refusals = await connect_as(env, "executor")
    api = await env.bus("api")
    try:
        s = other.subjects
        await other.nc.subscribe(s.chat("n1"))
        await refusals.wait_for(s.chat("n1"))
        await other.nc.publish(s.chat("n1"), b"{}")
        await executor.nc.publish(s.chat("n1"), b"{}")
        await executor_refusals.wait_for(s.chat("n1"))
        ask = {"job_id": "j0000000000000000", "attempt": 1, "body": {"messages": []}}
        reply = await api.nc.request(s.chat("n1"), json.dumps(ask).encode(), timeout=10)
        assert json.loads(reply.data) == {"status": 404, "error": "job j0000000000000000 is not serving on this node"}
    finally:
        for bus in (other, executor, api):
            await bus.close()


def test_credentials_are_files_never_seeds_in_reprs(env):
    cred: BusCredential = env.credential("worker-n1")
    seed = cred.seed_file.read_text().strip()
    assert oct(cred.seed_file.stat().st_mode & 0o777) == "0o600"
    assert seed not in repr(cred) and str(cred.seed_file) not in repr(cred)


async def test_the_api_key_cannot_read_or_delete_the_executors_job_events_consumer(env):
    """The api reads job history through short-lived consumers of its own, never the executor's."""
    executor = await env.bus("executor")
    api, refusals = await connect_as(env, "api")
    s = api.subjects
    try:
        from nats.js.api import ConsumerConfig

        durable = s.consumer("executor-jobs")
        await executor.js.add_consumer(
            s.jobs_stream, ConsumerConfig(durable_name=durable, filter_subject=s.job_events("*"))
        )
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await api.js.delete_consumer(s.jobs_stream, durable)
        await refusals.wait_for(f"$JS.API.CONSUMER.DELETE.{s.jobs_stream}.{durable}")
        assert (await executor.js.consumer_info(s.jobs_stream, durable)).name == durable
    finally:
        await api.close()
        await executor.close()


@pytest.mark.parametrize(
    "binary",
    sorted({b for b in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.path.exists(b)})
    or [pytest.param(None, marks=pytest.mark.skip(reason="no system nats-server"))],
)
async def test_the_generated_authorization_holds_on_the_systems_nats_server(binary, tmp_path, monkeypatch):
    """The same authorization on Debian's nats-server (2.9): no key refused, a worker's decision refused.
    Without ADC's TLS: its `handshake_first` needs nats-server 2.10.4 or later (docs/security.md, "Bus")."""
    import subprocess

    import cli.local_services as local
    from shared.infra.bus_auth import BusDeployment, CredentialStore

    monkeypatch.setattr(local, "nats_server_binary", lambda: binary)
    assert "v2." in subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    deployment = BusDeployment("sys", ("n1",), CredentialStore(tmp_path / "keys"))
    server = local.LocalNats(tmp_path / "nats", tmp_path / "nats.log", tls=False)
    url = server.start(deployment)
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)
        worker = await Bus.connect(url, "sys", "w", deployment.keys.credential("worker-n1"))
        refusals = Refusals()
        worker.nc._error_cb = refusals
        await worker.nc.publish(worker.subjects.decisions, b"{}")
        await refusals.wait_for(worker.subjects.decisions)
        await worker.nc.publish(worker.subjects.heartbeat("n1"), b"{}")
        await worker.nc.flush()
        assert not [s for s in refusals.seen if "heartbeat" in s]
        await worker.close()
    finally:
        server.stop()
