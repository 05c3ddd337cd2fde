"""The first placement rule over built snapshots: priority, then FIFO, gang, best fit, backfill."""

from services.decider.rules.priority_fifo import decide
from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.contracts.job_status import JobStatus


def node(name, devices, free=None):
    devices = tuple(range(devices))
    return NodeView(id=name, devices=devices, free=devices if free is None else tuple(free))


def job(name, gpus=1, rank=1, at=0.0, status=JobStatus.PENDING):
    return JobView(
        id=name,
        name=name,
        status=status,
        priority="high" if rank == 0 else "low",
        priority_rank=rank,
        gpus=gpus,
        preemptible=rank > 0,
        submitted_at=at,
    )


def snap(nodes, jobs):
    return Snapshot(ts=100.0, nodes={n.id: n for n in nodes}, jobs=tuple(jobs))


def test_priority_before_fifo():
    actions, _ = decide(snap([node("a", 1)], [job("old-low", at=1), job("new-high", rank=0, at=5)]))
    assert [a.job_id for a in actions] == ["new-high"]


def test_fifo_within_a_level():
    actions, waiting = decide(snap([node("a", 1)], [job("second", at=2), job("first", at=1)]))
    assert [a.job_id for a in actions] == ["first"]
    assert "no node has 1 free" in waiting["second"]


def test_gang_whole_job_on_one_node_best_fit():
    actions, _ = decide(snap([node("big", 8), node("small", 4, free=[1, 2])], [job("j", gpus=2)]))
    assert actions[0].placement[0].node == "small"
    assert actions[0].placement[0].gpus == (1, 2)
    assert actions[0].evidence["gpus_needed"] == 2
    assert "best fit" in actions[0].reason


def test_no_partial_placement_and_backfill():
    actions, waiting = decide(
        snap([node("a", 4, free=[0, 1, 2])], [job("big", gpus=4, at=1), job("small", gpus=2, at=2)])
    )
    assert [a.job_id for a in actions] == ["small"]
    assert "big" in waiting and "most free: a with 3" in waiting["big"]


def test_devices_are_not_booked_twice_in_one_pass():
    actions, _ = decide(snap([node("a", 2)], [job("x", at=1), job("y", at=2), job("z", at=3)]))
    booked = [g for a in actions for g in a.placement[0].gpus]
    assert len(booked) == len(set(booked)) == 2


def test_edge_exact_fit_and_unschedulable_node():
    gone = NodeView(id="gone", devices=(0, 1), free=(0, 1), schedulable=False)
    actions, waiting = decide(snap([gone, node("a", 2)], [job("j", gpus=2)]))
    assert actions[0].placement[0].node == "a"
    actions, waiting = decide(snap([gone], [job("j", gpus=2)]))
    assert not actions and "j" in waiting
    actions, waiting = decide(snap([], [job("j")]))
    assert waiting["j"] == "no nodes are registered"
