"""Policies, controller pause, tokens and the ops endpoints: each change audited with its actor
(and a diff for policies), secrets shown once and never logged."""

from __future__ import annotations

import copy


def test_policy_update_is_validated_versioned_and_audited_with_a_diff(api):
    with api.client("admin") as http:
        seed = http.get("/v1/policies").json()
        assert seed["version"] == 0 and seed["policy"]["strategies"]["oom_protection"]["threshold_memory_usage"] == 0.92
        doc = copy.deepcopy(seed["policy"])
        doc["strategies"]["oom_protection"]["threshold_memory_usage"] = 0.9
        doc["controller"]["interval"] = 2
        r = http.put("/v1/policies", json={"policy": doc, "reason": "fewer OOMs", "expected_version": 0})
        assert r.status_code == 200, r.text
        changed = r.json()
        assert changed["version"] >= 1 and changed["updated_by"].startswith("admin-token")
        assert {"path": "strategies.oom_protection.threshold_memory_usage", "old": 0.92, "new": 0.9} in changed["diff"]
        assert {"path": "controller.interval", "old": 5.0, "new": 2.0} in changed["diff"]
        stale = http.put("/v1/policies", json={"policy": doc, "reason": "again", "expected_version": 0})
        assert stale.status_code == 409 and f"version {changed['version']}" in stale.text
        assert http.get("/v1/policies").json()["version"] == changed["version"]
        assert http.get("/v1/policies/history").json()["items"][0]["version"] == changed["version"]
        reload = http.post("/v1/policies/reload", json={"reason": "pick it up"})
        assert reload.status_code == 202 and reload.json()["version"] == changed["version"]
    trail = api.wait_audit(lambda e: e["kind"] == "policy.reloaded")
    updated = next(e for e in trail if e["kind"] == "policy.updated")
    assert updated["actor"].startswith("admin-token") and "fewer OOMs" in updated["reason"]
    assert {"path": "controller.interval", "old": 5.0, "new": 2.0} in updated["data"]["diff"]
    assert next(e for e in trail if e["kind"] == "policy.reloaded")["data"]["version"] == changed["version"]


def test_a_bad_policy_is_refused_naming_the_field(api):
    with api.client("admin") as http:
        doc = http.get("/v1/policies").json()["policy"]
        cases = [
            ({"strategies": {"oom_protection": {"threshold_memory_usage": 2}}}, "threshold_memory_usage"),
            ({"controller": {"intervall": 3}}, "intervall"),
            ({"controller": {"interval": "soon"}}, "interval"),
            ({"strategies": {"priority_scheduling": {"levels": []}}}, "levels"),
            ({"strategies": {"oom_protecton": {"for_s": 3}}}, "oom_protecton"),  # misspelt: no rule of that name
            (
                {
                    "schedules": [
                        {"name": "n", "start": "22:00", "end": "06:00", "strategies": {"drain": {"cooldown_s": -1}}}
                    ]
                },
                "cooldown_s",
            ),
            (doc | {"colour": "blue"}, "colour"),
        ]
        for policy, field in cases:
            r = http.put("/v1/policies", json={"policy": policy, "reason": "try"})
            assert r.status_code == 422, (policy, r.text)
            assert any(field in [str(x) for x in d["loc"]] for d in r.json()["detail"]), (field, r.json())
        assert http.put("/v1/policies", json={"policy": doc}).status_code == 422  # a reason is required
    with api.client("operator") as http:
        assert http.get("/v1/policies").status_code == 200
        assert http.put("/v1/policies", json={"policy": doc, "reason": "x"}).status_code == 403


def test_a_policy_naming_controller_oom_retries_sets_the_oom_retry_rules_budget(api):
    with api.client("admin") as http:
        # A policy written when the budget was the controller's: it names no strategies.oom_retry.max_retries.
        doc = {"controller": {"oom_retries": 4}, "strategies": {"oom_retry": {"memory_margin": 1.5}}}
        r = http.put("/v1/policies", json={"policy": doc, "reason": "more retries"})
        assert r.status_code == 200, r.text
        stored = http.get("/v1/policies").json()["policy"]
        assert stored["strategies"]["oom_retry"]["max_retries"] == 4 and "oom_retries" not in stored["controller"]
        stored["controller"]["oom_retries"] = 1
        r = http.put("/v1/policies", json={"policy": stored, "reason": "disagree"})
        assert r.status_code == 422 and "strategies.oom_retry.max_retries (4)" in r.text, r.text


def test_operators_pause_and_resume_the_controller(api):
    with api.client("user") as http:
        assert http.get("/v1/controller").json()["paused"] is False
        assert http.post("/v1/controller/pause", json={}).status_code == 403
    with api.client("operator") as http:
        paused = http.post("/v1/controller/pause", json={"reason": "network maintenance"}).json()
        assert paused["paused"] is True and paused["reason"] == "network maintenance"
        assert api.server.sql("SELECT paused FROM controller_state")[0]["paused"] is True
        assert http.post("/v1/controller/resume").json()["paused"] is False
    trail = api.wait_audit(lambda e: e["kind"] == "controller.resumed")
    pause = next(e for e in trail if e["kind"] == "controller.paused")
    assert pause["actor"].startswith("operator-token") and "network maintenance" in pause["reason"]


def test_tokens_are_shown_once_work_at_once_and_revoke_at_once(api):
    with api.client("admin") as http:
        made = http.post("/v1/tokens", json={"name": "ci-bot", "role": "user", "team": "vision", "ttl_days": 30})
        assert made.status_code == 201
        token = made.json()
        assert token["secret"].startswith("adc_") and token["expires_at"]
        listed = http.get("/v1/tokens").text
        assert token["id"] in listed and token["secret"] not in listed and "hash" not in listed
        assert http.post("/v1/tokens", json={"name": "x", "role": "root"}).status_code == 422
    with api.client(token["secret"]) as bot:
        assert bot.get("/v1/me").json() == {"token_id": token["id"], "name": "ci-bot", "role": "user", "team": "vision"}
        assert bot.get("/v1/tokens").status_code == 403
    with api.client("admin") as http:
        assert http.post(f"/v1/tokens/{token['id']}/revoke").status_code == 200
        assert http.post(f"/v1/tokens/{token['id']}/revoke").status_code == 409
    with api.client(token["secret"]) as bot:
        r = bot.get("/v1/me")
        assert r.status_code == 401 and "revoked" in r.text
    trail = api.wait_audit(lambda e: e["kind"] == "token.revoked")
    assert token["secret"] not in str(trail)
    assert api.server.sql("SELECT count(*) AS n FROM api_tokens WHERE token_hash = $1", token["secret"])[0]["n"] == 0


def test_ops_endpoints(api):
    with api.client(None) as anon:
        assert anon.get("/healthz").json() == {"ok": True}
        assert anon.get("/readyz").json() == {"ready": True, "nats": True, "postgres": True}
        anon.get("/v1/jobs")
        text = anon.get("/metrics").text
    assert 'adc_api_requests_total{method="GET",route="(not routed)",status="401"}' in text
    assert 'route="/healthz",status="200"' in text
    assert "adc_api_request_seconds_bucket" in text and "adc_api_audit_tails" in text


def test_arbitrary_methods_and_paths_do_not_grow_the_metric_series(api):
    with api.client("admin") as http:
        # A method token HTTP's parser (httptools) does not know is refused before the app sees it.
        assert http.request("BREW0", "/v1/jobs").status_code == 400
        for i, method in enumerate(("PROPFIND", "PURGE", "MKCOL", "LOCK", "UNLOCK")):
            http.request(method, "/v1/jobs")
            http.get(f"/v1/no-such-thing-{i}")
        text = http.get("/metrics").text
    assert "BREW" not in text and "PROPFIND" not in text and "no-such-thing" not in text
    assert 'adc_api_requests_total{method="other",route="/v1/jobs",status="405"} 5.0' in text
    assert 'adc_api_requests_total{method="GET",route="(not routed)",status="404"} 5.0' in text


def test_manual_actions_are_audited_with_the_manual_reason_code(api):
    """An operator's action is a decision like a rule's: its audit row names its reason code."""
    api.server.sql("INSERT INTO nodes (id, devices) VALUES ('node-m', '[]'::jsonb) ON CONFLICT DO NOTHING")
    with api.client("operator") as http:
        assert http.post("/v1/nodes/node-m/cordon").status_code == 202
    trail = api.wait_audit(lambda e: e["kind"] == "decision" and e.get("node") == "node-m")
    cordon = next(e for e in trail if e["kind"] == "decision" and e.get("node") == "node-m")
    assert cordon["rule"] == "manual" and cordon["data"]["reason_code"] == "manual"
