"""Publishing a pass's decisions: a pass that ends after this decider stopped leading sends none of
them (the executor would refuse their stale token anyway) and forgets them, so the next leader's
view of what is in flight is not held up by decisions that never went out."""

from __future__ import annotations

from types import SimpleNamespace

from services.decider.arbitration import InFlight
from services.decider.core import EngineCore, PassResult
from services.decider.leadership import Leadership
from services.decider.publishing import Publisher
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Preempt
from shared.contracts.messages import Decision
from shared.infra.clock import ManualClock
from shared.infra.config import parse_config


async def test_a_pass_that_ends_after_stepping_down_sends_nothing_and_forgets_its_decisions():
    config = parse_config({"leases": {"enabled": True}}, env={})
    bus = SimpleNamespace()  # a publish or an audit would fail on it: nothing may be sent
    leadership = Leadership(bus, config, ManualClock(), on_leading=lambda: None)  # its lease not (or no longer) held
    assert leadership.fenced and not leadership.leads and leadership.token is None
    core = EngineCore()
    core.in_flight["j1"] = InFlight("d1", "priority_scheduling", "preempt", 10.0)
    core.in_flight["j2"] = InFlight("d2", "drain", "preempt", 9.0)  # decided by an earlier pass: kept
    decision = Decision(
        decision_id="d1",
        ts=10.0,
        rule="priority_scheduling",
        snapshot_ts=10.0,
        action=Preempt(job_id="j1", reason="make room"),
    )
    result = PassResult(snapshot_ts=10.0, decisions=[decision])
    publisher = Publisher(bus, None, ManualClock(), core, SimpleNamespace(), leadership)
    await publisher.publish(result, Snapshot(ts=10.0))
    assert set(core.in_flight) == {"j2"}
    assert result.decisions == [decision] and decision.fence is None  # not stamped with a token it does not hold
