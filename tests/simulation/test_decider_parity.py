"""The simulator decides with the live decider's code: on the same snapshot and config, the live
engine's own objects (its rule registry, loaded and dry-run validated as at start-up, and its
EngineCore with the threaded, budgeted RuleRunner) make exactly the decisions the simulator makes;
and a changed rule config changes both the same way."""

import asyncio
import dataclasses

import pytest

from services.decider.admission_order import admission_order
from services.decider.core import EngineCore
from services.decider.engine import DeciderEngine
from shared.infra.config import load_config
from sim.cluster import Topology
from sim.policies import policy_config
from sim.simulator import Simulation, run_sync
from sim.traces import read_trace
from sim.workload import enrich


def actions(result) -> list[dict]:
    return [d.action.model_dump(mode="json") | {"rule": d.rule} for d in result.decisions]


def ordered(snapshot, config):
    """The snapshot as the live SnapshotSource builds it for `config`: its queue order follows the config."""
    return dataclasses.replace(snapshot, order=admission_order(config, snapshot.jobs))


def live_decisions(config, snapshot) -> list[dict]:
    snapshot = ordered(snapshot, config)

    async def go():
        engine = DeciderEngine(bus=None, pool=None, config=config)  # no I/O until run(): only its parts are used
        await engine.registry.scan(engine.reloader.validate_rule)
        core = EngineCore(
            decision_timeout_s=engine.core.decision_timeout_s,
            max_disruptions_per_minute=config.decider.max_disruptions_per_minute,
        )
        return actions(await core.evaluate(snapshot, engine.registry.rules, config))

    return asyncio.run(go())


def simulated_decisions(sim: Simulation, config, snapshot) -> list[dict]:
    snapshot = ordered(snapshot, config)
    core = EngineCore(
        decision_timeout_s=sim.core.decision_timeout_s,
        max_disruptions_per_minute=config.decider.max_disruptions_per_minute,
        runner=sim.core.runner,
    )
    return actions(run_sync(core.evaluate(snapshot, sim.rules, config)))


def variants(config):
    data = config.model_dump()
    data["strategies"]["queue_order"] = {**data["strategies"]["queue_order"], "method": "las"}
    data["strategies"]["priority_fifo"]["backfill"] = "any"
    return {
        "fifo": policy_config(config, "fifo"),
        "las": policy_config(config, "las"),
        "keys": type(config).model_validate(data),
    }


@pytest.fixture(scope="module")
def moments(small_trace):
    """Moments of a simulated run, between two passes, with jobs running (progress reported) and
    waiting: the first where the shipped config decides something, and for each variant the first
    where that variant decides otherwise."""
    config = load_config()
    sim = Simulation(enrich(read_trace(small_trace), 8), Topology(32), config, "adc")
    found: dict[str, tuple] = {}
    for minute in range(24 * 60, 7 * 24 * 60, 11):
        sim.run(until=minute * 60)
        snapshot, in_force = sim.current_snapshot()
        if not (snapshot.pending() and any(j.step_time_s for j in snapshot.running())):
            continue
        mine = simulated_decisions(sim, in_force, snapshot)
        if mine:
            found.setdefault("shipped", (snapshot, in_force))
        for name, changed in variants(in_force).items():
            if name not in found and simulated_decisions(sim, changed, snapshot) != mine:
                found[name] = (snapshot, in_force)
        if len(found) == 4:
            return sim, found
    pytest.fail(f"the run never showed every case; found {sorted(found)}")


def test_same_snapshot_and_config_give_the_live_decider_and_the_simulator_the_same_decisions(moments):
    sim, found = moments
    snapshot, config = found["shipped"]
    live = live_decisions(config, snapshot)
    assert live, "a busy moment should call for decisions"
    assert simulated_decisions(sim, config, snapshot) == live


@pytest.mark.parametrize("variant", ["fifo", "las", "keys"])
def test_a_changed_rule_config_changes_both_the_same_way(moments, variant):
    sim, found = moments
    snapshot, config = found[variant]
    changed = variants(config)[variant]
    live = live_decisions(changed, snapshot)
    assert live != live_decisions(config, snapshot), f"{variant} must decide differently at this moment"
    assert simulated_decisions(sim, changed, snapshot) == live
