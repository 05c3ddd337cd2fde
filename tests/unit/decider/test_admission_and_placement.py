"""Admission (priority_fifo) and topology-aware placement over built snapshots."""

import pytest

from services.decider.free_devices import FreeDevices, counts_fit
from services.decider.placement import place
from services.decider.rules import priority_fifo
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from shared.infra.config import PriorityFifo
from shared.specs.quota import Quota
from tests.unit.decider.builders import Cluster


def starts(c, config=None):
    actions, pending = priority_fifo.decide(c.snapshot(), config)
    return {a.job_id: [(p.node, p.gpus) for p in a.placement] for a in actions}, pending


def test_one_nvlink_domain_beats_best_fit():
    # a: 2 free devices in two domains (tightest best fit); b: 4 free in one domain.
    c = Cluster().node("a", 4, per_domain=2).node("b", 4, per_domain=4)
    c.job("x", {"a": (0, 2)}).pending("j", gpus=2)
    placed, _ = starts(c)
    assert placed["j"] == [("b", (0, 1))]


def test_within_a_node_the_fullest_fitting_domain_is_used():
    c = Cluster().node("a", 8, per_domain=4).job("x", {"a": (0, 1, 2)}).pending("j", gpus=1)
    placed, _ = starts(c)
    assert placed["j"] == [("a", (3,))]  # domain 0 has 1 free: best fit inside the node


def test_multi_node_job_aggregates_fragments_in_one_rack_first():
    c = (
        Cluster()
        .node("a", 4, rack="r1")
        .node("b", 4, rack="r1")
        .node("c", 4, rack="r2")
        .node("d", 4, rack="r2")
        .job("xa", {"a": (0, 1)})
        .job("xb", {"b": (0, 1)})
        .job("xc", {"c": (0,)})
        .job("xd", {"d": (0,)})
    )
    c.pending("multi", gpus=5, multi_node=True).pending("single", gpus=5, submitted=1)
    placed, pending = starts(c)
    assert placed["multi"] == [("c", (1, 2, 3)), ("d", (1, 2))] or placed["multi"] == [("d", (1, 2, 3)), ("c", (1, 2))]
    assert "single" in pending and "no node has 5 free" in pending["single"]


def test_fragments_not_aggregated_when_disabled_but_whole_free_nodes_still_are():
    c = Cluster().node("a", 2).node("b", 2).job("x", {"b": (0,)}).pending("multi", gpus=3, multi_node=True)
    placed, pending = starts(c, PriorityFifo(aggregate_fragments=False))
    assert placed == {} and "multi" in pending  # b's free device is a fragment
    c = Cluster().node("a", 2).node("b", 2).pending("multi", gpus=4, multi_node=True)
    placed, _ = starts(c, PriorityFifo(aggregate_fragments=False))
    assert placed["multi"] == [("a", (0, 1)), ("b", (0, 1))]  # a job larger than a node is not stuck


def test_waiting_job_holds_back_lower_levels_but_not_its_own():
    c = Cluster().node("a", 4).job("x", {"a": (0, 1)})
    c.pending("big-high", gpus=4, priority="high", submitted=1)
    c.pending("small-high", gpus=1, priority="high", submitted=2)
    c.pending("small-low", gpus=1, priority="low", submitted=0)
    placed, pending = starts(c)
    assert set(placed) == {"small-high"}
    assert "held behind higher-priority job big-high" in pending["small-low"]
    placed, _ = starts(c, PriorityFifo(backfill="any"))
    assert set(placed) == {"small-high", "small-low"}


def test_job_too_big_for_any_node_does_not_hold_back_others():
    c = Cluster().node("a", 4).pending("huge", gpus=16, priority="high").pending("small", gpus=1)
    placed, pending = starts(c)
    assert set(placed) == {"small"} and "more devices than any schedulable node" in pending["huge"]


def test_team_over_queue_quota_stays_pending_with_the_reason():
    c = Cluster().node("a", 8)
    c.job("running", {"a": (0, 1)}, team="vision").pending("next", gpus=2, team="vision").pending(
        "other", gpus=2, team="nlp"
    )
    c.quotas["vision"] = Quota(team="vision", max_gpus=3)
    placed, pending = starts(c)
    assert set(placed) == {"other"}
    assert pending["next"].startswith("over quota: team vision would use 4 device(s); its quota is 3")


def test_start_evidence_and_reason_explain_the_choice():
    c = Cluster().node("a", 2).pending("j", gpus=1)
    actions, _ = priority_fifo.decide(c.snapshot())
    [a] = actions
    assert "queue position 1" in a.reason and "best fit" in a.reason and "one NVLink domain on a" in a.reason
    assert a.evidence["gpus_needed"] == 1 and a.evidence["topology"]["nvlink_domains"] == 1


@pytest.mark.parametrize(
    "free,n,expected",
    [
        ({"a": [0, 1, 2, 3]}, 4, [("a", (0, 1, 2, 3))]),
        ({"a": [0, 1, 2]}, 4, None),
        ({"a": [0, 1], "b": [0, 1]}, 3, None),  # single-node job: fragments do not add up
    ],
)
def test_gang_placement_is_all_or_nothing(free, n, expected):
    snap = Cluster().node("a", 4).node("b", 4).snapshot()
    choice = place(n, FreeDevices(free), snap.nodes)
    assert (None if choice is None else [(p.node, p.gpus) for p in choice.placement]) == expected


def test_unschedulable_nodes_are_never_used():
    c = Cluster().node("gone", 8, schedulable=False).node("a", 1).pending("j", gpus=2)
    placed, pending = starts(c)
    assert placed == {} and "j" in pending
    assert c.snapshot().job("j").status == JobStatus.PENDING


def test_placement_shortcuts_answer_as_the_full_search_does():
    """`place` answers "does not fit" from FreeDevices' kept summaries, and one-node picks are kept
    on the node views; through book and release, on copies, on mixed node sizes, domains, racks and
    an unschedulable node, it answers exactly as the full search (forced by a filter that lets every
    device through), `fits` agrees with it, and the kept summaries match fresh ones."""
    import random

    c = Cluster().node("gone", 8, schedulable=False)
    for i in range(10):
        c.node(f"n{i}", (8, 4, 2)[i % 3], per_domain=(8, 2, 4)[i % 3], rack=f"r{i // 4}")
    nodes = c.snapshot().nodes
    rng = random.Random(7)
    everything = lambda node, g: True  # noqa: E731 - a filter: the search without shortcuts
    free = FreeDevices({n: list(v.devices) for n, v in nodes.items()})
    checked = 0
    for _ in range(300):
        node = rng.choice(sorted(nodes))
        devs = tuple(sorted(rng.sample(nodes[node].devices, rng.randint(1, len(nodes[node].devices)))))
        trial = free.copy()
        (trial.book if rng.random() < 0.55 else trial.release)([NodeGpus(node=node, gpus=devs)])
        if rng.random() < 0.8:
            free = trial
        fresh = FreeDevices(free.free)
        assert (free.total(), free.most()) == (fresh.total(), fresh.most())
        for n in range(0, 40, 3):
            for multi in (False, True):
                for whole in (False, True):
                    fast = place(n, free, nodes, multi_node=multi, whole_nodes=whole)
                    full = place(n, fresh, nodes, multi_node=multi, whole_nodes=whole, eligible=everything)
                    assert fast == full
                    assert free.fits(n, nodes, multi_node=multi, whole_nodes=whole) == (full is not None)
                    checked += full is not None
    assert checked > 1000  # both answers were exercised


def test_counts_with_released_devices_answer_as_placing_on_a_copy_does():
    """`counts_with` and `counts_fit` (queue_order's test of a group of victims) count what releasing their placements
    would free, without the copy: on mixed node sizes, overlapping groups, devices already free and an
    unschedulable node, it says exactly whether `place` finds a placement on a copy released so."""
    import random

    c = Cluster().node("gone", 8, schedulable=False)
    for i in range(10):
        c.node(f"n{i}", (8, 4, 2)[i % 3], per_domain=(8, 2, 4)[i % 3], rack=f"r{i // 4}")
    nodes = c.snapshot().nodes
    rng = random.Random(11)
    names = sorted(nodes)
    fitted = 0
    for _ in range(200):
        free = FreeDevices({n: rng.sample(nodes[n].devices, rng.randint(0, len(nodes[n].devices))) for n in names})
        groups = [
            [
                NodeGpus(
                    node=node,
                    gpus=tuple(sorted(rng.sample(nodes[node].devices, rng.randint(1, len(nodes[node].devices))))),
                )
                for node in rng.sample(names, rng.randint(1, 3))
            ]
            for _ in range(rng.randint(0, 4))
        ]
        trial = free.copy()
        for placement in groups:
            trial.release(placement)
        for n in range(1, 40, 2):
            for multi in (False, True):
                expected = place(n, trial, nodes, multi_node=multi) is not None
                assert counts_fit(n, free.counts_with(nodes, groups), multi_node=multi) == expected
                fitted += expected
        # The one-sweep counts of every prefix of the group (queue_order's fewest victims) answer as `place`
        # does on a copy released by that prefix alone.
        each = free.counts_with_each(nodes, groups)
        assert len(each) == len(groups)
        for k, counts in enumerate(each, start=1):
            prefix = free.copy()
            for placement in groups[:k]:
                prefix.release(placement)
            for n in range(1, 40, 3):
                for multi in (False, True):
                    assert counts_fit(n, counts, multi_node=multi) == (
                        place(n, prefix, nodes, multi_node=multi) is not None
                    )
    assert fitted > 1000  # both answers were exercised


@pytest.mark.parametrize("backfill", ["within_level", "any"])
@pytest.mark.parametrize("aggregate", [True, False])
def test_admission_plan_answers_as_placing_every_job_in_turn(backfill, aggregate):
    """The plan places a size that did not fit only once until the next booking; on random clusters with
    many waiting jobs of few sizes it admits, keeps waiting and explains exactly as placing every pending
    job in turn does."""
    import random

    from services.decider.admission_plan import plan_admission
    from services.decider.placement import fits_anywhere
    from tests.unit.decider.test_queue_order_rule import random_cluster

    rng = random.Random(13)
    admitted_seen = waiting_seen = 0
    for _ in range(150):
        c = random_cluster(rng, nan=False)
        for j in range(rng.randint(0, 12)):  # more waiting jobs, of sizes that repeat
            c.pending(
                f"x{j}",
                gpus=rng.choice((1, 2, 4, 8, 16)),
                multi_node=rng.random() < 0.4,
                submitted=200.0 + j,
                priority="low",
                rank=2,
            )
        snap = c.snapshot()
        plan = plan_admission(snap, backfill=backfill, aggregate_fragments=aggregate)
        free = FreeDevices.of(snap)
        admitted, waiting, blocking, reasons = [], [], None, {}
        for job in snap.pending():
            if backfill == "within_level" and blocking is not None and job.priority_rank > blocking:
                continue
            choice = place(job.gpus, free, snap.nodes, multi_node=job.multi_node, whole_nodes=not aggregate)
            if choice is None:
                most_node, most = free.most()
                reasons[job.id] = f"no node has {job.gpus} free device(s) (most free: {most_node} with {most})"
                if fits_anywhere(job, snap):
                    waiting.append(job.id)
                    blocking = job.priority_rank if blocking is None else blocking
                continue
            free.book(choice.placement)
            admitted.append((job.id, choice.placement))
        assert [(a.job.id, a.choice.placement) for a in plan.admitted] == admitted
        assert [w.id for w in plan.waiting] == waiting
        for job_id in waiting:  # as free as the devices were when it was tried, not when its size first failed
            assert plan.reasons[job_id] == reasons[job_id]
        admitted_seen += len(admitted)
        waiting_seen += len(waiting)
    assert admitted_seen > 100 and waiting_seen > 100  # both answers were exercised
