"""A decision the decider makes of something that came from another trace links that trace's span:
an operator's move request (`POST /v1/jobs/{id}/migrate`), and the telemetry sample whose memory
reading triggered `oom_protection` (the collector's publish span). The audit row of the decision
names what it links.

The real api (with its audit sink) and a real decider run on the real NATS and Postgres; the
request's context reaches the decider only as it does between processes, in the move request's
row, and the sample's in the telemetry message.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.collector.publish import publish_sample
from shared.contracts.messages import GpuSample, NodeMetrics
from shared.infra.db import connect
from tests.integration.api.conftest import serving_api
from tests.integration.decider.live_decider import LiveDecider
from tests.spans import SPANS, recording_spans

TOTAL = 80 * 2**30


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    recording_spans()
    try:
        yield from serving_api(tmp_path_factory)
    finally:
        SPANS.clear()


async def running_job(api, name: str, node: str) -> str:
    """A job submitted through the api (so it has its trace), then running on `node`'s GPU 0."""
    async with httpx.AsyncClient(
        base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {api.tokens.user}"}
    ) as http:
        r = await http.post("/v1/jobs", json=api.job_spec(name))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    await sql(
        api,
        "UPDATE jobs SET status = 'running', attempt = 1, started_at = now(), placement = $2 WHERE id = $1",
        job_id,
        [{"node": node, "gpus": [0]}],
    )
    return job_id


async def sql(api, query: str, *args) -> None:
    conn = await connect(api.server.env.database_url)
    try:
        await conn.execute(query, *args)
    finally:
        await conn.close()


async def ended(api, job_id: str) -> None:
    """No executor carries the decision out: the job ends here, so the next test's decider leaves it be."""
    await sql(api, "UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job_id)


def spans_named(name: str, job_id: str) -> list:
    return [s for s in SPANS.get_finished_spans() if s.name == name and s.attributes.get("adc.job_id") == job_id]


async def test_the_decision_made_of_a_move_request_links_the_request(api, tmp_path):
    job_id = await running_job(api, "asked-to-move", "node-1")
    async with LiveDecider(api.server.env, tmp_path) as live:
        await live.node("node-1")
        await live.node("node-2")
        async with httpx.AsyncClient(
            base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {api.tokens.operator}"}
        ) as http:
            r = await http.post(f"/v1/jobs/{job_id}/migrate", json={})
            assert r.status_code == 202, r.text
            request_id = r.json()["request_id"]
        [decision] = await live.wait_for(
            lambda: [d for d in live.decisions if d.rule == "drain" and d.action.job_id == job_id],
            timeout=30,
            what="the drain rule's migrate decision",
        )
    assert decision.action.action == "migrate" and decision.action.placement[0].node == "node-2"

    [asked] = [s for s in SPANS.get_finished_spans() if s.name.endswith("/migrate") and s.name.startswith("POST")]
    [decided] = spans_named("decide migrate", job_id)
    [submitted] = spans_named("POST /v1/jobs", job_id)
    assert decided.context.trace_id == submitted.context.trace_id  # in the job's trace ...
    assert decided.context.trace_id != asked.context.trace_id  # ... which the request is not
    [link] = [x for x in decided.links if x.context.span_id == asked.context.span_id]
    assert link.context.trace_id == asked.context.trace_id
    assert link.attributes["adc.request_id"] == request_id

    rows = api.wait_audit(lambda r: r["kind"] == "decision" and r["decision_id"] == decision.decision_id)
    [row] = [r for r in rows if r["decision_id"] == decision.decision_id and r["kind"] == "decision"]
    assert row["evidence"]["request_id"] == request_id
    assert row["evidence"]["traceparent"].split("-")[2] == format(asked.context.span_id, "016x")
    await ended(api, job_id)


async def test_a_bad_traceparent_on_a_move_request_is_dropped_not_the_request(api, tmp_path):
    """The column is written by the api; a row that holds anything else still becomes a decision."""
    job_id = await running_job(api, "badly-traced", "node-5")
    await sql(
        api,
        "INSERT INTO move_requests (id, job_id, target_node, actor, reason, trace_parent)"
        " VALUES ('bad-trace', $1, NULL, 'user:ops', 'ops asked', '00-zz-01')",
        job_id,
    )
    async with LiveDecider(api.server.env, tmp_path) as live:
        await live.node("node-5")
        await live.node("node-6")
        [decision] = await live.wait_for(
            lambda: [d for d in live.decisions if d.rule == "drain" and d.action.job_id == job_id],
            timeout=30,
            what="the drain rule's migrate decision",
        )
    assert decision.action.evidence["request_id"] == "bad-trace"
    assert "traceparent" not in decision.action.evidence
    [decided] = spans_named("decide migrate", job_id)
    assert list(decided.links) == []
    await ended(api, job_id)


async def test_a_decision_triggered_by_telemetry_links_the_sample_it_acted_on(api, tmp_path):
    job_id = await running_job(api, "hungry", "node-3")
    async with LiveDecider(api.server.env, tmp_path, strategies={"oom_protection": {"for_s": 2}}) as live:
        await live.node("node-3")
        await live.node("node-4")
        collectors = {n: await live.env.bus(f"collector-{n}") for n in ("node-3", "node-4")}
        try:
            # 95 % on the job's GPU, published as a collector does, until the decider acts on it.
            decided = []
            deadline = time.monotonic() + 30
            while not decided:
                assert time.monotonic() < deadline, [(a.kind, a.reason) for a in live.audits]
                now = time.time()
                for node, used in (("node-3", 0.95), ("node-4", 0.05)):
                    gpus = [
                        GpuSample(index=i, memory_used_bytes=int(TOTAL * used), memory_total_bytes=TOTAL)
                        for i in (0, 1)
                    ]
                    await publish_sample(collectors[node], NodeMetrics(node=node, ts=now, gpus=gpus))
                await asyncio.sleep(0.5)
                decided = [d for d in live.decisions if d.rule == "oom_protection" and d.action.job_id == job_id]
            [decision] = decided
        finally:
            for bus in collectors.values():
                await bus.close()

    [hot] = decision.action.evidence["hot_gpus"]
    assert hot["gpu"] == "node-3:0" and hot["latest"] == 0.95
    sample = hot["traced_sample"]  # every publish here is sampled: the newest sample acted on is the traced one
    assert sample["node"] == "node-3" and sample["ts"] == hot["latest_ts"]
    published = [
        s
        for s in SPANS.get_finished_spans()
        if s.name == "publish metrics" and s.attributes.get("adc.node") == "node-3"
    ]
    [newest] = [s for s in published if format(s.context.span_id, "016x") == sample["traceparent"].split("-")[2]]
    [decided] = spans_named(f"decide {decision.action.action}", job_id)
    [link] = decided.links
    assert (link.context.trace_id, link.context.span_id) == (newest.context.trace_id, newest.context.span_id)
    assert link.attributes["adc.node"] == "node-3" and link.attributes["adc.ts"] == sample["ts"]

    rows = api.wait_audit(lambda r: r["kind"] == "decision" and r["decision_id"] == decision.decision_id)
    [row] = [r for r in rows if r["decision_id"] == decision.decision_id and r["kind"] == "decision"]
    assert row["evidence"]["hot_gpus"][0]["traced_sample"] == sample
    await ended(api, job_id)


async def test_a_collector_names_its_publish_span_only_when_the_publish_is_sampled(api):
    """A sample whose publish is not sampled (here: under an unsampled parent, which the default
    parent-based sampler follows) goes out without a traceparent; a sampled one names its span."""
    bus = await api.server.env.bus("collector-node-7")
    reader = await api.server.env.bus("decider")  # reads telemetry as the decider does
    received: list[NodeMetrics] = []

    async def on_sample(msg) -> None:
        received.append(NodeMetrics.decode(msg.data))

    sub = await reader.nc.subscribe(reader.subjects.metrics("node-7"), cb=on_sample)
    await reader.nc.flush()
    unsampled = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0))
    try:
        with trace.use_span(NonRecordingSpan(unsampled)):
            await publish_sample(bus, NodeMetrics(node="node-7", ts=1.0))
        await publish_sample(bus, NodeMetrics(node="node-7", ts=2.0))
        await bus.nc.flush()
        deadline = time.monotonic() + 10
        while len(received) < 2:
            assert time.monotonic() < deadline, received
            await asyncio.sleep(0.05)
    finally:
        await sub.unsubscribe()
        await bus.close()
        await reader.close()
    first, second = sorted(received, key=lambda m: m.ts)
    assert first.trace_parent is None
    [span] = [
        s for s in SPANS.get_finished_spans() if s.name == "publish metrics" and s.attributes["adc.node"] == "node-7"
    ]
    c = span.context
    assert second.trace_parent == f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
    assert c.trace_flags.sampled
