"""Off-policy evaluation: from logged choices (context, arms, the arm taken, the logging policy's
propensity of it, the reward), the value the learned policy would reach and the value of the
rules (always arm 0), before anyone switches the bandit to act.

Two estimators, each with a 95 % normal confidence interval over the per-decision terms:
- IPS (inverse propensity scoring): mean of pi(a|x) / mu(a|x) x r; unbiased where the logging
  policy gave every arm pi plays a chance (support). The rules are deterministic: a plain shadow
  log has mu = 1 for the rules' arm and 0 elsewhere, so IPS sees only the rules' arm. With
  `shadow_explore` s, a start with budget left is logged under mu = (1 - s) + s / K for the rules'
  arm and s / K for each other, and IPS is unbiased over those; `supported` counts them.
- DR (doubly robust): mean of sum_a pi(a|x) r_hat(x, a) + pi(a|x) / mu(a|x) (r - r_hat(x, a)),
  with r_hat vowpalwabbit's cost regression (learner.RewardModel) cross-fitted on two halves
  of the log, so no term's estimate saw its own reward.
pi is the learner's distribution as `active` plays it: its exploration included, and its greedy
share on the rules' arm unless the learner is confident (learner.conservative, with the
`act_margin` and `act_after` in force), so the estimate is of the policy that would really act.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.decider.bandit.learner import Learner, RewardModel

Z95 = 1.959964


def _interval(terms: Sequence[float]) -> dict[str, float | None]:
    n = len(terms)
    if n == 0:
        return {"value": None, "low": None, "high": None}
    mean = sum(terms) / n
    var = sum((t - mean) ** 2 for t in terms) / (n - 1) if n > 1 else 0.0
    half = Z95 * math.sqrt(var / n)
    return {"value": mean, "low": mean - half, "high": mean + half}


def _features(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in value.items()
    )


def usable(logs: Iterable[Mapping[str, Any]], point: str = "placement") -> list[Mapping[str, Any]]:
    """The logged choices of one decision point that can be evaluated: rewarded, with numeric
    features for the job and two or more arms, and a positive propensity (a log read over HTTP is
    checked, not trusted)."""
    out = []
    for log in logs:
        if not isinstance(log, Mapping) or log.get("point", "placement") != point:
            continue
        arms, taken, prob, reward = log.get("arms"), log.get("taken"), log.get("taken_propensity"), log.get("reward")
        if not isinstance(arms, list) or len(arms) < 2 or not isinstance(taken, int) or not 0 <= taken < len(arms):
            continue
        if not _features(log.get("shared")) or not all(_features(arm) for arm in arms):
            continue
        if not isinstance(prob, (int, float)) or not 0 < prob <= 1 or not isinstance(reward, (int, float)):
            continue
        if not math.isfinite(reward):
            continue
        out.append(log)
    return out


def _reward_models(logs: Sequence[Mapping[str, Any]], seed: int) -> list[RewardModel]:
    """Two reward models, each fitted on the other half of the log (cross-fitting)."""
    models = [RewardModel(seed), RewardModel(seed + 1)]
    for i, log in enumerate(logs):
        models[1 - i % 2].learn(log["shared"], log["arms"], log["taken"], log["reward"], log["taken_propensity"])
    return models


def evaluate(
    logs: Iterable[Mapping[str, Any]],
    learner: Learner,
    seed: int = 0,
    point: str = "placement",
    margin: float = 0.0,
    after: int = 0,
) -> dict[str, Any]:
    """IPS and DR estimates (value, 95 % interval) of the learned policy, played with `margin` and
    `after` (`bandit.act_margin`, `bandit.act_after`), and of the rules."""
    rows = usable(logs, point)
    models = _reward_models(rows, seed)
    terms: dict[str, list[float]] = {"bandit_ips": [], "bandit_dr": [], "rules_ips": [], "rules_dr": []}
    for i, log in enumerate(rows):
        shared, arms, a, mu, r = log["shared"], log["arms"], log["taken"], log["taken_propensity"], log["reward"]
        pi = learner.pmf(shared, arms, margin, after)
        rules = [1.0] + [0.0] * (len(arms) - 1)
        r_hat = models[i % 2].rewards(shared, arms)
        for name, policy in (("bandit", pi), ("rules", rules)):
            weight = policy[a] / mu
            terms[f"{name}_ips"].append(weight * r)
            terms[f"{name}_dr"].append(sum(p * q for p, q in zip(policy, r_hat)) + weight * (r - r_hat[a]))
    logged = [log["reward"] for log in rows]
    return {
        "decisions": len(rows),
        "supported": sum(1 for log in rows if log["taken_propensity"] < 1),
        "act_margin": margin,
        "act_after": after,
        "logged_mean_reward": _interval(logged)["value"],
        **{name: _interval(values) for name, values in terms.items()},
    }


def learner_from(model: bytes | None, epsilon: float, version: int = 0) -> Learner:
    return Learner(epsilon, model=model, version=version)
