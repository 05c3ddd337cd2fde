"""A small simulation (the first 300 jobs of ITP cluster02, 96 GPUs) under every policy, with range
checks on its figures, in the manner of Kueue's performance harness: each figure must land in a
range that a correct simulator and a sane policy set produce; a broken one falls outside."""

import signal

import pytest

from shared.infra.config import load_config
from sim.cluster import Topology
from sim.policies import policy_config
from sim.run import Comparison, compare
from sim.simulator import SimOptions, Simulation
from sim.traces import TraceJob, read_trace
from sim.workload import enrich

GPUS = 96


@pytest.fixture(scope="module")
def run(small_trace):
    results, rows = compare(Comparison(trace=str(small_trace), gpus=GPUS))
    return {r.policy: r for r in results}, {row["policy"]: row for row in rows}


def test_every_job_finishes_and_none_faster_than_its_work_allows(run, small_trace):
    results, rows = run
    trace = read_trace(small_trace)
    durations = sorted(j.duration_s for j in trace)
    for name, row in rows.items():
        assert row["finished"] == row["jobs"] == len(trace), name
        jct = sorted(j.finish_s - j.submit_s for j in results[name].jobs)
        # Growing elastic jobs to at most 2x their devices (scaling 0.9) speeds them up 1.87x at most.
        assert jct[0] >= durations[0] / 1.87 - 1e-6, name
        assert row["jct_s"]["avg"] >= sum(durations) / len(durations) / 1.87, name
        assert row["jct_s"]["p50"] <= row["jct_s"]["p95"], name


def test_figures_in_range(run):
    _, rows = run
    for name, row in rows.items():
        assert 0.05 < row["utilization"] <= 1.0, name
        assert row["productive_utilization"] <= row["utilization"], name
        assert row["makespan_s"] > 0 and row["passes"] > 0, name
        for level in ("high", "low"):
            assert row["queueing_s"][level]["jobs"] > 0, (name, level)
    fifo, las, adc = rows["fifo"], rows["las"], rows["adc"]
    assert fifo["preemptions"] == fifo["migrations"] == fifo["resizes"] == 0  # static reservation
    assert fifo["checkpoint_gpu_h"] == 0 and (fifo["restart_gpu_h"] > 0) == (
        fifo["oom_crashes"] > 0
    )  # only deaths restart
    assert las["preemptions"] > 0 and las["migrations"] == 0
    assert las["checkpoint_gpu_h"] > 0 and las["restart_gpu_h"] > 0  # preemption is never free
    assert adc["jct_s"]["avg"] < las["jct_s"]["avg"] < fifo["jct_s"]["avg"]
    # The headline, at this size: ADC's default policy set clearly ahead of Tiresias-style LAS.
    assert adc["jct_s"]["avg"] <= 0.92 * las["jct_s"]["avg"], adc["jct_s"]["avg"] / las["jct_s"]["avg"]
    assert adc["queueing_s"]["high"]["p95"] <= 60
    assert adc["utilization"] >= 0.95 * fifo["utilization"]
    assert rows["adc-no-migration"]["migrations"] == 0
    assert rows["adc-no-elastic"]["resizes"] <= adc["resizes"]


def test_protocol_costs_add_up(run):
    results, rows = run
    for name, r in results.items():
        c = r.counters
        moves = c.preemptions + c.migrations + c.resizes + c.tunes
        # Each move checkpoints 20 s on at least 1 device, each restart costs 30 s on at least 1
        # (a restart also follows an out-of-memory death, which checkpoints nothing).
        assert c.checkpoint_gpu_s >= 20 * moves, name
        assert (c.restart_gpu_s > 0) == (moves + c.oom_crashes > 0), name
        assert (c.oom_lost_gpu_s > 0) == (c.oom_crashes > 0), name


def test_memory_spikes_trigger_the_live_oom_protection_rule(run):
    """The enrichment gives some jobs a memory spike; the live oom_protection rule, reading the
    windows the simulator feeds it, moves them before they die; without it they die."""
    _, rows = run
    spikes = rows["adc"]["memory_spikes"]
    assert spikes >= 5 and all(r["memory_spikes"] > 0 for r in rows.values())
    adc = rows["adc"]
    # Each spike is acted on in time; most are moved (the shipped action is migrate), the rest stopped
    # (a spike with no free devices to move to is checkpointed and requeued instead).
    assert sum(adc["oom_actions"].values()) >= 0.9 * spikes
    assert adc["oom_migrations"] > 0.5 * spikes
    assert adc["oom_crashes"] <= 0.1 * spikes
    assert adc["migrations"] >= adc["oom_migrations"]
    for static in ("fifo", "las"):  # no oom_protection: every spike still running at its deadline kills the attempt
        assert rows[static]["oom_actions"] == {} and rows[static]["oom_migrations"] == 0, static
        assert rows[static]["oom_crashes"] >= 0.7 * spikes and rows[static]["oom_lost_gpu_h"] > 0, static
    no_move = rows["adc-no-migration"]  # checkpoint_requeue: stopped in time, never moved
    assert no_move["oom_migrations"] == no_move["migrations"] == 0
    assert no_move["oom_actions"].get("preempt", 0) >= 0.7 * spikes and no_move["oom_crashes"] <= 0.1 * spikes


def test_the_workload_is_the_same_for_every_policy(run):
    results, _ = run
    shapes = {name: [(j.id, j.priority, j.gpus, j.submit_s) for j in r.jobs] for name, r in results.items()}
    first = next(iter(shapes.values()))
    assert all(s == first for s in shapes.values())


def test_a_progress_report_due_at_a_rounded_sum_is_taken_once_not_queued_again_for_ever():
    """`reported_at + every` rounds to `now` while `now - reported_at` is a hair under `every`: the
    report is due, so it is taken (before, it was queued again for the same instant, for ever)."""
    options = SimOptions()
    last = 2023.1906731877473
    now = last + options.report_every_s
    assert now - last < options.report_every_s  # the rounding this is about
    specs = enrich([TraceJob("t", 0.0, 100_000.0, 1)], 8)
    sim = Simulation(specs, Topology(8), policy_config(load_config(), "adc"), "adc", options)
    sim.run(until=last - 1.0)
    [job] = sim.jobs
    assert job.spec.id in sim._running and job.running_since < now - options.report_after_s
    job.reported_at = last
    sim._queue_report(job)

    def hung(*_):
        raise TimeoutError("job_views did not return")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        sim.job_views(now)
    finally:
        signal.alarm(0)
    assert job.reported_at == now
