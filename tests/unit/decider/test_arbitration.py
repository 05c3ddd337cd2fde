"""Arbitration: one action per job, no device booked twice, jobs mid-move left alone,
all-or-none groups, the cluster-wide rate limit, cooldowns, shadow proposals."""

from services.decider.arbitration import Cooldowns, InFlight, Proposal, RateLimiter, arbitrate
from shared.contracts.actions import Migrate, NodeGpus, Preempt, Scale, Start
from shared.contracts.job_status import JobStatus
from tests.unit.decider.builders import Cluster


def start(job, node, *gpus):
    return Start(job_id=job, placement=[NodeGpus(node=node, gpus=gpus)], reason="test")


def migrate(job, node, *gpus, **evidence):
    return Migrate(job_id=job, placement=[NodeGpus(node=node, gpus=gpus)], reason="test", evidence=evidence)


def preempt(job, **evidence):
    return Preempt(job_id=job, reason="test", evidence=evidence)


def judge(snapshot, *proposals, in_flight=None, cooldowns=None, limiter=None):
    verdicts = arbitrate(
        list(proposals), snapshot, in_flight or {}, cooldowns or Cooldowns(), limiter or RateLimiter(10), snapshot.ts
    )
    return {(v.proposal.rule, v.proposal.action.job_id): (v.accepted, v.why) for v in verdicts}


def cluster():
    return Cluster().node("a", 2).node("b", 2).job("hot", {"a": (0,)}).pending("new", gpus=1)


def test_two_rules_want_the_same_gpu_the_earlier_precedence_wins():
    snap = cluster().snapshot()
    out = judge(
        snap,
        Proposal("priority_fifo", start("new", "b", 0), precedence=20),
        Proposal("oom_protection", migrate("hot", "b", 0), precedence=10),
    )
    assert out[("oom_protection", "hot")] == (True, "")
    accepted, why = out[("priority_fifo", "new")]
    assert not accepted and "device b:0 is already taken in this pass" in why


def test_one_action_per_job_per_pass():
    snap = cluster().snapshot()
    out = judge(
        snap,
        Proposal("oom_protection", migrate("hot", "b", 0), precedence=10),
        Proposal("load_balance", migrate("hot", "b", 1), precedence=70),
    )
    assert out[("load_balance", "hot")][1] == "hot already has a decision in this pass, by oom_protection"


def test_a_job_mid_move_or_with_a_decision_in_flight_is_left_alone():
    snap = (
        Cluster()
        .node("a", 2)
        .node("b", 2)
        .job("moving", {"a": (0,)}, status=JobStatus.MIGRATING)
        .job("hot", {"a": (1,)})
        .snapshot()
    )
    out = judge(
        snap,
        Proposal("oom_protection", migrate("moving", "b", 0)),
        Proposal("oom_protection", migrate("hot", "b", 1)),
        in_flight={"hot": InFlight("d1", "load_balance", "migrate", snap.ts - 1)},
    )
    assert "is migrating, not running" in out[("oom_protection", "moving")][1]
    assert "still in flight" in out[("oom_protection", "hot")][1]


def test_devices_not_free_in_the_snapshot_are_refused_but_a_job_keeps_its_own():
    snap = Cluster().node("a", 4).job("x", {"a": (0,)}).job("e", {"a": (1,)}).snapshot()
    grow = Scale(job_id="e", placement=[NodeGpus(node="a", gpus=(1, 2))], reason="grow")
    steal = Scale(job_id="x", placement=[NodeGpus(node="a", gpus=(0, 1))], reason="steal")
    out = judge(snap, Proposal("elastic_scale", grow), Proposal("elastic_scale", steal))
    assert out[("elastic_scale", "e")] == (True, "")
    assert "device a:1 is not free (held by e)" in out[("elastic_scale", "x")][1]


def test_groups_are_all_or_nothing_and_one_rule_per_beneficiary():
    snap = (
        Cluster()
        .node("a", 2)
        .job("v1", {"a": (0,)})
        .job("v2", {"a": (1,)}, status=JobStatus.CHECKPOINTING)
        .pending("w", gpus=2, priority="high")
        .snapshot()
    )
    out = judge(
        snap,
        Proposal("priority_scheduling", preempt("v1", for_job="w"), precedence=50),
        Proposal("priority_scheduling", preempt("v2", for_job="w"), precedence=50),
    )
    assert not out[("priority_scheduling", "v1")][0] and "group for w refused" in out[("priority_scheduling", "v1")][1]
    snap = Cluster().node("a", 2).node("b", 1).job("v1", {"a": (0,)}).job("v2", {"a": (1,)}).pending("w", 2).snapshot()
    out = judge(
        snap,
        Proposal("defragmentation", migrate("v1", "b", 0, for_job="w"), precedence=30),
        Proposal("priority_scheduling", preempt("v2", for_job="w"), precedence=50),
    )
    assert "room for w is already being made by defragmentation" in out[("priority_scheduling", "v2")][1]


def test_cluster_wide_rate_limit_on_disruptive_actions():
    snap = (
        Cluster()
        .node("a", 4)
        .node("b", 4)
        .job("j1", {"a": (0,)})
        .job("j2", {"a": (1,)})
        .job("j3", {"a": (2,)})
        .snapshot()
    )
    limiter = RateLimiter(2)
    out = judge(
        snap, *[Proposal("load_balance", migrate(j, "b", i)) for i, j in enumerate(("j1", "j2", "j3"))], limiter=limiter
    )
    assert [out[("load_balance", j)][0] for j in ("j1", "j2", "j3")] == [True, True, False]
    assert "2 disruptive actions per minute" in out[("load_balance", "j3")][1]
    later = judge(
        snap.__class__(ts=snap.ts + 61, nodes=snap.nodes, jobs=snap.jobs),
        Proposal("load_balance", migrate("j3", "b", 2)),
        limiter=limiter,
    )
    assert later[("load_balance", "j3")][0]


def test_cooldown_is_per_rule_and_job():
    snap = cluster().snapshot()
    cooldowns = Cooldowns()
    cooldowns.start("oom_protection", "hot", snap.ts - 10, 60)
    out = judge(snap, Proposal("oom_protection", migrate("hot", "b", 0)), cooldowns=cooldowns)
    assert "cooling down for 50 s more" in out[("oom_protection", "hot")][1]
    out = judge(snap, Proposal("load_balance", migrate("hot", "b", 0)), cooldowns=cooldowns)
    assert out[("load_balance", "hot")][0]


def test_shadow_proposals_are_judged_but_take_nothing():
    snap = cluster().snapshot()
    out = judge(
        snap,
        Proposal("oom_protection", migrate("hot", "b", 0), precedence=10, shadow=True),
        Proposal("priority_fifo", start("new", "b", 0), precedence=20),
    )
    assert out[("oom_protection", "hot")][0] and out[("priority_fifo", "new")][0]


def test_routine_refusals_are_told_apart_from_ones_worth_auditing():
    snap = cluster().snapshot()
    cooldowns = Cooldowns()
    cooldowns.start("oom_protection", "hot", snap.ts, 60)
    verdicts = arbitrate(
        [Proposal("oom_protection", migrate("hot", "b", 0)), Proposal("priority_fifo", start("new", "a", 0))],
        snap,
        {},
        cooldowns,
        RateLimiter(10),
        snap.ts,
    )
    routine = {v.proposal.rule: v.routine for v in verdicts}
    assert routine == {"oom_protection": True, "priority_fifo": False}  # cooling down; device a:0 is held
