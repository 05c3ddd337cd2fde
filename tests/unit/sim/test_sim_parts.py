"""Pure parts of the simulator: trace readers, enrichment, policies, the executor's protocol costs, figures."""

import pytest

from shared.contracts.actions import Migrate, NodeGpus, Preempt, Start
from shared.contracts.job_status import JobStatus
from shared.infra.config import AdcConfig
from sim.cluster import SimJob
from sim.executor import Counters, ProtocolCosts, SimExecutor
from sim.metrics import figures
from sim.policies import policy_config
from sim.simulator import JobOutcome, SimResult
from sim.traces import TraceError, TraceJob, read_trace, window
from sim.workload import Enrichment, enrich


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_each_trace_format_is_read_sorted_and_relative_to_its_first_submission(tmp_path):
    philly = write(
        tmp_path,
        "p.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n2017-10-09 06:13:03,2951.0,2,5902.0,b\n",
    )
    itp = write(tmp_path, "c.csv", "job_id,submission_time,duration,num_gpu\nx,5010,1265,1\ny,5016,2066,8")
    pollux = write(tmp_path, "w.csv", "name,time,application,num_replicas,batch_size\ncifar10-0,53,cifar10,6,2048\n")
    p = read_trace(philly)
    assert [(j.submit_s, j.gpus, j.duration_s) for j in p] == [(0.0, 2, 2951.0), (2932.0, 1, 66.0)]
    assert [(j.name, j.submit_s, j.gpus) for j in read_trace(itp)] == [("x", 0.0, 1), ("y", 6.0, 8)]
    w = read_trace(pollux, seed=3)
    assert w[0].gpus == 6 and w[0].duration_s > 0 and read_trace(pollux, seed=3) == w != read_trace(pollux, seed=4)
    assert [j.name for j in window(read_trace(itp), 5, 1)] == ["y"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("a,b\n1,2\n", "unknown trace format"),
        ("job_id,submission_time,duration,num_gpu\nx,5,10,0\n", "line 2: num_gpu '0'"),
        ("job_id,submission_time,duration,num_gpu\nx,nan,10,1\n", "line 2: submission_time 'nan'"),
        ("name,time,application,num_replicas,batch_size\nz,1,resnet9000,1,8\n", "application 'resnet9000'"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line_and_field(tmp_path, text, needle):
    with pytest.raises(TraceError, match=needle.replace("(", r"\(")):
        read_trace(write(tmp_path, "t.csv", text))


def test_enrichment_is_fixed_by_its_seed_and_keeps_the_hidden_duration(tmp_path):
    trace = read_trace(
        write(
            tmp_path,
            "c.csv",
            "job_id,submission_time,duration,num_gpu\n"
            + "".join(f"j{i},{i},{600 + 37 * i},{[1, 2, 8, 16][i % 4]}\n" for i in range(400)),
        )
    )
    a, b, c = enrich(trace, 8), enrich(trace, 8), enrich(trace, 8, Enrichment(seed=1))
    assert a == b != c
    high = sum(s.priority == "high" for s in a) / len(a)
    assert 0.12 < high < 0.28 and all(s.preemptible == (s.priority == "low") for s in a)
    assert all(s.multi_node for s in a if s.gpus > 8)
    for spec, job in zip(a, trace):
        assert abs(spec.max_steps * spec.step_s - job.duration_s) <= spec.step_s  # only max_steps is shown
        if spec.min_gpus is not None:
            assert 1 <= spec.min_gpus <= spec.gpus <= spec.max_gpus


def test_policies_switch_capabilities_off_and_unknown_ones_are_refused():
    base = AdcConfig()
    fifo = policy_config(base, "fifo").strategies
    assert not fifo.priority_scheduling.enabled and not fifo.defragmentation.enabled and not fifo.elastic_scale.enabled
    assert policy_config(base, "las").strategies.queue_order.method == "las"
    assert not policy_config(base, "adc-no-migration").strategies.defragmentation.enabled
    assert not policy_config(base, "adc-no-aggregation").strategies.priority_fifo.aggregate_fragments
    with pytest.raises(ValueError, match="unknown policy 'sjf'"):
        policy_config(base, "sjf")


def test_preemption_and_migration_are_charged_and_lossless():
    events = []
    ex = SimExecutor(
        ProtocolCosts(checkpoint_s=20, restart_s=30), Enrichment(), lambda t, job, kind: events.append((t, kind))
    )
    job = SimJob(enrich([TraceJob("t", 0.0, 1000.0, 2)], 8)[0])
    here = (NodeGpus(node="n0", gpus=(0, 1)),)
    ex.apply(job, Start(job_id="j", placement=list(here), reason="r"), "d1", 0.0)
    assert job.status == JobStatus.RUNNING and events[-1][1] == "finished"  # a first start costs nothing extra
    ex.apply(job, Preempt(job_id="j", reason="r"), "d2", 100.0)
    assert job.status == JobStatus.CHECKPOINTING and job.holds and events[-1] == (120.0, "checkpointed")
    ex.step_done(job, "checkpointed", 120.0)
    assert job.status == JobStatus.PENDING and not job.placement and ex.states["d2"] == "done"
    assert job.steps_done == job.stop_checkpoint_step > 0  # resumes where it stopped
    ex.apply(job, Start(job_id="j", placement=list(here), reason="r"), "d3", 200.0)
    assert job.status == JobStatus.STARTING and events[-1] == (230.0, "started")
    ex.step_done(job, "started", 230.0)
    there = [NodeGpus(node="n1", gpus=(0, 1))]
    ex.apply(job, Migrate(job_id="j", placement=there, reason="r"), "d4", 300.0)
    assert {p.node for p in job.held_devices()} == {"n0", "n1"}  # the target is held while it checkpoints
    ex.step_done(job, "checkpointed", 320.0)
    assert job.placement == tuple(there) and job.status == JobStatus.STARTING
    c = ex.counters
    assert (c.preemptions, c.migrations, c.checkpoint_gpu_s, c.restart_gpu_s) == (1, 1, 80.0, 120.0)
    ex.apply(job, Preempt(job_id="j", reason="r"), "d5", 330.0)  # mid-move: the executor refuses it
    assert ex.states["d5"] == "refused"


def test_figures_from_a_hand_made_run():
    jobs = [JobOutcome("a", "high", 1, 0.0, 0.0, 100.0), JobOutcome("b", "low", 1, 0.0, 50.0, 200.0)]
    result = SimResult(
        "x",
        2,
        jobs,
        Counters(preemptions=1, checkpoint_gpu_s=3600.0),
        [(0.0, 2, 2), (100.0, 1, 1)],
        passes=3,
        wall_s=0.1,
    )
    f = figures(result)
    assert f["jct_s"]["avg"] == 150.0 and f["makespan_s"] == 200.0
    assert f["queueing_s"] == {
        "high": {"avg": 0.0, "p95": 0.0, "jobs": 1},
        "low": {"avg": 50.0, "p95": 50.0, "jobs": 1},
    }
    assert f["utilization"] == pytest.approx((2 * 100 + 1 * 100) / (2 * 200))
    assert f["checkpoint_gpu_h"] == 1.0 and f["preemptions"] == 1


def test_a_spike_reads_as_a_spike_from_its_first_sample_whatever_the_time():
    """The feed samples in simulated seconds; EPOCH + t - EPOCH loses t's low bits (EPOCH is 1.7e9),
    which put a spike's first sample just before the spike, so oom_protection's window filled a
    sample late and the pass woken for it found nothing (a job died out of memory in cluster02)."""
    from shared.infra.config import load_config
    from sim.cluster import Topology
    from sim.simulator import Simulation

    spec = enrich([TraceJob("t", 0.0, 10_000_000.0, 1)], 8)[0]
    sim = Simulation([spec], Topology(8), load_config())
    sim.run(until=600.0)
    job = sim.jobs[0]
    assert job.status == JobStatus.RUNNING
    sim.now = 470118.0854804851  # as in the run where it happened: (EPOCH + now) - EPOCH < now
    sim.memory.spike(job, sim.now)
    snap, _ = sim.current_snapshot()
    part = job.placement[0]
    reading = snap.telemetry.gpu_latest(part.node, part.gpus[0])
    assert reading.used_bytes / reading.total_bytes == pytest.approx(Enrichment().spike_level, abs=1e-6)


def test_a_slow_node_slows_every_attempt_on_it_and_is_drawn_by_the_seed():
    from sim.step_model import StepModel

    names = [f"node-{i:04d}" for i in range(16)]
    assert StepModel().with_slow_nodes(names, 0.0, 1.3, seed=0) == StepModel()  # none unless asked
    model = StepModel().with_slow_nodes(names, 0.125, 1.3, seed=3)
    assert len(model.slow_nodes) == 2 and model.slow_nodes <= set(names)
    assert model == StepModel().with_slow_nodes(names, 0.125, 1.3, seed=3)  # the seed fixes which
    assert any(StepModel().with_slow_nodes(names, 0.125, 1.3, seed=s) != model for s in range(4, 8))
    assert len(StepModel().with_slow_nodes(names, 0.01, 1.3, seed=0).slow_nodes) == 1  # at least one
    slow, fast = sorted(model.slow_nodes)[0], next(n for n in names if n not in model.slow_nodes)

    def factor(*parts):
        placement = [NodeGpus(node=node, gpus=(0, 1)) for node in parts]
        return model.factor(placement, {}, 8, lambda g: 0, lambda n: "rack-000")

    assert factor(fast) == 1.0 and factor(slow) == pytest.approx(1.3)
    assert factor(fast, slow) == pytest.approx(1.3)  # a gang runs at its slowest member's pace
