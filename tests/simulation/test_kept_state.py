"""The simulator keeps state across passes so a pass costs what changed (job views updated from
progress events, who holds which device, node views): at many moments of a run, what it kept is
what building everything again from the jobs' state gives."""

import statistics

from services.decider import admission_order
from services.decider.job_rows import job_from_row
from shared.contracts.job_status import JobStatus
from shared.infra.config import load_config
from sim.cluster import Topology
from sim.simulator import EPOCH, Simulation
from sim.traces import read_trace
from sim.workload import enrich


def test_kept_views_and_devices_match_a_rebuild(small_trace):
    topology = Topology(32)
    sim = Simulation(enrich(read_trace(small_trace), 8), topology, load_config(), "adc")
    compared = progressed = 0
    for minute in range(60, 7 * 24 * 60, 7):
        sim.run(until=minute * 60)
        snapshot, _ = sim.current_snapshot()
        # The step times kept for the typical step time: those the running views report, sorted.
        reported = [j.step_time_s for j in snapshot.jobs if j.step_time_s and j.status == JobStatus.RUNNING]
        assert admission_order._reported[0] is snapshot.jobs and admission_order._reported[1] == sorted(reported)
        if reported:
            assert admission_order.typical_step_s(snapshot.jobs, 1.0) == statistics.median(reported)
        for job_id, job in sim.live.items():
            rebuilt = job_from_row(sim._row(job), sim.levels, sim._checkpoints(job))
            assert snapshot.job(job_id) == rebuilt, job_id
            compared += 1
            progressed += rebuilt.step is not None
        used: dict[str, set[int]] = {}
        for job in sim.live.values():
            if job.holds:
                for part in job.held_devices():
                    used.setdefault(part.node, set()).update(part.gpus)
        for part in sim.core.booked():
            used.setdefault(part.node, set()).update(part.gpus)
        expected = topology.node_views(used, EPOCH)
        assert {n: v.free for n, v in snapshot.nodes.items()} == {n: v.free for n, v in expected.items()}
    assert compared > 10_000 and progressed > 2_000  # running jobs with reported progress were among them
