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


def test_the_chain_is_keyed_so_a_rewrite_with_a_recomputed_chain_still_fails(api, trail):
    """A database superuser who alters a row and recomputes every later hash (as the unkeyed
    chain would let them) is caught: the hashes are HMACs under a key Postgres never sees."""
    from shared.infra.audit_chain import GENESIS, row_hash

    report = json.loads(api.cli("audit", "verify", "-o", "json").stdout)
    assert report["keyed"] is True
    rows = [dict(r) for r in api.server.sql("SELECT * FROM audit_events ORDER BY id")]
    rows_before = [dict(r) for r in rows]
    victim = next(r for r in rows if r["event_id"] == "verify-3:decided")
    forged, prev = [], GENESIS
    for row in rows:
        if row["id"] == victim["id"]:
            row["reason"] = "rewritten by a superuser"
        row["prev_hash"], row["hash"] = prev, row_hash(prev, row)
        prev = row["hash"]
        forged.append(row)
    _tamper(
        api,
        "UPDATE audit_events SET reason = $2, prev_hash = $3, hash = $4 WHERE id = $1",
        victim["id"],
        "rewritten by a superuser",
        victim["prev_hash"],
        row_hash(victim["prev_hash"], forged[[r["id"] for r in forged].index(victim["id"])]),
    )
    for row in forged:
        _tamper(
            api,
            "UPDATE audit_events SET prev_hash = $2, hash = $3 WHERE id = $1",
            row["id"],
            row["prev_hash"],
            row["hash"],
        )
    run = api.cli("audit", "verify")
    assert run.returncode == 1 and "altered" in run.stderr
    assert f"row #{rows[0]['id']}" in run.stderr  # the very first forged hash is already wrong under the key
    for row in rows_before:
        _tamper(
            api,
            "UPDATE audit_events SET reason = $2, prev_hash = $3, hash = $4 WHERE id = $1",
            row["id"],
            row["reason"],
            row["prev_hash"],
            row["hash"],
        )
    assert api.cli("audit", "verify").returncode == 0


def test_an_anchor_kept_outside_postgres_catches_rows_cut_from_the_end(api, tmp_path):
    anchor = tmp_path / "audit.anchor"
    api.server.publish_audit(decision("anchor", 1))
    api.wait_audit(lambda e: e["event_id"] == "anchor-1:decided")
    first = api.cli("audit", "verify", "--anchor", str(anchor))
    assert first.returncode == 0, first.stderr
    head = json.loads(anchor.read_text())
    api.server.publish_audit(decision("anchor", 2))
    api.wait_audit(lambda e: e["event_id"] == "anchor-2:decided")
    second = api.cli("audit", "verify", "--anchor", str(anchor))
    assert second.returncode == 0 and f"anchor #{head['last_id']} held" in second.stdout, second.stderr
    moved = json.loads(anchor.read_text())
    assert moved["last_id"] > head["last_id"]
    # Cut the newest rows: the shorter chain is still valid, but the anchored head is gone.
    _tamper(api, "DELETE FROM audit_events WHERE id >= $1", head["last_id"] + 1)
    plain = api.cli("audit", "verify")
    assert plain.returncode == 0  # without the anchor nothing shows
    cut = api.cli("audit", "verify", "--anchor", str(anchor))
    assert cut.returncode == 1 and f"row #{moved['last_id']} is gone" in cut.stderr, cut.stderr
    assert json.loads(anchor.read_text()) == moved  # a failed check does not move the anchor


# Last: it leaves the chain broken for the rest of the module.
def test_a_deleted_row_breaks_the_chain_at_the_next_one(api, trail):
    ids = [e["id"] for e in trail["rows"]]
    victim = next(e for e in trail["rows"] if e["event_id"] == "verify-1:decided")
    follower = ids[ids.index(victim["id"]) + 1]
    _tamper(api, "DELETE FROM audit_events WHERE id = $1", victim["id"])
    run = api.cli("audit", "verify")
    assert run.returncode == 1 and f"row #{follower}" in run.stderr and "prev_hash" in run.stderr
