"""`adc audit verify` proves nothing in the audit log was changed: a row altered directly in
Postgres (by a superuser who disabled the append-only trigger) makes it fail, naming the row."""
from __future__ import annotations

import json

import pytest

from tests.integration.api.conftest import decision


@pytest.fixture(scope="module")
def trail(api):
    """Some real mutations and decisions in the log."""
    job = api.submit("user", name="verify-me")
    with api.client("operator") as http:
        assert http.post("/v1/controller/pause", json={"reason": "maintenance"}).status_code == 200
        assert http.post("/v1/controller/resume", json={}).status_code == 200
    for i in range(5):
        api.server.publish_audit(decision("verify", i))
    rows = api.wait_audit(lambda e: e["event_id"] == "verify-4:decided")
    assert len(rows) >= 8
    return {"job": job, "rows": rows}


def _tamper(api, sql: str, *args) -> None:
    api.server.sql("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete")
    try:
        api.server.sql(sql, *args)
    finally:
        api.server.sql("ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update_delete")


def test_an_intact_log_verifies(api, trail):
    run = api.cli("audit", "verify")
    assert run.returncode == 0, run.stderr
    assert "intact" in run.stdout and f"{len(trail['rows'])} row(s)" in run.stdout


def test_only_admins_may_verify(api, trail):
    run = api.cli("audit", "verify", token="operator")
    assert run.returncode == 1 and "403" in run.stderr


def test_an_altered_row_fails_verification_naming_it(api, trail):
    victim = next(e for e in trail["rows"] if e["event_id"] == "verify-2:decided")
    _tamper(api, "UPDATE audit_events SET reason = 'nothing to see here' WHERE id = $1", victim["id"])
    run = api.cli("audit", "verify")
    assert run.returncode == 1
    assert f"row #{victim['id']}" in run.stderr and victim["event_id"] in run.stderr and "altered" in run.stderr
    as_json = api.cli("audit", "verify", "-o", "json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["broken"]["id"] == victim["id"]
    assert report["rows_checked"] == [e["id"] for e in trail["rows"]].index(victim["id"]) + 1
    # Putting the text back restores the chain: the hash covers content, not history.
    _tamper(api, "UPDATE audit_events SET reason = $2 WHERE id = $1", victim["id"], victim["reason"])
    assert api.cli("audit", "verify").returncode == 0


def test_a_deleted_row_breaks_the_chain_at_the_next_one(api, trail):
    ids = [e["id"] for e in trail["rows"]]
    victim = next(e for e in trail["rows"] if e["event_id"] == "verify-1:decided")
    follower = ids[ids.index(victim["id"]) + 1]
    _tamper(api, "DELETE FROM audit_events WHERE id = $1", victim["id"])
    run = api.cli("audit", "verify")
    assert run.returncode == 1 and f"row #{follower}" in run.stderr and "prev_hash" in run.stderr
