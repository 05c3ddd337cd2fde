"""The immutable cluster snapshot every policy reads: nodes, their devices, jobs."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.actions import NodeGpus
from shared.job_status import JobStatus


@dataclass(frozen=True)
class NodeView:
    id: str
    devices: tuple[int, ...]
    free: tuple[int, ...]
    rack: str = ""
    schedulable: bool = True
    last_seen: float = 0.0


@dataclass(frozen=True)
class JobView:
    id: str
    name: str
    status: JobStatus
    priority: str
    priority_rank: int
    gpus: int
    preemptible: bool
    submitted_at: float
    team: str = ""
    placement: tuple[NodeGpus, ...] = ()
    resume_from: str | None = None
    multi_node: bool = False


@dataclass(frozen=True)
class Snapshot:
    ts: float
    nodes: dict[str, NodeView] = field(default_factory=dict)
    jobs: tuple[JobView, ...] = ()

    def pending(self) -> list[JobView]:
        """Pending jobs in admission order: priority, then submission time (FIFO)."""
        return sorted((j for j in self.jobs if j.status == JobStatus.PENDING),
                      key=lambda j: (j.priority_rank, j.submitted_at, j.id))
