"""The bandit's memory-pressure point through the real EngineCore and oom_protection: its arms are
only the feasible responses, shadow never changes the rule's, the exploration budget holds under a
burst of hot jobs, a reward joins its own decision, and the audit says what was chosen and how."""

from __future__ import annotations

import asyncio
import math

from services.decider.arbitration import InFlight
from services.decider.bandit.memory_arms import memory_arms
from services.decider.bandit.memory_policy import REWARD_FLOOR
from services.decider.bandit.policy import BanditPolicy
from services.decider.core import EngineCore
from services.decider.rules import oom_protection
from services.decider.rules.oom_protection import OomSettings
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import BanditConfig
from shared.infra.config import parse_config
from tests.unit.decider.builders import Cluster

RULES = {oom_protection.RULE.name: oom_protection.RULE}
CONFIG = parse_config({}, env={})
SETTINGS = OomSettings(threshold_memory_usage=0.92, for_s=30)


def _hot(jobs: int = 1, spare: int = 1, **job) -> Cluster:
    """`jobs` nodes of 2 GPUs, each with a one-device job whose GPU is hot, and `spare` idle nodes."""
    c = Cluster()
    for i in range(jobs):
        c.node(f"n{i}", 2).job(f"j{i}", {f"n{i}": (0,)}, step=100, step_time_s=1.0, **job)
        c.memory(f"n{i}", 0, 0.95, 40)
    for i in range(spare):
        c.node(f"s{i}", 2)
    return c


def _pass(core: EngineCore, cluster: Cluster):
    return asyncio.run(core.evaluate(cluster.snapshot(), RULES, CONFIG))


def _core(mode: str, **kw) -> tuple[EngineCore, BanditPolicy]:
    core = EngineCore(max_disruptions_per_minute=100)
    core.bandit = BanditPolicy(BanditConfig(mode=mode, epsilon=1.0, **kw))  # epsilon 1: every choice explores
    return core, core.bandit


def _kinds(cluster: Cluster, job_id: str = "j0") -> list[str]:
    snap = cluster.snapshot()
    [rule] = [a for a in oom_protection.decide(snap, SETTINGS).actions if a.job_id == job_id]
    arms = memory_arms(snap.job(job_id), rule, snap, SETTINGS, set())
    return [a.kind for a in arms] if arms else []


def _memory_events(result, kind: str = "bandit.decision"):
    return [e for e in result.bandit if e.kind == kind and e.data.get("point", "memory") == "memory"]


def test_the_arms_are_only_the_feasible_responses():
    assert _kinds(_hot()) == ["migrate", "requeue", "halve_batch"]  # not elastic: no scale out
    assert _kinds(_hot(micro_batch=1)) == ["migrate", "requeue"]  # nothing to halve
    assert _kinds(_hot(spare=0)) == ["requeue", "halve_batch"]  # no target: the rule requeues, no migrate
    assert _kinds(_hot(spare=0, micro_batch=1)) == []  # one response only: no choice
    elastic = _hot(spare=0, min_gpus=1, max_gpus=2)
    assert _kinds(elastic) == ["scale_out", "requeue", "halve_batch"]
    snap = _hot().snapshot()
    [rule] = oom_protection.decide(snap, SETTINGS).actions
    [_, _, halve] = memory_arms(snap.job("j0"), rule, snap, SETTINGS, set())
    assert halve.action.action == "tune"  # the executor's restart in place, global batch kept
    assert halve.action.train_overrides == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    # A target another proposal of the pass takes is no target.
    assert "migrate" not in [
        a.kind for a in memory_arms(snap.job("j0"), halve.action, snap, SETTINGS, {("s0", 0), ("s0", 1)})
    ]


def test_a_job_that_is_not_preemptible_gets_no_bandit_choice():
    core, policy = _core("active", explore_per_hour=100, explore_per_job=5)
    result = _pass(core, _hot(jobs=3, spare=3, preemptible=False))
    assert len(result.decisions) == 3 and not _memory_events(result)
    assert all(d.action.action == "migrate" and "bandit" not in d.action.evidence for d in result.decisions)
    assert policy.memory.stats.decisions == 0


def test_shadow_never_changes_the_rules_response():
    plain = _pass(EngineCore(max_disruptions_per_minute=100), _hot(jobs=6, spare=6))
    core, policy = _core("shadow", shadow_explore=1.0, explore_per_hour=100, explore_per_job=5)
    shadow = _pass(core, _hot(jobs=6, spare=6))

    def published(result):
        return sorted((d.rule, d.action.model_dump_json()) for d in result.decisions)

    assert published(shadow) == published(plain) and len(plain.decisions) == 6
    events = _memory_events(shadow)
    assert len(events) == 6 and any(e.data["chosen"] != 0 for e in events)  # it would have chosen otherwise
    assert all(e.data["taken"] == 0 and e.data["taken_propensity"] == 1.0 and not e.data["acted"] for e in events)


def test_the_exploration_budget_holds_under_a_burst_of_hot_jobs():
    core, policy = _core("active", explore_per_hour=2, explore_per_job=1)
    result = _pass(core, _hot(jobs=10, spare=10))
    events = _memory_events(result)
    assert len(events) == 10
    spent = [e for e in events if e.data["explored"] and e.data["acted"]]
    assert len(spent) == 2 and policy.budget.spent_last_hour(result.snapshot_ts) == 2
    after = events[events.index(spent[-1]) + 1 :]  # the budget spent: the greedy arm, for certain
    assert after and all(e.data["propensity"] == 1.0 and not e.data["explored"] for e in after)


def test_the_audit_of_a_memory_decision_says_what_was_chosen_and_how():
    core, policy = _core("active", explore_per_hour=100, explore_per_job=5)
    result = _pass(core, _hot(jobs=4, spare=4))
    by_job = {d.action.job_id: d for d in result.decisions}
    events = _memory_events(result)
    assert len(events) == 4
    for e in events:
        d = by_job[e.job_id]
        assert e.decision_id == d.decision_id and d.rule == "oom_protection"
        data = e.data
        assert data["point"] == "memory" and len(data["context_hash"]) == 16
        assert data["actions"][0] == "migrate" and len(data["arms"]) == len(data["actions"]) >= 2
        assert 0 <= data["chosen"] < len(data["arms"]) and 0 < data["propensity"] <= 1
        assert isinstance(data["explored"], bool) and data["taken"] == data["chosen"]
        assert e.action == data["actions"][data["taken"]]
        kind = {"migrate": "migrate", "requeue": "preempt", "halve_batch": "tune"}[data["actions"][data["taken"]]]
        assert d.action.action == kind  # the decision is the chosen response
        assert ("exploring" if data["explored"] else "exploiting") in e.reason


def test_a_reward_joins_its_own_decision():
    core, policy = _core("active", explore_per_hour=100, explore_per_job=5)
    cluster = _hot(jobs=4, spare=4)
    core.in_flight["j0"] = InFlight("earlier", "oom_protection", "migrate", cluster.now)  # j0's is refused
    first = _pass(core, cluster)
    decided = {d.action.job_id: d for d in first.decisions}
    assert set(decided) == {"j1", "j2", "j3"}
    core.in_flight.clear()
    later = Cluster(now=first.snapshot_ts + 600)
    for i in range(4):
        later.node(f"n{i}", 2).node(f"s{i}", 2)
    # j1 runs again at 1.5 s a step, 300 steps made in the 600 s; j2 ran out of memory; j3 waits.
    later.job("j0", {"n0": (0,)}, step=700, step_time_s=1.0)
    later.job("j1", {"n1": (1,)}, attempt=1, step=400, step_time_s=1.5)
    later.job("j2", None, gpus=1, status=JobStatus.PENDING, oom_retries=1)
    later.job("j3", None, gpus=1, status=JobStatus.PENDING)
    rewards = {e.job_id: e for e in _memory_events(_pass(core, later), "bandit.reward")}
    assert set(rewards) == {"j1", "j2"}
    for job_id, e in rewards.items():
        assert e.decision_id == decided[job_id].decision_id
    lost = 600 - 300 * 1.5
    assert math.isclose(rewards["j1"].data["lost_gpu_s"], lost)
    expected = -math.log(1.5) - lost / policy.config.memory_window_s
    assert math.isclose(rewards["j1"].data["reward"], expected)
    assert rewards["j2"].data["reward"] == REWARD_FLOOR  # out of memory anyway: the worst reward
    assert policy.memory.learner.version == 2 and policy.learner.version == 0  # the placement learner untouched
    assert [logged.job_id for logged in policy.memory.pending.values()] == ["j3"]
