"""oom_protection over built snapshots: trigger, the edges, the fallbacks, cooldown and shadow."""

import asyncio

import pytest

from services.decider.core import EngineCore
from services.decider.rules import oom_protection
from services.decider.rules.oom_protection import OomSettings
from shared.infra.config import parse_config
from tests.unit.decider.builders import Cluster

CONFIG = OomSettings(threshold_memory_usage=0.92, for_s=30)


def cluster():
    c = Cluster().node("a", 2).node("b", 2).node("c", 2, model="A100")
    return c.job("j", {"a": (0,)})


def decide(c, config=CONFIG):
    return oom_protection.decide(c.snapshot(), config).actions


def test_hot_gpu_for_the_window_migrates_the_job_to_an_idle_node_of_the_same_model():
    [action] = decide(cluster().memory("a", 0, 0.93, 35))
    assert action.action == "migrate" and action.job_id == "j"
    assert action.placement[0].node == "b"  # c is idle too but has another GPU model
    assert "above 92% for 35 s" in action.reason
    hot = action.evidence["hot_gpus"][0]
    assert hot["gpu"] == "a:0" and hot["window"][-1] == 0.93 and hot["duration_s"] == 35


@pytest.mark.parametrize("fraction,held_s", [(0.93, 29), (0.92, 60), (0.50, 60)])
def test_no_trigger_at_the_edge(fraction, held_s):
    assert decide(cluster().memory("a", 0, fraction, held_s)) == []


def test_a_hot_gpu_nobody_holds_triggers_nothing():
    assert decide(cluster().memory("a", 1, 0.99, 60)) == []


def test_target_needs_enough_free_memory():
    # b's GPUs are busy with a stray process: not enough free memory for the job's 93 %.
    c = cluster().memory("a", 0, 0.93, 40).memory("b", 0, 0.30, 90).memory("b", 1, 0.30, 90)
    [action] = decide(c)
    assert action.action == "preempt" and "checkpoint and requeue before the crash" in action.reason
    assert any("migrate: no free GPUs" in t for t in action.evidence["tried"])


def test_idle_node_preferred_over_a_busy_one():
    c = Cluster().node("a", 2).node("b", 2).node("d", 2).job("j", {"a": (0,)}).job("other", {"b": (0,)})
    [action] = decide(c.memory("a", 0, 0.95, 40))
    assert action.placement[0].node == "d"


def test_elastic_job_scales_out_when_no_migration_target():
    c = Cluster().node("a", 4).job("j", {"a": (0, 1)}, max_gpus=4, min_gpus=1)
    c.node("b", 2).job("busy", {"b": (0, 1)})
    [action] = decide(c.memory("a", 0, 0.95, 40).memory("a", 1, 0.95, 40))
    assert action.action == "scale" and action.placement[0].node == "a"
    # 2 GPUs at 95 % -> enough GPUs that each would hold under 88 % (threshold - 2 x hysteresis): 3
    assert action.placement[0].gpus == (0, 1, 2) and action.evidence["to_gpus"] == 3


def test_scale_out_first_when_configured_and_requeue_when_auto_scale_is_off():
    c = Cluster().node("a", 4).node("b", 4).job("j", {"a": (0,)}, max_gpus=2).memory("a", 0, 0.95, 40)
    [first] = decide(c, OomSettings(for_s=30, action="scale_out"))
    assert first.action == "scale"
    [requeue] = decide(c, OomSettings(for_s=30, action="checkpoint_requeue"))
    assert requeue.action == "preempt"
    [migrate] = decide(c, OomSettings(for_s=30, action="scale_out", auto_scale=False))
    assert migrate.action == "migrate"


def test_bind_reads_controller_auto_scale():
    cfg = parse_config(
        {"controller": {"enable_auto_scale": False}, "strategies": {"oom_protection": {"for_s": 3}}}, env={}
    )
    settings = oom_protection.bind(cfg)
    assert settings.for_s == 3 and settings.auto_scale is False
    [watch] = oom_protection.watches(settings)
    assert (watch.above, watch.for_s, watch.clear_below) == (0.92, 3, pytest.approx(0.90))


def _pass(core, snap, config):
    return asyncio.run(core.evaluate(snap, {"oom_protection": oom_protection.RULE}, config))


def test_cooldown_then_acts_again_and_shadow_mode_audits_without_acting():
    cfg = parse_config({"strategies": {"oom_protection": {"for_s": 30, "cooldown_s": 120}}}, env={})
    core = EngineCore()
    c = cluster().memory("a", 0, 0.95, 40)
    first = _pass(core, c.snapshot(), cfg)
    assert [d.action.action for d in first.decisions] == ["migrate"]
    core.in_flight.clear()  # the executor refused it (say); the job is still hot
    c.now += 60
    second = _pass(core, c.memory("a", 0, 0.95, 100).snapshot(), cfg)
    assert second.decisions == [] and "cooling down" in second.refused[0].why
    c.now += 61
    third = _pass(core, c.snapshot(), cfg)
    assert [d.action.action for d in third.decisions] == ["migrate"]

    shadow_cfg = parse_config({"strategies": {"oom_protection": {"for_s": 30, "shadow": True}}}, env={})
    core = EngineCore()
    result = _pass(core, cluster().memory("a", 0, 0.95, 40).snapshot(), shadow_cfg)
    assert result.decisions == [] and [d.action.action for d in result.shadow] == ["migrate"]
    assert result.shadow[0].shadow and core.in_flight == {}
