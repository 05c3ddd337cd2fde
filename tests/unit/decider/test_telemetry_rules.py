"""comm_jitter and load_balance over built snapshots."""

import pytest

from services.decider.rules import comm_jitter, load_balance
from shared.infra.config import CommJitter, LoadBalance
from tests.unit.decider.builders import Cluster

STEADY = [100.0, 102.0, 98.0, 101.0, 99.0]


JITTER = CommJitter(stddev_us=50)


def jitter(c, config=JITTER):
    return comm_jitter.decide(c.snapshot(), config).actions


def spread_job():
    # A 4-GPU job over two racks; node c has 4 free devices: a tighter home exists.
    return (
        Cluster()
        .node("a", 2, rack="r1")
        .node("b", 2, rack="r2")
        .node("c", 4, rack="r1")
        .job("j", {"a": (0, 1), "b": (0, 1)}, multi_node=True)
    )


def test_erratic_latency_moves_the_job_to_a_tighter_topology():
    c = spread_job().comm("j", "a", STEADY * 3).comm("j", "b", [400.0, 420.0, 390.0] * 5)
    [action] = jitter(c)
    assert action.action == "migrate" and [(p.node, p.gpus) for p in action.placement] == [("c", (0, 1, 2, 3))]
    assert action.evidence["stddev_us"] > 50 and set(action.evidence["per_node"]) == {"a", "b"}
    assert action.evidence["current_topology"] == {"racks": 2, "nodes": 2, "nvlink_domains": 2}


def test_without_a_tighter_placement_it_tunes_nccl():
    c = spread_job().job("filler", {"c": (0, 1, 2, 3)}).comm("j", "a", STEADY * 3).comm("j", "b", [400.0] * 15)
    [action] = jitter(c)
    assert action.action == "tune" and action.env["NCCL_ALGO"] == "Ring"


@pytest.mark.parametrize(
    "samples_a,samples_b",
    [
        (STEADY * 3, STEADY * 3),  # steady: no trigger
        ([100.0] * 3, [400.0] * 3),  # too few samples to judge
    ],
)
def test_no_trigger(samples_a, samples_b):
    assert jitter(spread_job().comm("j", "a", samples_a).comm("j", "b", samples_b)) == []


def test_edge_stddev_exactly_at_the_threshold_does_not_trigger():
    c = spread_job().comm("j", "a", [50.0] * 10).comm("j", "b", [150.0] * 10)  # stddev exactly 50
    assert jitter(c) == []
    assert jitter(c, CommJitter(stddev_us=49.9))


BALANCE = LoadBalance(hot_threshold=0.85, min_gain=0.3)


def balance(c, config=BALANCE):
    return load_balance.decide(c.snapshot(), config).actions


def hot_cluster():
    return (
        Cluster()
        .node("hot", 4)
        .node("cool", 4)
        .node("warm", 4)
        .job("big", {"hot": (0, 1)})
        .job("small", {"hot": (2,)})
        .cpu("hot", 0.95)
        .cpu("cool", 0.20)
        .cpu("warm", 0.70)
    )


def test_moves_the_smallest_job_off_a_hot_node_when_it_pays():
    [action] = balance(hot_cluster())
    assert action.job_id == "small" and action.placement[0].node == "cool"
    assert action.evidence["hot_load"] == pytest.approx(0.95) and action.evidence["target_load"] == pytest.approx(0.2)


def test_a_move_off_a_hot_node_names_its_traced_sample_of_the_span():
    traced = "00-11111111111111111111111111111111-2222222222222222-01"
    c = hot_cluster().traced("hot", 2, traced)
    [action] = balance(c)
    assert action.evidence["traced_sample"] == {"node": "hot", "ts": c.now - 2, "traceparent": traced}
    [untraced] = balance(hot_cluster().traced("cool", 2, traced))  # the cool node's sample is not why it moved
    assert "traced_sample" not in untraced.evidence


def test_no_move_when_the_gain_is_too_small_or_one_job_only():
    assert balance(hot_cluster().cpu("cool", 0.80)) == []  # cool is no longer 0.3 below any hot node... warm 0.7
    c = Cluster().node("hot", 4).node("cool", 4).job("only", {"hot": (0,)}).cpu("hot", 0.99).cpu("cool", 0.1)
    assert balance(c) == []


def test_least_loaded_picks_the_coolest_node():
    c = hot_cluster().cpu("warm", 0.5).cpu("cool", 0.6)
    [action] = balance(c, LoadBalance(method="least_loaded", min_gain=0.3))
    assert action.placement[0].node == "warm"


def test_runs_every_rebalance_interval():
    assert load_balance.RULE.period(LoadBalance(rebalance_interval=45)) == 45


async def test_latency_the_trainer_measures_reaches_comm_jitter_through_job_events():
    """Trainers time their per-step all-reduce; the worker groups it by node in progress events,
    and the decider feeds that into the same windows comm_jitter reads."""
    from types import SimpleNamespace

    from services.decider.ingest import Ingest, IngestGate
    from shared.contracts.messages import JobEvent
    from shared.infra.clock import ManualClock
    from worker.agent import by_node

    c = spread_job()
    view = c.view()
    per_rank = STEADY[:2] + [400.0, 430.0]  # ranks 0-1 on node a, ranks 2-3 on node b
    grouped = by_node(per_rank, ["a", "a", "b", "b"])
    assert grouped == {"a": STEADY[:2], "b": [400.0, 430.0]}
    from services.decider.job_book import JobBook
    from shared.contracts.subjects import Subjects

    book = JobBook(None, 30.0, view.checkpoints)
    [job] = [j for j in c.jobs if j.id == "j"]
    book.jobs["j"] = job
    clock = ManualClock()
    ingest = Ingest(
        SimpleNamespace(subjects=Subjects()),
        clock,
        view,
        SimpleNamespace(book=book),
        IngestGate(clock),
        wake=lambda reason: None,
    )

    async def report(node: str, i: int) -> None:  # as node's worker publishes, on its own subject
        event = JobEvent(
            job_id="j",
            kind="progress",
            ts=c.now - 4 + i,
            attempt=job.attempt,
            node=node,
            data={"step": i, "comm_latency_us": per_rank, "comm_latency_us_by_node": grouped},
        )
        await ingest._on_job_event(SimpleNamespace(data=event.encode(), subject=Subjects().job_events("j", node)))

    for i in range(5):
        await report("c", i)  # a node the job is not on: its word counts for nothing
    assert not comm_jitter.decide(c.snapshot(view), CommJitter(stddev_us=50)).actions
    for i in range(5):
        await report("a", i)  # rank 0's node
    [action] = comm_jitter.decide(c.snapshot(view), CommJitter(stddev_us=50)).actions
    assert action.action == "migrate" and set(action.evidence["per_node"]) == {"a", "b"}


def test_the_job_book_takes_progress_from_events_and_shrugs_off_hostile_values():
    from services.decider.job_book import JobBook

    c = spread_job()
    book = JobBook(None, 30.0, {})
    [job] = c.snapshot(c.view()).running()
    book.jobs[job.id] = job
    node = job.nodes()[0]
    book.progress(
        job.id, job.attempt, node, {"step": 7, "step_time_s": 0.5, "max_steps": 100, "peak_memory_bytes": 2**30}
    )
    assert (book.jobs[job.id].step, book.jobs[job.id].max_steps, book.jobs[job.id].peak_memory_bytes) == (7, 100, 2**30)
    book.progress(job.id, job.attempt, node, {"step": "many", "step_time_s": [1], "max_steps": 1e400})
    assert book.jobs[job.id].step is None and book.jobs[job.id].max_steps is None
    book.progress(job.id, job.attempt + 1, node, {"step": 9})  # another attempt's event changes nothing
    book.progress(job.id, job.attempt, "elsewhere", {"step": 9})  # nor does one from a node it is not on
    assert book.jobs[job.id].step is None
