"""priority_scheduling: making room for a higher level, cheapest victims first."""

from services.decider.rules import priority_scheduling
from shared.contracts.job_status import JobStatus
from shared.infra.config import PriorityLevel, PriorityScheduling
from tests.unit.decider.builders import Cluster

CONFIG = PriorityScheduling()


def decide(c, config=CONFIG):
    out = priority_scheduling.decide(c.snapshot(), config)
    return [(a.action, a.job_id) for a in out.actions], out


def full_node():
    # One 4-GPU node, full of low-priority work with different amounts of progress at risk.
    return (
        Cluster()
        .node("a", 4)
        .job("costly", {"a": (0, 1)}, step=1000, last_checkpoint_step=100, step_time_s=1.0)
        .job("cheap", {"a": (2,)}, step=110, last_checkpoint_step=100, step_time_s=1.0)
        .job("cheaper", {"a": (3,)}, step=101, last_checkpoint_step=100, step_time_s=1.0)
    )


def test_preempts_the_fewest_gpu_hours_of_lost_progress_first():
    actions, out = decide(full_node().pending("urgent", gpus=2, priority="high"))
    assert actions == [("preempt", "cheaper"), ("preempt", "cheap")]
    ev = out.actions[0].evidence
    assert ev["for_job"] == "urgent" and ev["lost_gpu_hours"] < out.actions[1].evidence["lost_gpu_hours"]
    assert "making room for it" in out.pending["urgent"]


def test_drops_victims_that_turn_out_not_to_be_needed():
    actions, _ = decide(full_node().pending("urgent", gpus=1, priority="high"))
    assert actions == [("preempt", "cheaper")]


def test_newest_checkpoint_breaks_ties():
    c = (
        Cluster()
        .node("a", 2)
        .job("old-ckpt", {"a": (0,)}, last_checkpoint_at=100.0)
        .job("new-ckpt", {"a": (1,)}, last_checkpoint_at=900.0)
        .pending("urgent", gpus=1, priority="high")
    )
    assert decide(c)[0] == [("preempt", "new-ckpt")]


def test_no_trigger_when_it_fits_or_same_level_or_nothing_preemptible():
    assert decide(Cluster().node("a", 4).job("x", {"a": (0,)}).pending("urgent", 2, priority="high"))[0] == []
    assert decide(full_node().pending("peer", gpus=2, priority="low"))[0] == []
    guarded = Cluster().node("a", 2).job("vip", {"a": (0, 1)}, priority="low", preemptible=False)
    assert decide(guarded.pending("urgent", gpus=1, priority="high"))[0] == []


def test_elastic_victim_is_shrunk_to_its_floor_respecting_the_level_min_gpus():
    levels = [PriorityLevel(name="high", preemptible=False), PriorityLevel(name="low", preemptible=True, min_gpus=2)]
    config = PriorityScheduling(levels=levels)
    c = Cluster().node("a", 8).job("elastic", {"a": tuple(range(8))}, min_gpus=1, max_gpus=8)
    actions, out = decide(c.pending("urgent", gpus=4, priority="high"), config)
    assert actions == [("scale", "elastic")]
    assert out.actions[0].placement[0].gpus == (0, 1, 2, 3)  # 4 is enough: kept 4, not shrunk to 2
    actions, out = decide(
        Cluster()
        .node("a", 8)
        .job("elastic", {"a": tuple(range(8))}, min_gpus=1, max_gpus=8)
        .pending("urgent", gpus=7, priority="high"),
        config,
    )
    assert actions == [("preempt", "elastic")]  # the level's floor (2) leaves too little: preempt


def test_a_victim_is_never_taken_twice_and_freed_devices_go_to_the_first_waiting_job():
    c = (
        full_node()
        .pending("first", gpus=1, priority="high", submitted=1)
        .pending("second", 1, priority="high", submitted=2)
    )
    actions, out = decide(c)
    victims = [j for _, j in actions]
    assert len(victims) == len(set(victims)) == 2
    assert {a.evidence["for_job"] for a in out.actions} == {"first", "second"}


def test_mid_move_jobs_are_not_victims():
    c = Cluster().node("a", 1).job("moving", {"a": (0,)}, status=JobStatus.MIGRATING)
    assert decide(c.pending("urgent", gpus=1, priority="high"))[0] == []


def test_a_job_it_made_give_way_within_its_cooldown_is_left_alone_and_the_next_cheapest_asked():
    snapshot = full_node().pending("urgent", gpus=1, priority="high").snapshot()
    snapshot.set_cooling({"priority_scheduling": frozenset({"cheaper"}), "queue_order": frozenset({"cheap"})})
    out = priority_scheduling.decide(snapshot, CONFIG)
    assert [(a.action, a.job_id) for a in out.actions] == [
        ("preempt", "cheap")
    ]  # another rule's cooldown is not its own

    snapshot = full_node().pending("urgent", gpus=1, priority="high").snapshot()
    snapshot.set_cooling({"priority_scheduling": frozenset({"cheaper", "cheap", "costly"})})
    out = priority_scheduling.decide(snapshot, CONFIG)
    assert out.actions == []
    assert "gave way within the last 120 s" in out.pending["urgent"] and "cheaper" in out.pending["urgent"]
