"""Decision point 3, queue knobs, through the real EngineCore: arm 0 is the configured values, shadow
never changes what the rules read, an active window's setting reaches the rules and ends with the
window, exploring windows spend the hourly budget, and each window's reward joins its decision."""

from __future__ import annotations

import asyncio

import pytest

from services.decider.bandit.knob_arms import knob_arms, overlay
from services.decider.bandit.policy import BanditPolicy
from services.decider.core import EngineCore
from services.decider.plugin import Rule, RuleOutput
from shared.contracts.strategies import BanditConfig, ElasticScale, QueueOrder
from shared.infra.config import parse_config
from tests.unit.decider.builders import Cluster

CONFIG = parse_config({"strategies": {"queue_order": {"method": "shortest_remaining"}}}, env={})
WINDOW = 300.0


class Probe:
    """Rules named as the two the knobs change, proposing nothing: what each pass made them read."""

    def __init__(self) -> None:
        self.read: list[tuple] = []
        self.rules = {
            "queue_order": Rule("queue_order", self._queue, config=QueueOrder),
            "elastic_scale": Rule("elastic_scale", self._elastic, config=ElasticScale),
        }

    def _queue(self, snapshot, config):
        self.read.append((snapshot.ts, "queue_order", config.preempt, config.preempt_ratio))
        return RuleOutput([])

    def _elastic(self, snapshot, config):
        self.read.append((snapshot.ts, "elastic_scale", config.grow_levels))
        return RuleOutput([])

    def at(self, ts: float) -> dict:
        return {r[1]: r[2:] for r in self.read if r[0] == ts}


def _cluster(pending_gpus=(2, 4)) -> Cluster:
    c = Cluster()
    for name in ("a", "b"):
        c.node(name, 8)
    c.job("held", {"a": tuple(range(8)), "b": tuple(range(6))})
    for i, g in enumerate(pending_gpus):
        c.pending(f"p{i}", gpus=g, submitted=float(i))
    return c


def _bandit(mode: str, **kw) -> BanditPolicy:
    kw = {"epsilon": 1.0, "knobs": True, "knob_window_s": WINDOW, "explore_per_hour": 1000} | kw
    return BanditPolicy(BanditConfig(mode=mode, **kw))


def _run(core: EngineCore, probe: Probe, passes: int, step: float = 60.0, cluster: Cluster | None = None):
    cluster = cluster or _cluster()
    events = []
    for _ in range(passes):
        events += asyncio.run(core.evaluate(cluster.snapshot(), probe.rules, CONFIG)).bandit
        cluster.now += step
    return events


def _configured() -> dict:
    q = CONFIG.strategies.queue_order
    return {
        "queue_order": (q.preempt, q.preempt_ratio),
        "elastic_scale": (CONFIG.strategies.elastic_scale.grow_levels,),
    }


def _expected(arm_settings: dict) -> dict:
    want = _configured()
    q = arm_settings.get("queue_order", {})
    want["queue_order"] = (q.get("preempt", want["queue_order"][0]), q.get("preempt_ratio", want["queue_order"][1]))
    if "elastic_scale" in arm_settings:
        want["elastic_scale"] = (arm_settings["elastic_scale"]["grow_levels"],)
    return want


def test_arm_zero_is_the_configured_values_and_the_others_change_an_enabled_rule():
    arms = knob_arms(CONFIG)
    assert arms[0].name == "configured" and arms[0].settings == {} and overlay(CONFIG, arms[0]) is CONFIG
    assert [a.name for a in arms] == ["configured", "no_preempt", "eager_preempt", "cautious_preempt", "no_grow"]
    changed = overlay(CONFIG, arms[2]).strategies.queue_order
    assert changed.preempt_ratio == CONFIG.strategies.queue_order.preempt_ratio / 2
    assert CONFIG.strategies.queue_order.preempt_ratio == 2.0  # the operator's config is not rewritten
    fifo = parse_config(
        {"strategies": {"queue_order": {"method": "fifo"}, "elastic_scale": {"enabled": False}}}, env={}
    )
    assert [a.name for a in knob_arms(fifo)] == ["configured"]  # nothing a knob would change


def test_shadow_chooses_and_audits_but_the_rules_read_the_configured_values():
    probe, core = Probe(), EngineCore()
    core.bandit = _bandit("shadow")
    events = _run(core, probe, 40)
    decisions = [e for e in events if e.kind == "bandit.decision"]
    assert len(decisions) >= 7 and any(e.data["chosen"] != 0 for e in decisions)  # it would have changed them
    assert all(e.data["taken"] == 0 and e.data["taken_propensity"] == 1 and not e.data["acted"] for e in decisions)
    for ts in {r[0] for r in probe.read}:
        assert probe.at(ts) == _configured()
    assert core.bandit.budget.spent_total == 0


def test_an_active_window_setting_reaches_the_rules_and_ends_with_the_window():
    probe, core = Probe(), EngineCore()
    core.bandit = _bandit("active", seed=3)
    events = _run(core, probe, 60)
    windows = [(e.ts, e.data["ends_at"], e.data["settings"]) for e in events if e.kind == "bandit.decision"]
    assert len({str(w[2]) for w in windows}) >= 3  # several settings were played
    for ts in sorted({r[0] for r in probe.read}):
        start, end, settings = next(w for w in reversed(windows) if w[0] <= ts)
        assert ts < end and probe.at(ts) == _expected(settings)
    core.bandit = None  # mode off: the configured values at once
    ts = probe.read[-1][0] + 60
    cluster = _cluster()
    cluster.now = ts
    asyncio.run(core.evaluate(cluster.snapshot(), probe.rules, CONFIG))
    assert probe.at(ts) == _configured()


def test_exploring_windows_spend_the_hourly_budget():
    probe, core = Probe(), EngineCore()
    core.bandit = policy = _bandit("active", explore_per_hour=2, knob_window_s=120.0)
    events = _run(core, probe, 55)  # 55 minutes, a window every 2
    decisions = [e.data for e in events if e.kind == "bandit.decision"]
    spent = [d for d in decisions if d["explored"] and d["acted"]]
    assert len(decisions) >= 25 and len(spent) == 2 and policy.budget.spent_total == 2
    after = decisions[decisions.index(spent[-1]) + 1 :]
    assert after and all(not d["explored"] and d["propensity"] == 1.0 for d in after)


def test_the_reward_joins_its_window_decision_and_counts_the_waiting_gpu_hours():
    probe, core = Probe(), EngineCore()
    core.bandit = _bandit("shadow")
    cluster = _cluster(pending_gpus=(2, 4))  # 6 GPUs wait, on a 16-GPU cluster, throughout
    events = _run(core, probe, 11, cluster=cluster)  # two whole windows of 5 passes and one more opened
    decisions = [e for e in events if e.kind == "bandit.decision"]
    rewards = [e for e in events if e.kind == "bandit.reward"]
    assert len(decisions) == 3 and len(rewards) == 2
    for d, r in zip(decisions, rewards):
        assert r.decision_id == d.decision_id and r.data["bandit_decision"] == d.data["bandit_decision"]
        assert r.ts == d.ts + WINDOW
        assert r.data["reward"] == pytest.approx(-6 / 16)
        assert r.data["waiting_gpu_h"] == pytest.approx(6 * WINDOW / 3600)
    assert rewards[0].data["change_gpu_h"] is None and rewards[1].data["change_gpu_h"] == pytest.approx(0.0)
    stats = core.bandit.knobs.status()
    assert stats["decisions"] == 3 and stats["rewarded"] == 2 and stats["rules_mean_reward"] == pytest.approx(-6 / 16)


def test_audit_events_carry_what_the_point_chose():
    probe, core = Probe(), EngineCore()
    core.bandit = _bandit("active")
    events = _run(core, probe, 6)
    d = next(e for e in events if e.kind == "bandit.decision")
    data = d.data
    assert data["point"] == "knobs" and len(data["context_hash"]) == 16 and d.decision_id
    assert data["actions"][0] == "configured" and len(data["arms"]) == len(data["actions"]) == 5
    assert set(data["shared"]) >= {"pending_demand", "utilization", "elastic_share", "preemptible_share"}
    assert 0 < data["propensity"] <= 1 and data["taken"] == data["chosen"] and data["acted"]
    assert d.action == data["actions"][data["taken"]] and "ends_at" in data and "settings" in data
    r = next(e for e in events if e.kind == "bandit.reward")
    assert r.data["point"] == "knobs" and r.data["taken"] == data["taken"] and r.decision_id == d.decision_id


def test_with_knobs_off_nothing_is_chosen_and_status_shows_every_point():
    probe, core = Probe(), EngineCore()
    core.bandit = _bandit("active", knobs=False)
    assert not _run(core, probe, 12)
    assert all(probe.at(ts) == _configured() for ts in {r[0] for r in probe.read})
    status = core.bandit.status(0.0)
    assert {"memory", "knobs"} <= set(status) and status["knobs"]["decisions"] == 0
