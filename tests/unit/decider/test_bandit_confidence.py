"""Conservative play: the learner's arm replaces the rules' (arm 0) only when the learner is confident,
having learned `act_after` outcomes and predicting a reward above arm 0's by `act_margin`; the
exploring share stays vowpalwabbit's, and off-policy evaluation values the policy that plays so."""

from __future__ import annotations

import asyncio
import math

from services.decider.bandit.evaluation import evaluate
from services.decider.bandit.learner import Learner, conservative
from services.decider.bandit.policy import BanditPolicy
from services.decider.core import EngineCore
from shared.contracts.strategies import BanditConfig
from tests.unit.decider.test_bandit import CONFIG, RULES, _cluster
from tests.unit.decider.test_bandit_evaluation import ARMS, SHARED, _learner, _log

EPSILON = 0.2


def _trained(gain: float, rounds: int = 100) -> Learner:
    """A learner that has seen arm 1 pay `gain` more than arm 0, `rounds` times each."""
    learner = Learner(EPSILON, seed=0)
    for _ in range(rounds):
        learner.learn(SHARED, ARMS, 0, 0.0, 0.5)
        learner.learn(SHARED, ARMS, 1, gain, 0.5)
    return learner


def test_the_predicted_rewards_are_the_ones_its_distribution_ranks_by():
    learner = _trained(1.0)
    pmf, rewards = learner.predict(SHARED, ARMS)
    assert pmf.index(max(pmf)) == rewards.index(max(rewards)) == 1
    assert math.isclose(rewards[1] - rewards[0], 1.0, abs_tol=0.15)  # the gain it learned


def test_a_gain_below_the_margin_leaves_the_greedy_share_on_the_rules_arm():
    learner = _trained(0.02)
    plain = learner.pmf(SHARED, ARMS)
    assert plain.index(max(plain)) == 1  # unconstrained, it would take arm 1 for a 0.02 gain
    kept = learner.pmf(SHARED, ARMS, margin=0.05)
    assert math.isclose(kept[0], 1 - EPSILON / 2, abs_tol=1e-6) and math.isclose(kept[1], EPSILON / 2, abs_tol=1e-6)
    sure = _trained(1.0).pmf(SHARED, ARMS, margin=0.05)
    assert math.isclose(sure[1], 1 - EPSILON / 2, abs_tol=1e-6)  # a clear gain is acted on


def test_the_learners_arm_waits_until_it_has_learned_enough():
    learner = _trained(1.0)
    assert learner.version == 200
    early = learner.pmf(SHARED, ARMS, margin=0.05, after=201)
    assert early[0] > early[1]  # not yet: the rules' arm
    ready = learner.pmf(SHARED, ARMS, margin=0.05, after=200)
    assert ready[1] > ready[0]
    # The swap keeps every arm's exploring share: only which arm holds the greedy share moves.
    assert sorted(early) == sorted(ready) and conservative(ready, [0.0, 1.0], 0.05, False) == early


def _confident_learner(gain: float) -> Learner:
    """A learner taught on the arms a shadow pass offers that every arm but the rules' pays `gain` more."""
    watcher = EngineCore()
    watcher.bandit = BanditPolicy(BanditConfig(mode="shadow", epsilon=1.0))
    events = [
        e
        for e in asyncio.run(watcher.evaluate(_cluster().snapshot(), RULES, CONFIG)).bandit
        if e.kind == "bandit.decision"
    ]
    assert events
    learner = Learner(0.1, seed=0)
    for _ in range(30):
        for e in events:
            shared, arms = e.data["shared"], e.data["arms"]
            for i in range(len(arms)):
                learner.learn(shared, arms, i, gain if i else 0.0, 1 / len(arms))
    return learner


def _acting(gain: float, **kw) -> list[str]:
    """The rules of the decisions an active pass publishes, with no exploration left (greedy only)."""
    core = EngineCore()
    core.bandit = BanditPolicy(BanditConfig(mode="active", epsilon=0.1, explore_per_hour=0, **kw))
    core.bandit.restore(_confident_learner(gain), None)
    return [d.rule for d in asyncio.run(core.evaluate(_cluster().snapshot(), RULES, CONFIG)).decisions]


def test_active_keeps_the_rules_placement_unless_the_learner_is_confident():
    assert "bandit" in _acting(0.02, act_margin=0.0, act_after=0)  # the old rule: any predicted gain acts
    small = _acting(0.02, act_margin=0.05, act_after=0)
    assert small and all(rule == "priority_fifo" for rule in small)  # the default margin holds a 0.02 gain back
    assert "bandit" in _acting(1.0, act_margin=0.05, act_after=0)
    unseen = _acting(1.0, act_margin=0.05, act_after=10**6)
    assert all(rule == "priority_fifo" for rule in unseen)  # confident, but it has not learned enough


def test_evaluation_values_the_policy_that_would_act():
    log = _log(600)
    learner = _learner(log, epsilon=EPSILON)  # it learned arm 1, worth 1 against arm 0's 0
    confident = evaluate(log, learner, margin=0.05)
    never = evaluate(log, learner, margin=5.0)  # no gain it predicts clears this: it plays the rules' arm
    assert confident["act_margin"] == 0.05 and never["act_margin"] == 5.0
    for name in ("bandit_ips", "bandit_dr"):
        assert confident[name]["low"] <= 1 - EPSILON / 2 <= confident[name]["high"], confident[name]
        assert never[name]["low"] <= EPSILON / 2 <= never[name]["high"], never[name]  # only its exploring share
