"""The bandit beside the rules, through the real EngineCore and priority_fifo: shadow never changes
what is published, the exploration budget holds under a burst, the bandit leaves alone the jobs it
may not touch, rewards join to the decisions they belong to, and a reload keeps the learner."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from services.decider.bandit.learner import Learner
from services.decider.bandit.policy import BanditPolicy
from services.decider.core import EngineCore
from services.decider.rules import priority_fifo
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import BanditConfig
from shared.infra.config import parse_config
from tests.unit.decider.builders import Cluster

RULES = {priority_fifo.RULE.name: priority_fifo.RULE}
CONFIG = parse_config({}, env={})


def _cluster(pending: int = 6, gpus: int = 2, now_s: float = 1000.0, **job) -> Cluster:
    """Four nodes, three of them partly used and d idle: a start has emptier and fuller nodes to choose from."""
    c = Cluster()
    c.now += now_s - 1000.0
    for name in ("a", "b", "c", "d"):
        c.node(name, 8)
    c.job("held-a", {"a": (0, 1, 2, 3)}).job("held-b", {"b": (0, 1, 2, 3, 4, 5)}).job("held-c", {"c": (0,)})
    for i in range(pending):
        c.pending(f"j{i}", gpus=gpus, submitted=float(i), **job)
    return c


def _pass(core: EngineCore, cluster: Cluster):
    return asyncio.run(core.evaluate(cluster.snapshot(), RULES, CONFIG))


def _bandit(mode: str, **kw) -> BanditPolicy:
    return BanditPolicy(BanditConfig(mode=mode, epsilon=1.0, **kw))  # epsilon 1: every choice explores


def _published(result) -> list[tuple]:
    return sorted(
        (d.rule, d.action.job_id, tuple((p.node, p.gpus) for p in d.action.placement)) for d in result.decisions
    )


def test_shadow_decides_and_audits_but_never_changes_what_is_published():
    plain = _pass(EngineCore(), _cluster())
    core = EngineCore()
    core.bandit = _bandit("shadow")
    shadow = _pass(core, _cluster())
    assert _published(shadow) == _published(plain) and plain.decisions
    assert all(d.rule == "priority_fifo" for d in shadow.decisions)
    events = [e for e in shadow.bandit if e.kind == "bandit.decision"]
    by_job = {d.action.job_id: d.decision_id for d in shadow.decisions}
    assert len(events) >= 3 and {e.job_id for e in events} <= set(by_job)  # a start with no other set has none
    for e in events:
        assert e.decision_id == by_job[e.job_id]  # joined to the rules' decision
        assert e.data["acted"] is False and e.data["taken"] == 0 and e.data["taken_propensity"] == 1.0
        assert 0 < e.data["propensity"] <= 1 and len(e.data["arms"]) >= 2 and e.data["context_hash"]
    # It did choose other arms than the rules' (so an acting shadow would have shown above).
    assert any(e.data["chosen"] != 0 for e in events)


def test_active_places_on_its_own_choice_among_feasible_sets():
    core = EngineCore()
    core.bandit = _bandit("active", explore_per_hour=100, explore_per_job=5)
    result = _pass(core, _cluster())
    moved = [d for d in result.decisions if d.rule == "bandit"]
    assert moved
    taken = [(p.node, g) for d in result.decisions for p in d.action.placement for g in p.gpus]
    assert len(taken) == len(set(taken))  # no device given twice
    held = {("a", g) for g in range(4)} | {("b", g) for g in range(6)} | {("c", 0)}
    assert not held & set(taken)
    for d in moved:
        assert sum(len(p.gpus) for p in d.action.placement) == 2 and d.action.evidence["bandit"]["explored"]


def test_the_whole_idle_node_is_an_arm_only_when_allowed():
    for keep, expected in ((True, False), (False, True)):
        core = EngineCore()
        core.bandit = _bandit("shadow", keep_idle_nodes=keep)
        [event] = [e for e in _pass(core, _cluster(pending=1)).bandit if e.kind == "bandit.decision"]
        nodes = {arm[0]["node"] for arm in event.data["placements"]}
        assert nodes >= {"a", "b", "c"} and ("d" in nodes) is expected


def test_the_exploration_budget_holds_under_a_burst():
    core = EngineCore()
    core.bandit = policy = _bandit("active", explore_per_hour=3, explore_per_job=1, cooldown_s=0)
    explored = 0
    for k in range(4):  # four passes within the hour, each with a burst of fresh 1-GPU jobs
        cluster = _cluster(pending=0, now_s=1000.0 + 60 * k)
        for i in range(8):
            cluster.pending(f"p{k}-{i}", gpus=2)
        result = _pass(core, cluster)
        core.in_flight.clear()
        explored += sum(1 for e in result.bandit if e.kind == "bandit.decision" and e.data["explored"])
        assert sum(1 for d in result.decisions if d.rule == "bandit") <= 3
    assert explored == 3 and policy.budget.spent_last_hour(_cluster().now + 240) == 3
    later = _cluster(pending=0, now_s=1000.0 + 3700)  # an hour on: the budget is back
    for i in range(8):
        later.pending(f"q{i}", gpus=2)
    result = _pass(core, later)
    assert 1 <= sum(1 for e in result.bandit if e.kind == "bandit.decision" and e.data["explored"]) <= 3


def test_it_leaves_non_preemptible_one_device_and_cooling_jobs_to_the_rules():
    core = EngineCore()
    core.bandit = _bandit("active", explore_per_hour=100, explore_per_job=5, cooldown_s=600)
    result = _pass(core, _cluster(pending=2, preemptible=False))
    assert result.decisions and not result.bandit
    assert all(d.rule == "priority_fifo" for d in result.decisions)
    core = EngineCore()
    core.bandit = _bandit("active", explore_per_hour=100, min_job_gpus=2)
    one_device = _pass(core, _cluster(pending=3, gpus=1))  # below min_job_gpus: the rules' best fit stays
    assert len(one_device.decisions) == 3 and not one_device.bandit
    core = EngineCore()
    core.bandit = _bandit("active", explore_per_hour=100, explore_per_job=5, cooldown_s=600)
    first = _pass(core, _cluster(pending=1))
    assert [e.job_id for e in first.bandit] == ["j0"]
    core.in_flight.clear()  # the start failed; j0 waits again
    assert _pass(core, _cluster(pending=1, now_s=1300.0)).bandit == []
    core.in_flight.clear()
    assert [e.job_id for e in _pass(core, _cluster(pending=1, now_s=1700.0)).bandit] == ["j0"]


def test_rewards_join_to_the_decisions_they_belong_to():
    core = EngineCore()
    core.bandit = policy = _bandit("active", explore_per_hour=100, explore_per_job=5)
    first = _pass(core, _cluster(pending=3))
    decided = {d.action.job_id: d for d in first.decisions}
    assert set(decided) == {"j0", "j1", "j2"}
    core.in_flight.clear()
    step_s = {"j0": 0.5, "j1": 2.0}  # j2 has not reported yet
    later = _cluster(pending=0, now_s=1200.0)
    for job_id, d in decided.items():
        on = {p.node: tuple(p.gpus) for p in d.action.placement}
        extra = {"attempt": 1, "step": 40, "step_time_s": step_s[job_id]} if job_id in step_s else {"attempt": 1}
        later.job(job_id, on, status=JobStatus.RUNNING, **extra)
    rewards = {e.job_id: e for e in _pass(core, later).bandit if e.kind == "bandit.reward"}
    assert set(rewards) == {"j0", "j1"}
    for job_id, e in rewards.items():
        assert e.decision_id == decided[job_id].decision_id
        assert math.isclose(e.data["reward"], -math.log(step_s[job_id] * 2))
    assert policy.learner.version == 2 and list(policy.pending.values())[0].job_id == "j2"


def test_a_report_from_before_the_decision_is_not_its_reward():
    core = EngineCore()
    core.bandit = policy = _bandit("active", explore_per_hour=100, explore_per_job=5)
    first = _pass(core, _cluster(pending=1))
    [d] = first.decisions
    core.in_flight.clear()
    later = _cluster(pending=0, now_s=1100.0)
    on = {p.node: tuple(p.gpus) for p in d.action.placement}
    later.job("j0", on, status=JobStatus.RUNNING, attempt=0, step=40, step_time_s=1.0)  # the old attempt's
    assert not [e for e in _pass(core, later).bandit if e.kind == "bandit.reward"]
    assert policy.learner.version == 0 and len(policy.pending) == 1


def test_a_reload_keeps_the_learner():
    policy = BanditPolicy(BanditConfig(mode="shadow", epsilon=0.1))
    shared, arms = {"log2_gpus": 1.0}, [{"neighbours": 0.8}, {"neighbours": 0.0}]
    for _ in range(50):
        policy.learner.learn(shared, arms, 1, 1.0, 0.5)
        policy.learner.learn(shared, arms, 0, -1.0, 0.5)
    before = policy.learner.pmf(shared, arms)
    policy.configure(BanditConfig(mode="active", epsilon=0.3, explore_per_hour=5))
    assert policy.config.mode == "active" and policy.learner.version == 100
    after = policy.learner.pmf(shared, arms)
    assert before.index(max(before)) == after.index(max(after)) == 1
    assert math.isclose(after[0], 0.15, abs_tol=1e-6)  # the new epsilon spread over two arms


def test_the_learner_round_trips_through_bytes():
    learner = Learner(0.1, seed=3)
    shared, arms = {"g": 1.0}, [{"x": 0.0}, {"x": 1.0}, {"x": 2.0}]
    for i in range(90):
        learner.learn(shared, arms, i % 3, [0.1, 1.0, 0.4][i % 3], 1 / 3)
    again = Learner(0.1, seed=3, model=learner.to_bytes(), version=learner.version)
    assert again.pmf(shared, arms) == learner.pmf(shared, arms) and again.version == 90


def test_mode_off_written_bare_in_yaml_means_off():
    import yaml

    config = parse_config(yaml.safe_load("bandit:\n  mode: off\n"), env={})
    assert config.bandit.mode == "off"
    assert parse_config(yaml.safe_load("bandit: {mode: shadow}"), env={}).bandit.mode == "shadow"


def _crowded(now_s: float = 1000.0) -> Cluster:
    """Three partly used nodes and an 8-device job that fits none of them: it waits."""
    c = Cluster()
    c.now += now_s - 1000.0
    for name in ("a", "b", "c"):
        c.node(name, 8)
    c.job("held-a", {"a": (0, 1, 2, 3)}).job("held-b", {"b": (0, 1, 2, 3, 4, 5)}).job("held-c", {"c": (0,)})
    c.pending("j0", gpus=2, submitted=0.0).pending("big", gpus=8, submitted=1.0)
    return c


def test_a_spread_placement_that_pushes_a_waiting_job_back_is_charged_its_devices():
    for seed in range(10):  # the first seed whose uniform draw spreads (arm 0 is the rules' best fit)
        core = EngineCore()
        core.bandit = _bandit("active", explore_per_hour=100, explore_per_job=5, seed=seed)
        first = _pass(core, _crowded())
        [event] = [e for e in first.bandit if e.kind == "bandit.decision"]
        if event.data["taken"] != 0:
            break
    taken = event.data["taken"]
    assert taken != 0 and event.job_id == "j0" and event.data["shared"]["log2_waiting_gang"] == math.log2(9)
    # The rules' best fit (b, 2 free) is never charged; a and c are roomier and left too small for 8.
    nodes = [arm[0]["node"] for arm in event.data["placements"]]
    assert nodes[0] == "b" and event.data["blocked"] == [0] + [8] * (len(nodes) - 1)
    [d] = [d for d in first.decisions if d.action.job_id == "j0"]
    assert d.rule == "bandit" and d.action.placement[0].node == nodes[taken]
    core.in_flight.clear()
    later = _crowded(now_s=1200.0)
    later.job("j0", {p.node: tuple(p.gpus) for p in d.action.placement}, attempt=1, step=40, step_time_s=0.5)
    [reward] = [e for e in _pass(core, later).bandit if e.kind == "bandit.reward"]
    assert math.isclose(reward.data["reward"], -math.log(0.5 * (2 + 8)))  # its 2 devices and the 8 it kept


def test_shadow_explore_draws_arms_within_the_budget_with_their_true_propensities():
    core = EngineCore()
    core.bandit = policy = _bandit("shadow", shadow_explore=1.0, explore_per_hour=3, explore_per_job=1)
    cluster = _cluster(pending=0)
    for i in range(8):
        cluster.pending(f"p{i}", gpus=2, submitted=float(i))
    result = _pass(core, cluster)
    events = [e for e in result.bandit if e.kind == "bandit.decision"]
    drawn = [e for e in events if e.data["randomized"]]
    assert len(drawn) == 3 and policy.stats.explored == 3  # the hour's budget, and no more
    for e in drawn:  # drawn uniformly: every arm, the rules' too, had 1 / arms
        assert math.isclose(e.data["taken_propensity"], 1 / len(e.data["arms"])) and e.data["acted"]
    rules_kept = {e.job_id for e in events if not e.data["randomized"]}
    assert rules_kept and all(
        e.data["taken"] == 0 and e.data["taken_propensity"] == 1.0 for e in events if e.job_id in rules_kept
    )
    by_job = {d.action.job_id: d for d in result.decisions}
    assert all(by_job[j].rule == "priority_fifo" for j in rules_kept)
    for e in drawn:  # a drawn arm other than the rules' is the placement published
        placed = [{"node": p.node, "gpus": list(p.gpus)} for p in by_job[e.job_id].action.placement]
        assert placed == e.data["placements"][e.data["taken"]]
        assert by_job[e.job_id].rule == ("bandit" if e.data["taken"] else "priority_fifo")


def test_each_arm_names_its_node_so_a_node_slower_than_its_peers_can_be_learned():
    core = EngineCore()
    core.bandit = _bandit("shadow")
    [event] = [e for e in _pass(core, _cluster(pending=1)).bandit if e.kind == "bandit.decision"]
    for arm, placement in zip(event.data["arms"], event.data["placements"], strict=True):
        assert [k for k in arm if k.startswith("node_")] == [f"node_{placement[0]['node']}"]
    # Two arms alike but for their node: the learner, told that starts on one node earn less, leaves it.
    alike = {"neighbours": 0.5, "left_after": 0.25}
    learner, rng = Learner(0.0, seed=0), np.random.default_rng(5)
    for _ in range(200):
        arms = [alike | {"node_slow": 1.0}, alike | {"node_fast": 1.0}]
        if rng.random() < 0.5:
            arms.reverse()
        taken = int(rng.integers(2))
        reward = -math.log(1.3 if "node_slow" in arms[taken] else 1.0) + float(rng.normal(0, 0.02))
        learner.learn({"log2_gpus": 1.0}, arms, taken, reward, 0.5)
    for arms in (
        [alike | {"node_slow": 1.0}, alike | {"node_fast": 1.0}],
        [alike | {"node_fast": 1.0}, alike | {"node_slow": 1.0}],
    ):
        pmf, predicted = learner.predict({"log2_gpus": 1.0}, arms)
        fast = next(i for i, arm in enumerate(arms) if "node_fast" in arm)
        assert pmf[fast] == 1.0 and predicted[fast] - predicted[1 - fast] == pytest.approx(math.log(1.3), abs=0.05)
