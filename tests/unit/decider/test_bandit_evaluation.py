"""Off-policy evaluation on a log with known answers: logged uniformly over two arms, arm 1 pays
1 and arm 0 pays 0 (plus noise), so a policy playing arm 1 with probability p is worth p."""

from __future__ import annotations

import numpy as np

from services.decider.bandit.evaluation import evaluate, usable
from services.decider.bandit.learner import Learner

SHARED = {"log2_gpus": 1.0}
ARMS = [{"neighbours": 0.75, "left_after": 0.0}, {"neighbours": 0.0, "left_after": 0.75}]


def _log(n: int, seed: int = 4) -> list[dict]:
    rng = np.random.default_rng(seed)  # fixed: a 95 % interval misses for one log in twenty
    rows = []
    for _ in range(n):
        taken = int(rng.integers(2))
        reward = float(taken) + float(rng.normal(0, 0.1))
        rows.append({"shared": SHARED, "arms": ARMS, "taken": taken, "taken_propensity": 0.5, "reward": reward})
    return rows


def _learner(log: list[dict], epsilon: float) -> Learner:
    learner = Learner(epsilon, seed=0)
    for row in log:
        learner.learn(row["shared"], row["arms"], row["taken"], row["reward"], row["taken_propensity"])
    return learner


def test_ips_and_dr_cover_the_true_values_of_the_bandit_and_the_rules():
    log = _log(600)
    learner = _learner(log, epsilon=0.2)
    assert learner.pmf(SHARED, ARMS)[1] > 0.85  # it learned arm 1: worth 0.9 with epsilon 0.2
    result = evaluate(log, learner)
    assert result["decisions"] == result["supported"] == 600
    for name, truth in (("bandit_ips", 0.9), ("bandit_dr", 0.9), ("rules_ips", 0.0), ("rules_dr", 0.0)):
        e = result[name]
        assert e["low"] <= truth <= e["high"], (name, e)
    assert result["rules_dr"]["high"] < result["bandit_dr"]["low"]


def test_rows_that_cannot_be_evaluated_are_left_out():
    good = _log(3)
    bad = [
        {**good[0], "reward": None},  # never rewarded
        {**good[0], "taken_propensity": 0.0},
        {**good[0], "taken": 5},
        {**good[0], "arms": ARMS[:1]},
        {**good[0], "reward": float("nan")},
        {**good[0], "shared": {"g": "1; rm -rf"}},  # features are numbers, nothing else
        {**good[0], "arms": [{"x": 1.0}, "not an arm"]},
        "not a row",
    ]
    assert len(usable(good + bad)) == 3


def test_a_log_of_the_rules_alone_has_no_support():
    rules_only = [{**row, "taken": 0, "taken_propensity": 1.0} for row in _log(40)]
    assert evaluate(rules_only, _learner(_log(40), epsilon=0.2))["supported"] == 0
