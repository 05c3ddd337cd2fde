"""The bandit's api and cli: status from the decider's stored state, the log joined to its rewards
(with the model) for `adc bandit evaluate`, and a reset that admins ask for and the audit records."""

from __future__ import annotations

import json
import time

import numpy as np

from services.decider.bandit.learner import Learner
from shared.contracts.messages import AuditEvent

SHARED = {"log2_gpus": 1.0}
ARMS = [{"neighbours": 0.75}, {"neighbours": 0.0}]


def _logged(n: int) -> tuple[Learner, list[AuditEvent]]:
    """n decisions logged uniformly over two arms (arm 1 pays 1), their rewards, and a learner of them."""
    rng = np.random.default_rng(5)
    learner, events = Learner(0.1), []
    now = time.time()
    for i in range(n):
        taken = int(rng.integers(2))
        reward = float(taken)
        learner.learn(SHARED, ARMS, taken, reward, 0.5)
        record = {
            "point": "placement",
            "mode": "active",
            "shared": SHARED,
            "arms": ARMS,
            "chosen": taken,
            "propensity": 0.5,
            "explored": True,
            "rules_arm": 0,
            "taken": taken,
            "taken_propensity": 0.5,
            "acted": True,
            "context_hash": "x",
            "model_version": i,
        }
        events.append(
            AuditEvent(
                event_id=f"b{i}:bandit",
                ts=now + i,
                source="decider",
                kind="bandit.decision",
                job_id=f"j{i}",
                decision_id=f"d{i}",
                rule="bandit",
                action="start",
                data=record,
            )
        )
        events.append(
            AuditEvent(
                event_id=f"b{i}:reward",
                ts=now + i + 0.5,
                source="decider",
                kind="bandit.reward",
                job_id=f"j{i}",
                decision_id=f"d{i}",
                rule="bandit",
                data={"reward": reward},
            )
        )
    return learner, events


def test_status_log_evaluate_and_reset(api):
    with api.client("operator") as http:
        assert http.get("/v1/bandit").json()["stored"] is False
    with api.client("admin") as http:
        assert http.post("/v1/bandit/reset", json={"reason": "x"}).status_code == 404  # nothing stored
    learner, events = _logged(120)
    stats = {
        "mode": "shadow",
        "epsilon": 0.1,
        "decisions": 120,
        "rewarded": 120,
        "mean_reward": 0.5,
        "rules_mean_reward": 0.0,
        "explored_last_hour": 3,
        "explore_per_hour": 30,
        "act_margin": 0.05,
        "act_after": 100,
    }
    api.server.sql(
        "INSERT INTO bandit_state (point, version, model, fence, stats, writer) VALUES ('placement', $1, $2, 4, $3, 'd1')",
        learner.version,
        learner.to_bytes(),
        stats,
    )
    for event in events:
        api.server.publish_audit(event)
    api.wait_audit(lambda e: e["event_id"] == "b119:reward", timeout=20)
    with api.client("operator") as http:
        status = http.get("/v1/bandit").json()
        assert status["mode"] == "shadow" and status["model_version"] == 120 and status["rules_mean_reward"] == 0.0
        points = status["points"]
        assert list(points) == ["placement", "memory", "knobs"] and points["placement"]["decisions"] == 120
        assert points["knobs"]["stored"] is False and points["memory"]["decisions"] is None
    knobs = {"decisions": 7, "acted": 5, "explored": 2, "rewarded": 6, "mean_reward": -0.25, "rules_mean_reward": -0.5}
    api.server.sql(
        "INSERT INTO bandit_state (point, version, model, fence, stats, writer) VALUES ('knobs', 6, $1, 4, $2, 'd1')",
        Learner(0.1).to_bytes(),
        knobs,
    )
    with api.client("operator") as http:
        shown_knobs = http.get("/v1/bandit").json()["points"]["knobs"]
        assert shown_knobs == {"stored": True, "model_version": 6, **knobs}
        log = http.get("/v1/bandit/log", params={"limit": 1000}).json()
        assert len(log["items"]) == 120 and log["model_version"] == 120
        assert {i["decision_id"]: i["reward"] for i in log["items"]}["d7"] == float(events[15].data["reward"])
        assert http.post("/v1/bandit/reset", json={}).status_code == 403  # admins only
    shown = api.cli("bandit", "status", token="operator")
    assert shown.returncode == 0 and "model version" in shown.stdout and "120" in shown.stdout, shown.stderr
    knob_line = next(line for line in shown.stdout.splitlines() if line.startswith("knobs "))
    assert knob_line.split() == ["knobs", "7", "5", "2", "6", "-0.2500", "-0.5000"], shown.stdout
    evaluated = api.cli("bandit", "evaluate", "-o", "json", token="operator", timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout)
    assert result["decisions"] == 120
    assert result["bandit_dr"]["low"] <= 0.95 <= result["bandit_dr"]["high"]  # arm 1 with probability 0.95
    assert result["rules_dr"]["high"] < result["bandit_dr"]["low"]
    assert (result["act_margin"], result["act_after"]) == (0.05, 100)  # the stored rule, the one that would act
    # A margin no predicted gain clears: the policy plays the rules' arm but for its exploring share.
    cautious = api.cli("bandit", "evaluate", "-o", "json", "--margin", "5", token="operator", timeout=120)
    assert cautious.returncode == 0, cautious.stderr
    held = json.loads(cautious.stdout)["bandit_dr"]
    assert held["low"] <= 0.05 <= held["high"] and held["high"] < result["bandit_dr"]["low"]
    reset = api.cli("bandit", "reset", "--reason", "new hardware", token="admin")
    assert reset.returncode == 0, reset.stderr
    trail = api.wait_audit(lambda e: e["kind"] == "bandit.reset_requested")
    asked = next(e for e in trail if e["kind"] == "bandit.reset_requested")
    assert asked["actor"].startswith("admin-token") and "new hardware" in asked["reason"]
    with api.client("operator") as http:
        assert http.get("/v1/bandit").json()["reset_requested_by"].startswith("admin-token")
