"""Every built-in rule through the engine, table-driven: it triggers, it acts once and then
cools down, and in shadow mode it decides and reports but nothing is published."""

import asyncio

import pytest

from services.decider.core import EngineCore
from services.decider.rules import (
    comm_jitter,
    defragmentation,
    elastic_scale,
    load_balance,
    oom_protection,
    priority_fifo,
    priority_scheduling,
)
from shared.infra.config import parse_config
from tests.unit.decider.builders import Cluster

RULES = {
    r.name: r
    for r in (
        oom_protection.RULE,
        priority_fifo.RULE,
        defragmentation.RULE,
        elastic_scale.RULE,
        priority_scheduling.RULE,
        comm_jitter.RULE,
        load_balance.RULE,
    )
}

# rule -> (a cluster that triggers it, the action and job expected)
CASES = {
    "oom_protection": (
        lambda: Cluster().node("a", 2).node("b", 2).job("j", {"a": (0,)}).memory("a", 0, 0.95, 40),
        ("migrate", "j"),
    ),
    "priority_fifo": (lambda: Cluster().node("a", 2).pending("j"), ("start", "j")),
    "defragmentation": (
        lambda: (
            Cluster()
            .node("a", 4)
            .node("b", 4)
            .job("j", {"a": (0,)})
            .job("big-b", {"b": (0, 1, 2)})
            .pending("large", gpus=4)
        ),
        ("migrate", "j"),
    ),
    "elastic_scale": (lambda: Cluster().node("a", 4).job("j", {"a": (0,)}, max_gpus=2), ("scale", "j")),
    "priority_scheduling": (
        lambda: Cluster().node("a", 1).job("j", {"a": (0,)}).pending("urgent", priority="high"),
        ("preempt", "j"),
    ),
    "comm_jitter": (
        lambda: (
            Cluster()
            .node("a", 2, rack="r1")
            .node("b", 2, rack="r2")
            .node("c", 4)
            .job("j", {"a": (0, 1), "b": (0, 1)}, multi_node=True)
            .comm("j", "a", [100.0] * 15)
            .comm("j", "b", [400.0] * 15)
        ),
        ("migrate", "j"),
    ),
    "load_balance": (
        lambda: (
            Cluster()
            .node("hot", 4)
            .node("cool", 4)
            .job("j", {"hot": (0,)})
            .job("other", {"hot": (1, 2)})
            .cpu("hot", 0.95)
            .cpu("cool", 0.1)
        ),
        ("migrate", "j"),
    ),
}


def config(rule: str, **controls):
    # Only the rule under test runs: the others are switched off.
    strategies = {name: {"enabled": name == rule} for name in RULES}
    strategies[rule].update(controls)
    return parse_config({"strategies": strategies}, env={})


def run(core, snapshot, cfg):
    return asyncio.run(core.evaluate(snapshot, RULES, cfg))


@pytest.mark.parametrize("rule", sorted(CASES))
def test_triggers_then_cools_down(rule):
    build, expected = CASES[rule]
    cluster = build()
    core = EngineCore()
    cfg = config(rule, cooldown_s=120)
    first = run(core, cluster.snapshot(), cfg)
    assert [(d.action.action, d.action.job_id) for d in first.decisions] == [expected], first.refused
    assert first.decisions[0].rule == rule and first.decisions[0].action.reason
    core.in_flight.clear()  # the executor refused it, say: the condition still holds
    core.last_run.clear()  # (load_balance runs once per interval)
    again = run(core, cluster.snapshot(), cfg)
    assert again.decisions == []
    if rule == "priority_scheduling":  # it sees its own cooldown and does not ask the job again; it says why
        assert again.refused == [] and "left alone" in again.pending_reason("urgent")
    else:
        assert "cooling down" in again.refused[0].why
    cluster.now += 121
    core.last_run.clear()
    later = run(core, cluster.snapshot(), cfg)
    assert [(d.action.action, d.action.job_id) for d in later.decisions] == [expected]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_shadow_mode_decides_and_reports_but_publishes_nothing(rule):
    build, expected = CASES[rule]
    core = EngineCore()
    result = run(core, build().snapshot(), config(rule, shadow=True))
    assert result.decisions == [] and core.in_flight == {}
    assert [(d.action.action, d.action.job_id, d.shadow) for d in result.shadow] == [(*expected, True)]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_disabled_rule_does_nothing(rule):
    build, _ = CASES[rule]
    result = run(EngineCore(), build().snapshot(), config(rule, enabled=False))
    assert result.decisions == [] and result.shadow == [] and result.timings_ms == {}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_new_config_takes_effect_in_the_same_engine(rule):
    """The engine keeps each rule's typed config across passes; a config swapped in (a reload, a
    schedule) must replace it at the next pass: shadow, then live, then off."""
    build, expected = CASES[rule]
    core = EngineCore()
    shadow = run(core, build().snapshot(), config(rule, shadow=True, cooldown_s=0))  # no cooldown carried over
    assert [(d.action.action, d.action.job_id) for d in shadow.shadow] == [expected] and shadow.decisions == []
    core.last_run.clear()
    live = run(core, build().snapshot(), config(rule, cooldown_s=0))
    assert [(d.action.action, d.action.job_id) for d in live.decisions] == [expected], live.refused
    core.in_flight.clear()
    core.last_run.clear()
    off = run(core, build().snapshot(), config(rule, enabled=False))
    assert off.decisions == [] and off.shadow == [] and off.timings_ms == {}
