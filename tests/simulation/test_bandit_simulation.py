"""The bandit in the simulator's EngineCore, on the 300-job fixture with the step model on: in shadow
it changes nothing the decider decides or says (the digest equals adc's) while it learns from the
rules' outcomes; active, it acts only within its bounds and every reward joins its own decision."""

from __future__ import annotations

import pytest

from shared.infra.config import load_config
from sim.cluster import Topology
from sim.policies import policy_config
from sim.simulator import SimOptions, Simulation
from sim.step_model import StepModel
from sim.traces import read_trace
from sim.workload import Enrichment, enrich

GPUS = 64
HOUR = 3600.0


@pytest.fixture(scope="module")
def specs(small_trace):
    return enrich(read_trace(small_trace), 8, Enrichment())


def _run(specs, policy: str):
    options = SimOptions(step_model=StepModel(), digest=True)
    return Simulation(specs, Topology(GPUS), policy_config(load_config(), policy), policy, options).run()


def test_shadow_changes_nothing_decided_and_learns(specs):
    adc, shadow = _run(specs, "adc"), _run(specs, "adc-bandit-shadow")
    assert shadow.digest == adc.digest  # every decision and pending reason, pass by pass
    stats = shadow.bandit.stats
    assert stats.decisions > 50 and stats.rewarded > 0 and stats.acted == 0
    assert shadow.bandit.learner.version == stats.rewarded
    assert all(log.taken == 0 and log.taken_prob == 1.0 for log in shadow.bandit.history)


def test_active_acts_within_its_bounds_and_rewards_join_their_decisions(specs):
    active = _run(specs, "adc-bandit")
    policy = active.bandit
    history = policy.history
    assert policy.stats.acted == len(history) > 50 and any(log.taken != 0 for log in history)
    preemptible = {s.id: s.preemptible for s in specs}
    assert all(preemptible[log.job_id] for log in history)  # never a job that is not preemptible
    explored = sorted(log.ts for log in history if log.explored)
    assert explored and all(
        sum(1 for t in explored if start <= t < start + HOUR) <= policy.config.explore_per_hour for start in explored
    )
    per_job: dict[str, list[float]] = {}
    for log in history:
        per_job.setdefault(log.job_id, []).append(log.ts)
    for times in per_job.values():  # never twice on one job within its cooldown
        assert all(b - a >= policy.config.cooldown_s for a, b in zip(times, times[1:]))
    rewarded = [log for log in history if log.reward is not None]
    assert rewarded and len({log.decision_id for log in rewarded}) == len(rewarded)
    assert policy.learner.version == len(rewarded)


def test_a_logging_shadow_draws_within_its_budget_with_true_propensities(specs):
    base = policy_config(load_config(), "adc-bandit-shadow")
    share = 0.5
    config = base.model_copy(update={"bandit": base.bandit.model_copy(update={"shadow_explore": share})})
    result = Simulation(specs, Topology(GPUS), config, "logging", SimOptions(step_model=StepModel())).run()
    history = result.bandit.history
    drawn = [log for log in history if log.randomized]
    assert drawn and any(log.taken != 0 for log in drawn) and len(drawn) < len(history)
    for log in history:
        k = len(log.arms)
        if log.randomized:  # uniform over the arms, within the share
            expected = share / k + (1 - share if log.taken == 0 else 0.0)
        else:  # the rules' arm: under the share when the budget was left, else for certain
            expected = log.taken_prob if log.taken_prob == 1.0 else 1 - share + share / k
            assert log.taken == 0
        assert abs(log.taken_prob - expected) < 1e-9
    times = sorted(log.ts for log in drawn)
    limit = config.bandit.explore_per_hour
    assert all(sum(1 for t in times if start <= t < start + HOUR) <= limit for start in times)


def test_memory_pressure_choices_keep_their_bounds_and_their_consequences(specs):
    adc, active = _run(specs, "adc"), _run(specs, "adc-bandit")
    memory = active.bandit.memory
    history = memory.history
    assert history and all(log.point == "memory" and len(log.actions) >= 2 for log in history)
    preemptible = {s.id: s.preemptible for s in specs}
    assert all(preemptible[log.job_id] for log in history)
    assert all(log.actions[0] in ("migrate", "scale_out", "requeue") for log in history)  # the rule's own first
    rewarded = [log for log in history if log.reward is not None]
    assert rewarded and len({log.decision_id for log in rewarded}) == len(rewarded)
    assert memory.learner.version == len(rewarded)
    halved = sum(1 for log in history if log.actions[log.taken] == "halve_batch")
    assert active.counters.tunes == halved  # each halving is a tune the simulated executor carried out
    for log in rewarded:  # a halving keeps the devices and pays its slower step: log(HALVED_BATCH_STEP) and more
        if log.actions[log.taken] == "halve_batch":
            assert log.reward < -0.1
    assert active.counters.memory_spikes == adc.counters.memory_spikes
