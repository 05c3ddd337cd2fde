"""defragmentation and elastic_scale over built snapshots: trigger, no trigger, the edges."""

import dataclasses

from services.decider.rules import defragmentation, elastic_scale
from services.decider.rules.elastic_scale import ElasticSettings
from shared.contracts.strategies import QueueOrder
from shared.infra.config import Defragmentation
from tests.unit.decider.builders import Cluster

DEFRAGMENTATION = Defragmentation()


def moves(c, config=DEFRAGMENTATION):
    out = defragmentation.decide(c.snapshot(), config)
    return [(a.job_id, [(p.node, p.gpus) for p in a.placement], a.evidence.get("for_job")) for a in out.actions], out


def fragmented():
    # 3 free devices on a, 1 on b: 4 free in all, but no node has 4 for the waiting job.
    return (
        Cluster()
        .node("a", 4)
        .node("b", 4)
        .job("small", {"a": (0,)})
        .job("big-b", {"b": (0, 1, 2)})
        .pending("large", gpus=4)
    )


def test_moves_a_small_job_so_a_large_one_fits():
    found, out = moves(fragmented())
    assert found == [("small", [("b", (3,))], "large")]
    assert "moving small" in out.pending["large"]


def test_no_defragmentation_when_the_job_fits_or_the_free_total_is_too_small():
    assert moves(Cluster().node("a", 4).job("small", {"a": (0,)}).pending("j", gpus=3))[0] == []
    c = Cluster().node("a", 4).node("b", 4).job("s", {"a": (0, 1)}).job("t", {"b": (0, 1, 2)}).pending("large", 4)
    assert moves(c)[0] == []  # 3 free in all


def test_only_small_jobs_that_lose_little_are_moved():
    assert moves(fragmented(), Defragmentation(max_move_gpus=1))[0]  # a 1-GPU job is small enough
    c = fragmented()
    c.jobs[0] = dataclasses.replace(c.jobs[0], step=5000, last_checkpoint_step=0, step_time_s=1.0)
    assert moves(c)[0] == []  # 5000 s since its checkpoint: more than max_lost_s


ELASTIC = ElasticSettings()


def scale(c, config=ELASTIC):
    out = elastic_scale.decide(c.snapshot(), config)
    return [(a.job_id, [(p.node, p.gpus) for p in a.placement]) for a in out.actions], out


def test_elastic_job_grows_into_idle_gpus_beside_it_when_nobody_waits():
    c = Cluster().node("a", 8, per_domain=4).job("e", {"a": (4,)}, min_gpus=1, max_gpus=3).job("x", {"a": (5, 6)})
    found, out = scale(c)
    assert found == [("e", [("a", (4, 7, 0))])] or found == [("e", [("a", (0, 4, 7))])]
    assert out.actions[0].evidence["to_gpus"] == 3


def test_a_job_with_no_room_beside_it_grows_by_restarting_where_there_is_room():
    # e (one node, 4 of at most 8) shares a with x; b is idle: the growth restarts e on b with 8.
    c = (
        Cluster()
        .node("a", 8)
        .node("b", 8)
        .job("e", {"a": (0, 1, 2, 3)}, min_gpus=2, max_gpus=8)
        .job("x", {"a": (4, 5, 6, 7)})
    )
    found, out = scale(c)
    assert found == [("e", [("b", (0, 1, 2, 3, 4, 5, 6, 7))])]
    assert out.actions[0].evidence["moved"] is True and "restart on b" in out.actions[0].reason
    # Room beside it for all it may take: it grows in place (no move for the same devices).
    c = Cluster().node("a", 8).node("b", 8).job("e", {"a": (0, 1, 2, 3)}, min_gpus=2, max_gpus=8)
    found, out = scale(c)
    assert found == [("e", [("a", (0, 1, 2, 3, 4, 5, 6, 7))])] and out.actions[0].evidence["moved"] is False


def test_a_job_that_restarts_elsewhere_keeps_its_old_devices_from_other_growths_in_the_same_pass():
    # e moves from a:0-3 to b (8 beats the 2 beside it); f (multi-node, on c, wants 4 more) may take only
    # a:6-7, not e's a:0-3, which e holds until it has stopped.
    c = (
        Cluster()
        .node("a", 8)
        .node("b", 8)
        .node("c", 8)
        .job("e", {"a": (0, 1, 2, 3)}, max_gpus=8, step=0, max_steps=100_000, step_time_s=1.0)
        .job("x", {"a": (4, 5)})
        .job("f", {"c": tuple(range(8))}, max_gpus=12, multi_node=True, step=0, max_steps=50_000, step_time_s=1.0)
    )
    found, _ = scale(c)
    assert found == [("e", [("b", tuple(range(8)))]), ("f", [("c", tuple(range(8))), ("a", (6, 7))])]


def test_no_growth_when_a_job_waits_for_admission_or_grow_levels_exclude_it():
    c = Cluster().node("a", 4).job("e", {"a": (0,)}, max_gpus=4).pending("next", gpus=1)
    assert scale(c)[0] == []
    c = Cluster().node("a", 4).job("e", {"a": (0,)}, max_gpus=4)
    assert scale(c, ElasticSettings(grow_levels=["high"]))[0] == []
    assert scale(c, ElasticSettings(auto_scale=False))[0] == []
    assert scale(Cluster().node("a", 4).job("rigid", {"a": (0,)}))[0] == []


def test_elastic_jobs_of_the_same_level_shrink_just_enough_for_a_waiting_job():
    c = Cluster().node("a", 8).job("e", {"a": tuple(range(8))}, min_gpus=2, max_gpus=8).pending("w", gpus=3)
    found, out = scale(c)
    assert found == [("e", [("a", (0, 1, 2, 3, 4))])]
    assert out.actions[0].evidence["for_job"] == "w"


def test_no_shrink_below_the_floor_nor_for_another_level():
    c = Cluster().node("a", 4).job("e", {"a": (0, 1, 2, 3)}, min_gpus=3, max_gpus=4).pending("w", gpus=2)
    assert scale(c)[0] == []
    c = Cluster().node("a", 4).job("e", {"a": (0, 1, 2, 3)}, min_gpus=1, priority="high").pending("w", 2)
    assert scale(c)[0] == []


def test_a_job_spanning_nodes_moves_onto_one_node_once_one_has_room_and_nobody_waits():
    from services.decider.rules.consolidate import Consolidate
    from services.decider.rules.consolidate import decide as consolidate

    c = (
        Cluster()
        .node("a", 4)
        .node("b", 4)
        .node("c", 4)
        .job("spread", {"a": (0, 1), "b": (0, 1)}, multi_node=True, step=100, max_steps=10_000, step_time_s=1.0)
        .job("x", {"a": (2, 3)})
        .job("y", {"b": (2, 3)})
    )
    moves = consolidate(c.snapshot(), Consolidate(enabled=True)).actions
    assert [(m.job_id, [(p.node, p.gpus) for p in m.placement]) for m in moves] == [("spread", [("c", (0, 1, 2, 3))])]
    assert consolidate(c.snapshot(), Consolidate(enabled=True, min_remaining_s=20_000)).actions == []  # too little left
    c.pending("w", gpus=4)
    assert consolidate(c.snapshot(), Consolidate(enabled=True)).actions == []  # the free node is the queue's


def test_under_shortest_remaining_a_peer_is_shrunk_only_for_a_job_with_less_work_left():
    from shared.contracts.strategies import QueueOrder

    srt = ElasticSettings(queue=QueueOrder(method="shortest_remaining"))

    def cluster(waiting_steps):
        return (
            Cluster()
            .node("a", 8)
            .job("e", {"a": tuple(range(8))}, min_gpus=2, max_gpus=8, step=0, max_steps=1000, step_time_s=1.0)
            .pending("w", gpus=3, max_steps=waiting_steps)
        )

    assert scale(cluster(100), srt)[0] == [("e", [("a", (0, 1, 2, 3, 4))])]  # 300 GPU-s left against 8,000
    assert scale(cluster(5000), srt)[0] == []  # 15,000 GPU-s left: shrinking e for it would slow the shorter job
    assert scale(cluster(5000))[0] == [("e", [("a", (0, 1, 2, 3, 4))])]  # without that order, as before


def test_growth_goes_first_to_the_most_work_left_and_never_where_it_cannot_repay_the_move():
    c = (
        Cluster()
        .node("a", 4)
        .job("short", {"a": (0,)}, max_gpus=2, step=990, max_steps=1000, step_time_s=1.0)
        .job("long", {"a": (1,)}, max_gpus=2, step=0, max_steps=100_000, step_time_s=1.0)
    )
    found, _ = scale(c)
    assert [job for job, _ in found] == ["long"]  # 10 s left: half of that saves less than a restart costs
    c = (
        Cluster()
        .node("a", 3)
        .job("early", {"a": (0,)}, max_gpus=2, step=0, max_steps=5_000, step_time_s=1.0, submitted=1.0)
        .job("late", {"a": (1,)}, max_gpus=2, step=0, max_steps=50_000, step_time_s=1.0, submitted=2.0)
    )
    assert [job for job, _ in scale(c)[0]] == ["late"]  # one free device: to the job with the most left


def test_shrinks_for_shortest_remaining_only_from_peers_with_more_work_and_of_the_same_level():
    queue = QueueOrder(enabled=True, method="shortest_remaining")

    def cluster():
        return (
            Cluster()
            .node("a", 4)
            .job("long", {"a": (0, 1)}, gpus=2, min_gpus=1, max_steps=10_000, step=0, step_time_s=1.0)
            .job("short", {"a": (2, 3)}, gpus=2, min_gpus=1, max_steps=10, step=0, step_time_s=1.0)
        )

    found, out = scale(cluster().pending("w", gpus=1, max_steps=100), ElasticSettings(queue=queue))
    assert found == [("long", [("a", (0,))])]  # more work left than w's; the short peer has less
    assert out.actions[0].evidence["for_job"] == "w"
    # A waiting job of a level without elastic peers shrinks nobody (other levels are priority_scheduling's).
    found, _ = scale(
        cluster().pending("h", gpus=1, priority="high", rank=0, max_steps=100), ElasticSettings(queue=queue)
    )
    assert found == []
