"""A device booked by a decision in flight is taken even for a pass whose snapshot was built
before that decision was made (the decider's urgent pass runs beside its regular one): the later
pass to arbitrate cannot book it again."""

from services.decider.arbitration import Cooldowns, InFlight, Proposal, RateLimiter, arbitrate
from shared.contracts.actions import NodeGpus, Start
from tests.unit.decider.builders import Cluster


def test_a_device_booked_after_the_snapshot_is_not_booked_again():
    snap = Cluster().node("a", 2).node("b", 2).job("hot", {"a": (0,)}).pending("new", gpus=1).snapshot()
    assert 0 in snap.nodes["b"].free  # the snapshot was built before the urgent pass booked b:0
    in_flight = {"hot": InFlight("d1", "oom_protection", "migrate", snap.ts, (NodeGpus(node="b", gpus=(0,)),))}
    start = Start(job_id="new", placement=[NodeGpus(node="b", gpus=(0,))], reason="test")
    [verdict] = arbitrate(
        [Proposal("priority_fifo", start, precedence=20)], snap, in_flight, Cooldowns(), RateLimiter(10), snap.ts
    )
    assert not verdict.accepted and "device b:0 is already taken" in verdict.why
    other = Start(job_id="new", placement=[NodeGpus(node="b", gpus=(1,))], reason="test")
    [verdict] = arbitrate(
        [Proposal("priority_fifo", other, precedence=20)], snap, in_flight, Cooldowns(), RateLimiter(10), snap.ts
    )
    assert verdict.accepted
