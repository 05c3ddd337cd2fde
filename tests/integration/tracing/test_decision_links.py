"""A decision the decider makes of something that came from another trace links that trace's span:
an operator's move request (`POST /v1/jobs/{id}/migrate`). The audit row of the decision names
what it links.

The real api (with its audit sink) and a real decider run on the real NATS and Postgres; the
request's context reaches the decider only as it does between processes, in the move request's
row.
"""

from __future__ import annotations

import httpx
import pytest

from shared.infra.db import connect
from tests.integration.api.conftest import serving_api
from tests.integration.decider.live_decider import LiveDecider
from tests.spans import SPANS, recording_spans


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
