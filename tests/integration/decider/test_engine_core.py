"""The engine's pass without I/O: isolation of failing and slow rules, shadow mode, periods,
expectations in flight, and schedules switching policies by time of day."""

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from services.decider.core import EngineCore
from services.decider.plugin import Rule, RuleConfig, RuleOutput
from services.decider.rules import priority_fifo
from services.decider.schedules import ScheduledConfig, is_active
from shared.contracts.actions import Preempt
from shared.contracts.job_status import JobStatus
from shared.infra.config import AdcConfig, Schedule, parse_config
from tests.unit.decider.builders import Cluster
from tests.waits import until

PLUGINS = {"decider": {"rules_dir": "plugins"}}  # sections for rules of no built-in name (these tests' own)


class SlowConfig(RuleConfig):
    budget_ms: float = 50


def raising(snapshot, config):
    raise ZeroDivisionError("oops")


class HeldRule:
    """A rule whose call lasts until the test releases it: past its budget, whatever the load."""

    def __init__(self) -> None:
        self.release, self.ended = threading.Event(), threading.Event()

    def decide(self, snapshot, config):
        self.release.wait(60)
        self.ended.set()
        return []

    def let_go(self, core: EngineCore, name: str) -> None:
        """Release the call, and wait until the runner no longer counts rule `name` as running."""
        self.release.set()
        until(lambda: core.runner.busy_since(name) is None, f"the call of {name} ended", timeout=30)


def wrong_type(snapshot, config):
    return [{"action": "preempt", "job_id": "x"}]


def preempt_everyone(snapshot, config):
    return RuleOutput([Preempt(job_id=j.id, reason="test") for j in snapshot.running()], {"w": "because"})


def rules(**extra):
    return {
        "priority_fifo": priority_fifo.RULE,
        **{name: Rule(name=name, decide=fn, config=cfg) for name, (fn, cfg) in extra.items()},
    }


def run(core, snapshot, rule_set, config=None):
    return asyncio.run(core.evaluate(snapshot, rule_set, config or AdcConfig()))


def snapshot():
    return Cluster().node("a", 2).job("r", {"a": (0,)}).pending("w", gpus=1).snapshot()


def test_a_rule_that_raises_is_isolated_and_reported_the_others_go_on():
    result = run(EngineCore(), snapshot(), rules(broken=(raising, RuleConfig), typed=(wrong_type, RuleConfig)))
    assert [d.action.job_id for d in result.decisions] == ["w"]
    incidents = {i.rule: i for i in result.incidents}
    assert incidents["broken"].kind == "rule.error" and "ZeroDivisionError: oops" in incidents["broken"].reason
    assert "where actions (shared.contracts.actions) belong" in incidents["typed"].reason


def test_a_rule_that_overruns_its_budget_is_discarded_and_skipped_while_still_running():
    core, slow = EngineCore(), HeldRule()
    result = run(core, snapshot(), rules(slow=(slow.decide, SlowConfig)))
    assert not slow.ended.is_set()  # the pass did not wait for it
    assert [d.action.job_id for d in result.decisions] == ["w"]
    [incident] = result.incidents
    assert incident.kind == "rule.overrun" and "budget of 50 ms" in incident.reason
    again = run(core, Cluster().node("a", 2).snapshot(), rules(slow=(slow.decide, SlowConfig)))
    assert again.incidents == [] and "slow" not in again.timings_ms  # still running: not started twice
    slow.let_go(core, "slow")  # and once its call has ended, it is not busy any more


def test_shadow_rule_decides_and_is_reported_but_nothing_is_published_or_expected():
    cfg = parse_config({"strategies": {"mass_preempt": {"shadow": True}}, **PLUGINS}, env={})
    core = EngineCore()
    result = run(core, snapshot(), rules(mass_preempt=(preempt_everyone, RuleConfig)), cfg)
    assert [d.action.action for d in result.shadow] == ["preempt"] and result.shadow[0].shadow
    assert [d.action.action for d in result.decisions] == ["start"]
    assert set(core.in_flight) == {"w"}
    assert result.pending["w"]["mass_preempt"] == "because"


def test_disabled_rule_does_not_run_and_a_bad_section_is_an_incident():
    cfg = parse_config(
        {"strategies": {"mass_preempt": {"enabled": False}, "typo": {"budget_ms": "soon"}}, **PLUGINS}, env={}
    )
    result = run(
        EngineCore(),
        snapshot(),
        rules(mass_preempt=(preempt_everyone, RuleConfig), typo=(preempt_everyone, RuleConfig)),
        cfg,
    )
    assert "mass_preempt" not in result.timings_ms
    assert [i.kind for i in result.incidents] == ["rule.config_error"]


def test_expectations_book_devices_until_the_executor_acts():
    core = EngineCore(decision_timeout_s=90)
    snap = snapshot()
    first = run(core, snap, rules())
    [decision] = first.decisions
    assert core.booked() == decision.action.placement
    again = run(core, snap, rules())  # the executor has not acted yet: no second start
    assert again.decisions == [] and "still in flight" in again.pending["w"]["priority_fifo"]
    assert core.resolve({"w": JobStatus.PENDING}, {}, snap.ts + 1) == []
    assert core.resolve({"w": JobStatus.SCHEDULED}, {}, snap.ts + 1) == [("w", "job is scheduled")]
    run(core, snap, rules())
    assert core.resolve({"w": JobStatus.PENDING}, {}, snap.ts + 91) == [("w", "no outcome within 90 s")]


def test_rule_period_limits_how_often_it_runs():
    calls = []

    def counting(snapshot, config):
        calls.append(snapshot.ts)
        return []

    rule = {"lb": Rule(name="lb", decide=counting, config=RuleConfig, period=lambda c: 60)}
    core = EngineCore()
    c = Cluster().node("a", 1)
    for offset in (0, 30, 61):
        c.now = 1_700_001_000.0 + offset
        run(core, c.snapshot(), rule)
    assert len(calls) == 2


def at(hhmm: str, day: int = 2) -> float:  # 2024-01-02 is a Tuesday
    h, m = map(int, hhmm.split(":"))
    return datetime(2024, 1, day, h, m, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "when,expected",
    [
        (at("21:59"), False),
        (at("22:00"), True),
        (at("03:00"), True),
        (at("05:59"), True),
        (at("06:00"), False),
    ],
)
def test_overnight_schedule_window(when, expected):
    assert is_active(Schedule(name="night", start="22:00", end="06:00"), when) is expected


def test_schedule_days_and_timezones():
    weekend = Schedule(name="weekend", start="00:00", end="00:00", days=["sat", "sun"])
    assert not is_active(weekend, at("12:00", day=5)) and is_active(weekend, at("12:00", day=6))
    paris = Schedule(name="paris-night", start="22:00", end="06:00", timezone="Europe/Paris")
    assert is_active(paris, at("21:30")) and not is_active(paris, at("05:30"))


def test_night_schedule_switches_preemption_off_and_lets_low_jobs_grow():
    cfg = parse_config(
        {
            "schedules": [
                {
                    "name": "night",
                    "start": "22:00",
                    "end": "06:00",
                    "strategies": {
                        "priority_scheduling": {"enabled": False},
                        "elastic_scale": {"grow_levels": ["low"]},
                    },
                }
            ],
            "strategies": {"elastic_scale": {"grow_levels": []}},
        },
        env={},
    )
    scheduled = ScheduledConfig(cfg)
    day, active = scheduled.at(at("12:00"))
    assert (
        active == () and day.strategies.priority_scheduling.enabled and day.strategies.elastic_scale.grow_levels == []
    )
    night, active = scheduled.at(at("23:00"))
    assert active == ("night",) and not night.strategies.priority_scheduling.enabled
    assert night.strategies.elastic_scale.grow_levels == ["low"]
    assert night.strategies.priority_scheduling.levels == day.strategies.priority_scheduling.levels


def test_a_schedule_that_would_break_a_strategy_is_refused_when_the_config_loads():
    from shared.infra.config import ConfigError

    with pytest.raises(ConfigError, match=r"schedules\.0\.strategies\.oom_protection\.for_s"):
        parse_config(
            {
                "schedules": [
                    {"name": "bad", "start": "01:00", "end": "02:00", "strategies": {"oom_protection": {"for_s": -1}}}
                ]
            },
            env={},
        )
    with pytest.raises(ConfigError, match="unknown timezone"):
        parse_config({"schedules": [{"name": "tz", "start": "01:00", "end": "02:00", "timezone": "Mars/Base"}]}, env={})


def test_rules_after_an_overrun_still_run_and_are_timed_on_their_own():
    """The rules of a pass share one thread; one that overruns is left behind and the rest go on in another."""

    def fast(snapshot, config):
        return RuleOutput([], {"w": "fast ran"})

    core, slow = EngineCore(), HeldRule()
    both = {
        **rules(slow=(slow.decide, SlowConfig)),
        "zz_fast": Rule(name="zz_fast", decide=fast, config=RuleConfig, precedence=200),
    }
    result = run(core, snapshot(), both)
    assert [i.kind for i in result.incidents] == ["rule.overrun"] and result.incidents[0].rule == "slow"
    assert result.pending["w"]["zz_fast"] == "fast ran" and "zz_fast" in result.timings_ms
    slow.let_go(core, "slow")
