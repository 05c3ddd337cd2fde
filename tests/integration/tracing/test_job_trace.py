"""One submitted job is one trace: api request -> decider's decision -> executor -> worker's start
-> the trainer's own spans (loading, training, each evaluation and checkpoint, its exit), which
the worker makes of the trainer's events, as the trainer has no network to export them.

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
from shared.infra import tracing
from shared.infra.command_auth import SignatureVerifier
from shared.infra.config import load_config
from shared.infra.db import create_pool, service_url
from tests.conftest import REPO_ROOT, models_root
from tests.integration.api.conftest import serving_api
from tests.spans import SPANS, recording_spans
from worker.agent import NodeAgent
from worker.inventory import cpu_slots


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_model):
    # The provider stays for the rest of the session (OpenTelemetry sets it once); the exporter
    # clears what it kept when this module is done.
    recording_spans()
    # The job trains: its team reads the session's models (a folder the trainer's uid may read) and
    # the examples, not the whole of pytest's (the owner's only) temporary tree.
    readable = {"shared_roots": [str(REPO_ROOT / "examples"), str(models_root(tmp_path_factory))]}
    try:
        yield from serving_api(tmp_path_factory, {"tenancy": readable})
    finally:
        SPANS.clear()


async def test_one_trace_spans_api_decider_executor_worker_and_trainer(api, tmp_path, tiny_model):
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
            spec = api.job_spec("traced")
            spec["train"] |= {
                "model_name_or_path": str(tiny_model),
                "max_steps": 6,
                "save_steps": 3,
                "logging_steps": 1,
                "max_samples": 24,
                "val_size": 0.2,
                "eval_strategy": "steps",
                "eval_steps": 3,
                "per_device_eval_batch_size": 2,
            }
            r = await http.post("/v1/jobs", json=spec)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            deadline = time.monotonic() + 240
            while (job := (await http.get(f"/v1/jobs/{job_id}")).json())["status"] not in (
                "cancelled",
                "failed",
                "succeeded",
            ):
                assert time.monotonic() < deadline, job
                await asyncio.sleep(0.5)
            assert job["status"] == "succeeded", (job["status_reason"], job.get("error"))
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

    # Into the trainer: its spans are the worker's `command start`'s children, in the same trace.
    trainer = [s for s in in_trace if s.attributes.get("adc.attempt") is not None and s.name != "command start"]
    assert [s.name for s in trainer if not s.name.startswith("train steps")] == [
        "trainer load",
        "evaluate eval",
        "checkpoint",
        "evaluate eval",
        "checkpoint",
        "evaluate eval",  # LLaMA-Factory evaluates once more after training (do_eval)
        "trainer exit",
    ], [s.name for s in trainer]
    start = next(s for s in in_trace if s.name == "command start")
    assert all(s.parent.span_id == start.context.span_id for s in trainer)
    checkpoints = [s for s in trainer if s.name == "checkpoint"]
    assert [c.attributes["adc.step"] for c in checkpoints] == [3, 6]
    assert all(c.attributes["adc.path"].endswith(f"checkpoint-{c.attributes['adc.step']}") for c in checkpoints)
    assert "adc.metric.eval_loss" in next(s for s in trainer if s.name == "evaluate eval").attributes
    assert trainer[-1].attributes["adc.outcome"] == "succeeded"
    # None stays open for the attempt: each ends where the next begins, and links the one before.
    for before, after in zip(trainer, trainer[1:]):
        assert before.end_time <= after.start_time + 1_000_000, (before.name, after.name)
        assert [link.context.span_id for link in after.links] == [before.context.span_id]

    hex_id = format(trace_id, "032x")
    assert job["trace_id"] == hex_id
    rows = api.wait_audit(lambda r: r["job_id"] == job_id and r["kind"] == "command.start")
    traced = {r["kind"] for r in rows if r["job_id"] == job_id and r["data"].get("trace_id") == hex_id}
    assert {"job.submitted", "decision", "job.scheduled", "command.start"} <= traced, traced


def test_an_operators_actions_link_the_decision_they_became(api, tiny_model):
    """A pause is a manual decision in the job's trace, linked both ways with the operator's request;
    a migrate request links the job's trace, where the decider's decision for it follows."""
    with api.client("user") as http:
        spec = api.job_spec("operated")
        spec["train"]["model_name_or_path"] = str(tiny_model)
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = r.json()
        job_trace = http.get(f"/v1/jobs/{job['id']}").json()["trace_id"]
    api.server.sql(
        "UPDATE jobs SET status = 'running', attempt = 1, placement = $2 WHERE id = $1",
        job["id"],
        [{"node": "node-9", "gpus": [0]}],
    )
    with api.client("operator") as http:
        assert http.post(f"/v1/jobs/{job['id']}/pause").status_code == 202
        assert http.post(f"/v1/jobs/{job['id']}/migrate", json={}).status_code == 202

    def finished(name_part: str):
        deadline = time.monotonic() + 10
        while not (found := [s for s in SPANS.get_finished_spans() if name_part in s.name]):
            assert time.monotonic() < deadline, [s.name for s in SPANS.get_finished_spans()]
            time.sleep(0.1)
        return found

    (decided,) = [s for s in finished("decide pause") if s.attributes.get("adc.job_id") == job["id"]]
    assert format(decided.context.trace_id, "032x") == job_trace  # the job's own trace
    assert decided.attributes["adc.actor"].endswith("(operator, team sre)")
    (asked,) = [s for s in finished("/pause") if s.context.span_id == decided.links[0].context.span_id]
    assert asked.context.trace_id != decided.context.trace_id  # the operator's request: a trace of its own
    assert [link.context.span_id for link in asked.links] == [decided.context.span_id]
    assert asked.links[0].attributes["adc.decision_id"] == decided.attributes["adc.decision_id"]
    (moved,) = finished("/migrate")
    assert [format(link.context.trace_id, "032x") for link in moved.links] == [job_trace]
    rows = api.wait_audit(lambda r: r["job_id"] == job["id"] and r["kind"] == "decision")
    (decision,) = [r for r in rows if r["job_id"] == job["id"] and r["kind"] == "decision"]
    assert decision["data"]["trace_id"] == job_trace
    api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job["id"])
