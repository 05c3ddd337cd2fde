"""Builders for decider tests: a cluster described in a few calls, turned into the same
immutable Snapshot the engine builds, with telemetry fed through a real ClusterView."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.decider.cluster_view import ClusterView
from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import Device, GpuSample, Heartbeat, NodeMetrics
from shared.specs.quota import Quota

GiB = 2**30
T0 = 1_700_000_000.0


@dataclass
class _Node:
    name: str
    gpus: int
    model: str
    memory: int
    rack: str
    per_domain: int
    schedulable: bool


@dataclass
class _Series:
    value: float
    since: float  # seconds before now the value holds from; before that, the base value


@dataclass
class Cluster:
    now: float = T0 + 1000.0
    history_s: int = 90
    base_memory: float = 0.01
    nodes: dict[str, _Node] = field(default_factory=dict)
    jobs: list[JobView] = field(default_factory=list)
    quotas: dict[str, Quota] = field(default_factory=dict)
    _memory: dict[tuple[str, int], list[_Series]] = field(default_factory=dict)
    _cpu: dict[str, float] = field(default_factory=dict)
    _util: dict[tuple[str, int], float] = field(default_factory=dict)
    _comm: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    _gaps: dict[str, tuple[float, float]] = field(default_factory=dict)
    _traced: dict[tuple[str, int], str] = field(default_factory=dict)

    def node(
        self,
        name: str,
        gpus: int = 8,
        *,
        model: str = "H100",
        memory_gib: int = 80,
        rack: str = "r1",
        per_domain: int = 8,
        schedulable: bool = True,
    ) -> Cluster:
        self.nodes[name] = _Node(name, gpus, model, memory_gib * GiB, rack, per_domain, schedulable)
        return self

    def job(
        self,
        job_id: str,
        on: dict[str, tuple[int, ...]] | None = None,
        *,
        gpus: int | None = None,
        status: JobStatus = JobStatus.RUNNING,
        priority: str = "low",
        rank: int | None = None,
        preemptible: bool | None = None,
        submitted: float = 0.0,
        **extra,
    ) -> Cluster:
        placement = tuple(NodeGpus(node=n, gpus=tuple(g)) for n, g in (on or {}).items())
        count = gpus if gpus is not None else sum(len(p.gpus) for p in placement)
        rank = rank if rank is not None else {"high": 0, "low": 1}.get(priority, 1)
        self.jobs.append(
            JobView(
                id=job_id,
                name=job_id,
                status=status,
                priority=priority,
                priority_rank=rank,
                gpus=count,
                preemptible=(rank > 0) if preemptible is None else preemptible,
                submitted_at=T0 + submitted,
                placement=placement,
                **extra,
            )
        )
        return self

    def pending(self, job_id: str, gpus: int = 1, **kw) -> Cluster:
        return self.job(job_id, None, gpus=gpus, status=JobStatus.PENDING, **kw)

    def memory(self, node: str, gpu: int, fraction: float, for_s: float) -> Cluster:
        """GPU memory use at `fraction` for the last `for_s` seconds (samples at 1 Hz up to now)."""
        self._memory.setdefault((node, gpu), []).append(_Series(fraction, for_s))
        return self

    def cpu(self, node: str, fraction: float) -> Cluster:
        self._cpu[node] = fraction
        return self

    def util(self, node: str, gpu: int, fraction: float) -> Cluster:
        self._util[(node, gpu)] = fraction
        return self

    def comm(self, job_id: str, node: str, samples_us: list[float]) -> Cluster:
        """Latency samples reported once, in the newest metrics of `node`."""
        self._comm[(job_id, node)] = samples_us
        return self

    def silent(self, node: str, from_s_ago: float, to_s_ago: float = 0.0) -> Cluster:
        """No telemetry from `node` in that span (a gap, or staleness when it reaches now)."""
        self._gaps[node] = (from_s_ago, to_s_ago)
        return self

    def traced(self, node: str, ago: int, traceparent: str) -> Cluster:
        """The sample of `node` from `ago` seconds ago names its collector's publish span."""
        self._traced[(node, ago)] = traceparent
        return self

    def _fraction(self, node: str, gpu: int, ago: float) -> float:
        value = self.base_memory
        for series in self._memory.get((node, gpu), []):
            if ago <= series.since:
                value = series.value
        return value

    def view(self) -> ClusterView:
        view = ClusterView(window_s=120)
        for n in self.nodes.values():
            devices = [
                Device(
                    index=i,
                    name=n.model,
                    memory_total_bytes=n.memory,
                    nvlink_domain=i // n.per_domain,
                    numa_node=i // max(1, n.gpus // 2),
                )
                for i in range(n.gpus)
            ]
            view.heartbeat(Heartbeat(node=n.name, ts=self.now, started_at=T0, devices=devices, rack=n.rack), self.now)
        for step in range(self.history_s, -1, -1):
            ts = self.now - step
            for n in self.nodes.values():
                gap = self._gaps.get(n.name)
                if gap and gap[1] <= step <= gap[0]:
                    continue
                gpus = [
                    GpuSample(
                        index=i,
                        memory_total_bytes=n.memory,
                        memory_used_bytes=int(n.memory * self._fraction(n.name, i, step)),
                        util_pct=100 * self._util.get((n.name, i), 0.5),
                    )
                    for i in range(n.gpus)
                ]
                comm = {job: samples for (job, node), samples in self._comm.items() if node == n.name and step == 0}
                view.ingest(
                    NodeMetrics(
                        node=n.name,
                        ts=ts,
                        gpus=gpus,
                        cpu_pct=100 * self._cpu.get(n.name, 0.2),
                        comm_latency_us=comm,
                        trace_parent=self._traced.get((n.name, step)),
                    )
                )
        return view

    def snapshot(self, view: ClusterView | None = None) -> Snapshot:
        view = view or self.view()
        held: dict[str, set[int]] = {}
        for j in self.jobs:
            if j.holds_gpus:
                for p in j.placement:
                    held.setdefault(p.node, set()).update(p.gpus)
        nodes = {}
        for n in self.nodes.values():
            devices = tuple(range(n.gpus))
            nodes[n.name] = NodeView(
                id=n.name,
                devices=devices,
                rack=n.rack,
                schedulable=n.schedulable,
                free=tuple(g for g in devices if g not in held.get(n.name, set())),
                gpus=view.nodes[n.name].gpus,
                last_seen=self.now,
            )
        return Snapshot(
            ts=self.now, nodes=nodes, jobs=tuple(self.jobs), telemetry=view.freeze(self.now), quotas=dict(self.quotas)
        )
