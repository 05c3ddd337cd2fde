"""GPU memory telemetry for the simulated cluster, fed into the live decider's own `ClusterView`.

The live decider reads memory windows from the `NodeMetrics` its collectors publish once a
`collector.interval`; `oom_protection` acts on a GPU above its threshold for `for_s`. Here the
same `ClusterView` ingests samples with the same fields, built from each job's memory profile
(sim/workload.py): a steady share of the device, and for some jobs one spike above the
threshold. Samples are made only while a spike is under way (outside one every window is below
any threshold, so nothing a rule reads would differ): one a collector interval on the nodes of
spiking jobs, back to the spike's start or a window ago, and one at the pass on every other node,
so a migration's target devices have fresh readings, as collectors give them.

A spike belongs to one attempt: it starts when the job reaches its spike step, holds until the
job stops (a checkpoint-stop, a move, a resize: the allocator's state goes with the process), and
if the job is still running `oom_after_s` after it began, the attempt dies of out-of-memory
(sim/executor.py charges the lost progress). A job spikes at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.decider.cluster_view import ClusterView
from services.decider.telemetry import TelemetryView
from shared.infra.config import AdcConfig
from sim.cluster import RUNNING, GiB, SimJob, Topology
from sim.step_model import HALVED_BATCH_MEMORY
from sim.workload import Enrichment

IDLE_FRACTION = 0.01  # a free device still holds the driver's context
READINGS_KEPT = 20_000  # distinct device readings kept for reuse (each job has its own memory share)


@dataclass(frozen=True, slots=True)
class _Gpu:
    """The fields of `shared.contracts.messages.GpuSample` the ClusterView reads (a plain object: samples by the
    hundred thousand, and pydantic's constructor would be most of the simulator's time)."""

    index: int
    memory_used_bytes: int
    memory_total_bytes: int
    util_pct: float


@dataclass(frozen=True, slots=True)
class _Metrics:
    """The fields of `shared.contracts.messages.NodeMetrics` the ClusterView reads."""

    node: str
    ts: float
    gpus: list
    cpu_pct: float = 10.0
    comm_latency_us: dict = None  # type: ignore[assignment]
    trace_parent: str | None = None  # simulated samples are never traced


class MemoryFeed:
    def __init__(self, topology: Topology, config: AdcConfig, enrichment: Enrichment, epoch: float) -> None:
        d = config.decider
        self.interval = config.collector.interval
        self.view = ClusterView(
            window_s=d.window_s, sample_interval_s=self.interval, max_gap_s=d.max_gap_s, stale_after_s=d.stale_after_s
        )
        self.window_s = d.window_s
        oom = config.strategies.oom_protection
        self.ready_after_s = oom.for_s if oom.enabled else math.inf  # until then no window can be satisfied
        self.topology, self.enrichment, self.epoch = topology, enrichment, epoch
        self.node_names = topology.node_names()  # in node order, named once
        self.total = topology.memory_gib * GiB
        self.spiking: dict[str, tuple[SimJob, int]] = {}  # job id -> (job, generation of the spiking attempt)
        self._fed: dict[str, float] = {}  # node -> simulated time of its newest sample
        self._gpus: dict[
            tuple[int, float, float], _Gpu
        ] = {}  # (index, fraction, util) -> its reading: immutable, made once

    def spike(self, job: SimJob, now: float) -> None:
        job.spike_since, job.spiked = now, True
        self.spiking[job.spec.id] = (job, job.generation)

    def still_spiking(self, job: SimJob) -> bool:
        entry = self.spiking.get(job.spec.id)
        return entry is not None and entry[1] == job.generation and job.status == RUNNING

    def telemetry(self, now: float, owners: dict[tuple[str, int], SimJob]) -> TelemetryView | None:
        """The windows as of `now` (`owners`: the job holding each device, by (node, device)), or None
        when no spike is under way (then every window is quiet)."""
        for job_id in [j for j, (job, _) in self.spiking.items() if not self.still_spiking(job)]:
            del self.spiking[job_id]
        if not self.spiking:
            return None
        hot_nodes = {p.node: job.spike_since for job, _ in self.spiking.values() for p in job.placement}
        # Other nodes' readings matter only to a rule whose window is satisfied (oom_protection's
        # migration targets need fresh ones): until a spike is that old, they are left unsampled.
        targets = any(now - job.spike_since >= self.ready_after_s for job, _ in self.spiking.values())
        due: dict[str, list[float]] = {}  # node -> the times of its samples now, in node order
        for node in self.node_names:
            since = hot_nodes.get(node)
            last = self._fed.get(node, -math.inf)
            if since is None:  # fresh readings at the collector's cadence
                times = [now] if targets and now - last >= self.interval else []
            else:
                start = max(last + self.interval, since - self.interval, now - self.window_s)
                count = int(math.floor((now - start) / self.interval)) + 1
                times = [now - (count - 1 - i) * self.interval for i in range(max(count, 0))]
            if times:
                due[node] = times
        for node, times in due.items():
            for t in times:
                self.view.ingest(self._sample(node, t, owners))
            self._fed[node] = times[-1]
        return self.view.freeze(self.epoch + now)

    def _sample(self, node: str, t: float, owners: dict) -> _Metrics:
        gpus = []
        for g in range(self.topology.gpus_per_node):
            job = owners.get((node, g))
            if job is None:
                fraction, util = IDLE_FRACTION, 0.0
            elif job.spike_since is not None and t >= job.spike_since and self.still_spiking(job):
                fraction, util = self.enrichment.spike_level, 95.0
            else:
                fraction, util = job.spec.memory_fraction, 95.0
                if job.halvings:  # activations halve with the micro-batch
                    fraction *= HALVED_BATCH_MEMORY**job.halvings
            reading = self._gpus.get((g, fraction, util))
            if reading is None:
                if len(self._gpus) >= READINGS_KEPT:
                    self._gpus.clear()
                reading = self._gpus[(g, fraction, util)] = _Gpu(g, int(fraction * self.total), self.total, util)
            gpus.append(reading)
        return _Metrics(node, self.epoch + t, gpus, 10.0, {})
