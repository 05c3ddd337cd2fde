"""One submitted job is one trace: api request -> decider's decision -> executor -> worker's start.

The real api (uvicorn, with the audit sink), decider, executor and worker run in this process on
the real NATS and Postgres, so one in-memory exporter sees every span; the context crosses them
only as it does between processes, in NATS message headers and the job's stored traceparent.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml

from services.decider.engine import DeciderEngine
from services.executor.executor import Executor
from shared import tracing
from shared.command_auth import SignatureVerifier
from shared.config import load_config
from shared.db import create_pool, service_url
from tests.integration.api.conftest import serving_api
from tests.spans import SPANS, recording_spans
from worker.agent import NodeAgent
from worker.inventory import cpu_slots


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # The provider stays for the rest of the session (OpenTelemetry sets it once); the exporter
    # clears what it kept when this module is done.
    recording_spans()
    try:
        yield from serving_api(tmp_path_factory)
    finally:
        SPANS.clear()


async def test_one_trace_spans_api_decider_executor_and_worker(api, tmp_path):
    server = api.server
    config_file = tmp_path / "adc_config.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "controller": {"interval": 0.3},
                "worker": {"heartbeat_interval": 0.5},
                "bus": {
                    "url": server.env.nats_url,
                    "prefix": server.env.prefix,
                    "credentials_dir": str(server.env.keys.directory),
                },
                "database": {"url": server.env.database_url},
                "storage": {"root": str(tmp_path / "storage")},
            }
        )
    )
    config = load_config(config_file, env={})
    stop = asyncio.Event()
    pools = {s: await create_pool(service_url(config.database.url, s), 1, 4) for s in ("decider", "executor")}
    buses = {
        role: await server.env.bus(role, name=role.removesuffix("-node-1"))
        for role in ("decider", "executor", "worker-node-1")
    }
    services = [
        DeciderEngine(buses["decider"], pools["decider"], config, config_path=config_file).run(stop),
        Executor(buses["executor"], pools["executor"], config).run(stop),
        NodeAgent(
            buses["worker-node-1"],
            "node-1",
            cpu_slots(1),
            tmp_path / "storage",
            heartbeat_interval=0.5,
            tenancy=server.config.tenancy,
            data_root=server.config.storage.data_root,
            commands=SignatureVerifier.from_store(server.env.keys),
        ).run(stop),
    ]
    tasks = [asyncio.create_task(s) for s in services]
    try:
        async with httpx.AsyncClient(
            base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {api.tokens.user}"}
        ) as http:
            r = await http.post("/v1/jobs", json=api.job_spec("traced"))
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                s.name == "command start" and s.attributes.get("adc.job_id") == job_id
                for s in SPANS.get_finished_spans()
            ):
                await asyncio.sleep(0.2)
            job = (await http.get(f"/v1/jobs/{job_id}")).json()
            # Done with it: cancelled, its trainer goes at once rather than at the worker's stop.
            await http.post(f"/v1/jobs/{job_id}/cancel")
            while time.monotonic() < deadline and (await http.get(f"/v1/jobs/{job_id}")).json()["status"] not in (
                "cancelled",
                "failed",
                "succeeded",
            ):
                await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for bus in buses.values():
            await bus.close()
        for pool in pools.values():
            await pool.close()

    spans = [s for s in SPANS.get_finished_spans() if s.attributes.get("adc.job_id") == job_id]
    submits = [s for s in spans if s.name == "POST /v1/jobs"]
    assert len(submits) == 1, [s.name for s in spans]
    trace_id = submits[0].context.trace_id
    # Everything that started the job is in the submit's trace (the later cancel is a trace of its own).
    starting = [s for s in spans if s.name in ("decide start", "decision start", "command start")]
    assert len(starting) == 3 and {s.context.trace_id for s in starting} == {trace_id}, [
        (s.name, format(s.context.trace_id, "032x")) for s in spans
    ]
    in_trace = [s for s in SPANS.get_finished_spans() if s.context.trace_id == trace_id]
    by_service = {s.attributes.get(tracing.SERVICE) for s in in_trace}
    assert {"api", "decider", "executor", "worker"} <= by_service, [(s.name, s.attributes) for s in in_trace]
    names = {s.name for s in in_trace}
    assert {"POST /v1/jobs", "decide start", "decision start", "command start"} <= names, names
    # Parent links hold: every span but the request's has its parent inside the trace.
    ids = {s.context.span_id for s in in_trace}
    roots = [s for s in in_trace if s.parent is None or s.parent.span_id not in ids]
    assert [r.name for r in roots] == ["POST /v1/jobs"], [(r.name, r.parent) for r in roots]

    hex_id = format(trace_id, "032x")
    assert job["trace_id"] == hex_id
    rows = api.wait_audit(lambda r: r["job_id"] == job_id and r["kind"] == "command.start")
    traced = {r["kind"] for r in rows if r["job_id"] == job_id and r["data"].get("trace_id") == hex_id}
    assert {"job.submitted", "decision", "job.scheduled", "command.start"} <= traced, traced
