"""Submissions that arrive together are stored in one transaction (services/api/jobs.py GroupCommit):
each job is still admitted as if alone, every job answered 201 is in Postgres with its audit row, and
a token changed behind the api's back (SQL) stops working at once despite the api's token cache."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from services.api.auth import TOKEN_CACHE_S, create_token
from shared.contracts.messages import AuditEvent
from shared.infra.db import connect

from .conftest import serving_api


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    yield from serving_api(tmp_path_factory)


def _committer(api):
    return api.server.server.config.app.state.group_commit


def _submit_together(api, token: str, count: int, prefix: str) -> list[httpx.Response]:
    secret = api.tokens.for_role(token)

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60
        ) as http:
            return await asyncio.gather(
                *(http.post("/v1/jobs", json=api.job_spec(f"{prefix}-{i}")) for i in range(count))
            )

    return asyncio.run(go())


def test_concurrent_submissions_against_a_quota_of_n_accept_exactly_n(api):
    with api.client("admin") as http:
        r = http.put("/v1/quotas/alpha", json={"max_gpus": 5, "over_quota": "refuse"})
        assert r.status_code == 200, r.text
    try:
        answers = _submit_together(api, "user", 24, "quota")
    finally:
        with api.client("admin") as http:
            http.delete("/v1/quotas/alpha")
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] * 5 + [429] * 19, codes
    accepted = {r.json()["id"] for r in answers if r.status_code == 201}
    stored = {r["id"] for r in api.server.sql("SELECT id FROM jobs WHERE team = 'alpha' AND name LIKE 'quota-%'")}
    assert stored == accepted
    assert _committer(api).largest > 1, "the submissions were never stored together"


def test_every_job_answered_201_is_stored_with_its_audit_row_and_team(api):
    answers = _submit_together(api, "other_user", 40, "together")
    assert {r.status_code for r in answers} == {201}, [r.text for r in answers if r.status_code != 201][:3]
    ids = {r.json()["id"] for r in answers}
    rows = api.server.sql("SELECT id, team, trace_parent FROM jobs WHERE id = ANY($1::text[])", list(ids))
    assert {r["id"] for r in rows} == ids and {r["team"] for r in rows} == {"beta"}
    assert _committer(api).largest > 1
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        audited = api.server.sql(
            "SELECT job_id, team FROM audit_events WHERE kind = 'job.submitted' AND job_id = ANY($1::text[])",
            list(ids),
        )
        if len(audited) == len(ids):
            break
        time.sleep(0.1)
    assert {r["job_id"] for r in audited} == ids
    assert {r["team"] for r in audited} == {"beta"}  # the sink's, from the event: the job may not be committed
    with api.client("other_user") as http:  # a user's view is by that column
        mine = http.get("/v1/audit", params={"kind": "job.submitted", "limit": 1000}).json()["items"]
    assert ids <= {e["job_id"] for e in mine}


def test_a_later_event_of_a_job_is_its_teams_and_hidden_from_others(api):
    job = api.submit("user", name="later-event")
    api.server.publish_audit(
        AuditEvent(
            event_id=f"{job['id']}:running-test",
            ts=time.time(),
            source="executor",
            kind="job.running",
            job_id=job["id"],
            reason="moved by the executor",
        )
    )
    api.wait_audit(lambda e: e["event_id"] == f"{job['id']}:running-test")
    assert api.server.sql("SELECT team FROM audit_events WHERE event_id = $1", f"{job['id']}:running-test")[0][
        "team"
    ] == ("alpha")
    with api.client("user") as http:
        assert job["id"] in {e["job_id"] for e in http.get("/v1/audit", params={"job_id": job["id"]}).json()["items"]}
    with api.client("other_user") as http:
        assert http.get("/v1/audit", params={"job_id": job["id"]}).json()["items"] == []


def test_a_token_revoked_in_sql_stops_working_without_waiting_for_the_cache(api):
    async def make() -> tuple[str, str]:
        conn = await connect(api.server.env.database_url)
        try:
            return await create_token(conn, "cached", "user", "alpha")
        finally:
            await conn.close()

    cache = api.server.server.config.app.state.tokens
    cache.ttl_s = 3600.0  # only the change's notification can end it now
    try:
        token_id, secret = asyncio.run(make())
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as http:
            assert http.get("/v1/me").status_code == 200
            assert cache._rows, "the token was not cached"
            api.server.sql("UPDATE api_tokens SET revoked_at = now() WHERE id = $1", token_id)
            deadline = time.monotonic() + 30
            while (r := http.get("/v1/me")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert r.status_code == 401 and "revoked" in r.text
    finally:
        cache.ttl_s = TOKEN_CACHE_S
