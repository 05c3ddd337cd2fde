"""Every service that consumes the bus serves what it refused on its own `/metrics` page
(`metrics.<service>` ports): the executor, the decider, the audit sink and a worker run as the
processes they are deployed as, each is sent a malformed message on a subject it reads, and each
page then counts exactly that refusal, by subject and reason, and nothing it was not sent."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cli.local_services import free_port
from shared.contracts.messages import CommandResult
from shared.infra import command_auth

NODE = "mnode"
SERVICES = {  # service -> (module and arguments, its bus role)
    "executor": (["services.executor"], "executor"),
    "decider": (["services.decider"], "decider"),
    "audit_sink": (["services.audit"], "audit-sink"),
    "worker": (["worker", "--node", NODE, "--cpu-slots", "1"], f"worker-{NODE}"),
}


def rejected(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["subject"], s.labels["reason"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "adc_rejected_messages"
        for s in f.samples
        if s.name.endswith("_total")
    }


async def scrape(port: int, until=lambda got: True, timeout: float = 60) -> dict[tuple[str, str], float]:
    deadline, got, last = time.monotonic() + timeout, None, None
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                got = rejected((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
                if until(got):
                    return got
            except httpx.HTTPError as err:
                last = err
            await asyncio.sleep(0.2)
    raise AssertionError(f"port {port}: last scrape {got}, last error {last!r}")


async def test_each_bus_consumer_serves_its_refusals_on_its_metrics_page(isolated, tmp_path):
    ports = {name: free_port() for name in SERVICES}
    config = tmp_path / "adc_config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database": {"url": isolated.database_url},
                "metrics": ports,
                "storage": {"root": str(tmp_path / "storage")},
            }
        )
    )
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *argv, "--config", str(config)],
            env=os.environ | isolated.service_env(role),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for name, (argv, role) in SERVICES.items()
    }
    buses = {role: await isolated.bus(role) for role in ("decider", "executor", f"worker-{NODE}", f"collector-{NODE}")}
    try:
        for name, port in ports.items():  # each page is up, and nothing was refused yet
            assert await scrape(port) == {}, name
        s = buses["decider"].subjects
        garbage = b"\xffnot json"
        await buses["decider"].js.publish(s.decisions, garbage, headers={"Nats-Msg-Id": uuid.uuid4().hex})
        await buses["decider"].js.publish(s.audit, garbage, headers={"Nats-Msg-Id": uuid.uuid4().hex})

        async def core_garbage() -> None:
            await buses[f"worker-{NODE}"].nc.publish(s.heartbeat(NODE), garbage)
            await buses[f"collector-{NODE}"].nc.publish(s.metrics(NODE), b'{"node": "mnode"}')
            await buses[f"worker-{NODE}"].nc.flush()
            await buses[f"collector-{NODE}"].nc.flush()

        # Heartbeats and metrics are core NATS (at most once): one sent before a service has subscribed
        # is gone, and a metrics page is up before its service subscribes. Sent again until all count it.
        watched = [
            ("executor", ("heartbeats", "malformed_json")),
            ("decider", ("heartbeats", "malformed_json")),
            ("decider", ("metrics", "schema")),
        ]
        sent, deadline = 0, time.monotonic() + 60
        while True:
            await core_garbage()
            sent += 1
            counted = [(await scrape(ports[name])).get(key) for name, key in watched]
            if all(counted):
                break
            assert time.monotonic() < deadline, f"heartbeat and metrics garbage never counted: {counted}"
            await asyncio.sleep(1)
        executor = buses["executor"]  # a command the executor signed, whose body is garbage
        headers = command_auth.sign(executor.credential.keypair(), s.command(NODE), garbage)
        reply = CommandResult.decode(
            (await executor.nc.request(s.command(NODE), garbage, timeout=10, headers=headers)).data
        )
        assert not reply.ok and reply.error == "bad_command"
        unsigned = CommandResult.decode(
            (await executor.nc.request(s.command(NODE), b'{"kind": "start"}', timeout=10)).data
        )
        assert not unsigned.ok and unsigned.error == "unauthenticated"

        expected = {
            "executor": {("decisions", "malformed_json"): 1, ("heartbeats", "malformed_json"): 1},
            "decider": {("heartbeats", "malformed_json"): 1, ("metrics", "schema"): 1},
            "audit_sink": {("audit", "malformed_json"): 1},
            "worker": {("commands", "malformed_json"): 1, ("commands", "unauthenticated"): 1},
        }
        core = {("heartbeats", "malformed_json"), ("metrics", "schema")}
        for name, counts in expected.items():
            # Exactly what was sent: once on JetStream subjects, at most `sent` times on core ones.
            def matches(got, want=counts):
                return got.keys() == want.keys() and all(
                    1 <= got[k] <= sent if k in core else got[k] == n for k, n in want.items()
                )

            got = await scrape(ports[name], matches, timeout=20)
            assert matches(got), (name, got, sent)
        assert all(p.poll() is None for p in procs.values()), {n: p.returncode for n, p in procs.items()}
    finally:
        for bus in buses.values():
            await bus.close()
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
