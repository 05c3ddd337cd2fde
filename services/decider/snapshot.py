"""The immutable cluster snapshot every rule reads: nodes and their GPUs with topology, jobs
with their placements, team quotas, and the telemetry windows as of the snapshot time.

Rules get nothing else. Everything here is frozen (the telemetry arrays are read-only
copies), so a rule may run in its own thread while the engine goes on ingesting metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import HOLDING_GPUS, JobStatus
from shared.specs.quota import Quota, TeamUsage, gpu_headroom

if TYPE_CHECKING:
    from services.decider.telemetry import TelemetryView


@dataclass(frozen=True)
class GpuInfo:
    """One device of a node and where it sits: NVLink domain and NUMA node (the rack is the node's)."""

    index: int
    model: str = ""
    memory_total_bytes: int = 0
    nvlink_domain: int = 0
    numa_node: int = 0


@dataclass(frozen=True)
class NodeView:
    id: str
    devices: tuple[int, ...]
    free: tuple[int, ...]
    rack: str = ""
    schedulable: bool = True
    last_seen: float = 0.0
    gpus: tuple[GpuInfo, ...] = ()
    status: str = "ready"
    _by_index: dict[int, GpuInfo] = field(init=False, repr=False, compare=False)
    # Its free devices in order, as placement counts them: sorted once per view, not once per snapshot.
    free_sorted: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_index", {info.index: info for info in self.gpus})
        object.__setattr__(self, "free_sorted", tuple(sorted(self.free)))

    def gpu(self, index: int) -> GpuInfo:
        return self._by_index.get(index) or GpuInfo(index=index)

    def seen_at(self, ts: float) -> NodeView:
        """The same view heard from at `ts` (a routine heartbeat): a copy, without building it again."""
        seen = object.__new__(NodeView)
        seen.__dict__.update(self.__dict__, last_seen=ts)
        return seen

    @property
    def idle(self) -> bool:
        """No job holds any of its devices."""
        return len(self.free) == len(self.devices)


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
    owner: str = ""  # the token name that submitted it (per-user quota limits)
    placement: tuple[NodeGpus, ...] = ()
    resume_from: str | None = None
    multi_node: bool = False
    min_gpus: int | None = None
    max_gpus: int | None = None
    attempt: int = 0
    started_at: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_at: float | None = None
    step: int | None = None
    step_time_s: float | None = None
    # How the last attempt ended (shared/contracts/outcomes.py), its peak memory, and the batch a start gets.
    last_outcome: str | None = None
    oom_retries: int = 0  # out-of-memory exits that sent it back to the queue (the executor counts them)
    peak_memory_bytes: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    gradient_checkpointing: bool = True  # LLaMA-Factory's default; off only with disable_gradient_checkpointing
    max_steps: int | None = None  # from the spec (train.max_steps) or the trainer's progress
    # Derived once, as plain attributes: rules ask for these thousands of times a pass (a property
    # costs ten times an attribute's read, and filtering every running view by floor is a loop per pass).
    holds_gpus: bool = field(init=False, repr=False, compare=False)
    gpu_count: int = field(
        init=False, repr=False, compare=False
    )  # devices it holds now (an elastic job may differ from what it asked for)
    floor: int = field(
        init=False, repr=False, compare=False
    )  # fewest devices it may be shrunk to while running (its own count if not elastic)
    elastic: bool = field(init=False, repr=False, compare=False)  # declares min_gpus or max_gpus

    def __post_init__(self) -> None:
        holds = self.status in HOLDING_GPUS
        count = sum(len(p.gpus) for p in self.placement) if holds else 0
        object.__setattr__(self, "holds_gpus", holds)
        object.__setattr__(self, "gpu_count", count)
        object.__setattr__(self, "floor", min(self.min_gpus, count) if self.min_gpus is not None else count)
        object.__setattr__(self, "elastic", self.min_gpus is not None or self.max_gpus is not None)

    def remaining_steps(self) -> int | None:
        if self.max_steps is None:
            return None
        return max(0, self.max_steps - (self.step or 0))

    def shrunk_to(self, n: int) -> tuple[NodeGpus, ...]:
        """Its placement keeping the first `n` devices (the last node's devices go first)."""
        kept, left = [], n
        for part in self.placement:
            if left <= 0:
                break
            kept.append(NodeGpus.model_construct(node=part.node, gpus=part.gpus[:left]))  # a subset of a valid one
            left -= len(kept[-1].gpus)
        return tuple(kept)

    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placement)

    def lost_progress_s(self, now: float) -> float:
        """Seconds of training a checkpoint-stop now would throw away, estimated.

        From steps since the last checkpoint times the step time when the trainer reported them;
        else wall time since the newest checkpoint (or the start)."""
        if self.step is not None and self.step_time_s:
            return max(0, self.step - (self.last_checkpoint_step or 0)) * self.step_time_s
        since = self.last_checkpoint_at or self.started_at
        return max(0.0, now - since) if since else 0.0

    def lost_gpu_hours(self, now: float) -> float:
        return self.gpu_count * self.lost_progress_s(now) / 3600.0


@dataclass(frozen=True)
class MoveRequest:
    """An operator asked to move a running job (to `target_node`, or anywhere with room)."""

    id: str
    job_id: str
    target_node: str | None
    actor: str
    reason: str
    trace_parent: str | None = None  # the request's span (checked when read), for the decision to link


@dataclass(frozen=True)
class Snapshot:
    ts: float
    nodes: dict[str, NodeView] = field(default_factory=dict)
    jobs: tuple[JobView, ...] = ()
    telemetry: TelemetryView | None = None
    quotas: dict[str, Quota] = field(default_factory=dict)
    schedules: tuple[str, ...] = ()
    move_requests: tuple[MoveRequest, ...] = ()  # not yet answered by a decision
    # Admission order within a priority level (job id -> sort key), from `admission_order.admission_order`;
    # empty: first come, first served.
    order: dict[str, tuple] = field(default_factory=dict)
    # Per rule, the jobs it acted on less than its cooldown_s ago (arbitration refuses its actions on
    # them): set by the engine as a pass begins, from the cooldowns it keeps.
    cooling: dict[str, frozenset[str]] = field(default_factory=dict)
    _usage: dict[str, TeamUsage] = field(init=False, repr=False, compare=False)
    _memo: dict = field(init=False, repr=False, compare=False)  # derived answers, e.g. the admission plan

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memo", {})

    def set_cooling(self, cooling: dict[str, frozenset[str]]) -> None:
        object.__setattr__(self, "cooling", cooling)

    def leave_alone(self, rule: str) -> frozenset[str]:
        """The jobs `rule` is cooling down on: its actions on them would be refused this pass."""
        return self.cooling.get(rule, frozenset())

    def _by_id(self) -> dict[str, JobView]:
        by_id = self._memo.get("by_id")
        if by_id is None:  # built on first use: most passes of a busy day never look a job up by id
            by_id = self._memo["by_id"] = {j.id: j for j in self.jobs}
        return by_id

    def job(self, job_id: str) -> JobView | None:
        return self._by_id().get(job_id)

    def carry_over(self, previous: Snapshot) -> None:
        """Take from `previous` what depends only on which job holds which devices (who owns a device,
        usage per team and per user), as far as it was worked out there. Only for a caller that knows
        no job's status or placement changed in between (the job book's version)."""
        if hasattr(previous, "_usage"):
            object.__setattr__(self, "_usage", previous._usage)
        for key in ("owners", "user_usage"):
            if key in previous._memo:
                self._memo[key] = previous._memo[key]

    def owner(self, node: str, gpu: int) -> JobView | None:
        """The job holding this device, if any."""
        owners = self._memo.get("owners")
        if owners is None:  # built on first use: few passes ask
            owners = self._memo["owners"] = {
                (p.node, g): j.id for j in self.jobs if j.holds_gpus for p in j.placement for g in p.gpus
            }
        job_id = owners.get((node, gpu))
        return self._by_id()[job_id] if job_id else None

    def _by_status(self) -> None:
        """Pending, running and running elastic jobs, sorted out in one loop over the jobs (nearly every
        pass asks for all three)."""
        pending, running, elastic = [], [], []
        is_pending, is_running = JobStatus.PENDING, JobStatus.RUNNING  # the members looked up once, not per job
        for j in self.jobs:
            if j.status == is_pending:
                pending.append(j)
            elif j.status == is_running:
                running.append(j)
                if j.elastic:
                    elastic.append(j)
        order = self.order
        pending.sort(key=lambda j: (j.priority_rank, order.get(j.id, ()), j.submitted_at, j.id))
        self._memo["pending"], self._memo["running"], self._memo["elastic"] = pending, running, elastic

    def pending(self) -> list[JobView]:
        """Pending jobs in admission order: priority, then the queue order's key, then submission time."""
        if "pending" not in self._memo:
            self._by_status()
        return list(self._memo["pending"])

    def running(self) -> list[JobView]:
        if "running" not in self._memo:
            self._by_status()
        return list(self._memo["running"])

    def running_elastic(self) -> list[JobView]:
        """The running jobs that are elastic, in `running()`'s order."""
        if "elastic" not in self._memo:
            self._by_status()
        return list(self._memo["elastic"])

    def team_usage(self) -> dict[str, TeamUsage]:
        """Devices and jobs each team holds now (a copy: callers may add what they admit)."""
        if not hasattr(self, "_usage"):
            gpus: dict[str, int] = {}
            jobs: dict[str, int] = {}
            for job in self.jobs:
                if job.holds_gpus:
                    gpus[job.team] = gpus.get(job.team, 0) + job.gpu_count
                    jobs[job.team] = jobs.get(job.team, 0) + 1
            object.__setattr__(self, "_usage", {t: TeamUsage(gpus=gpus[t], running_jobs=jobs[t]) for t in gpus})
        return dict(self._usage)

    def user_usage(self) -> dict[tuple[str, str], TeamUsage]:
        """Devices and jobs each (team, user) holds now (a copy, like team_usage)."""
        if "user_usage" not in self._memo:  # once per snapshot: several rules ask
            gpus: dict[tuple[str, str], int] = {}
            jobs: dict[tuple[str, str], int] = {}
            for job in self.jobs:
                if job.holds_gpus:
                    user = (job.team, job.owner)
                    gpus[user] = gpus.get(user, 0) + job.gpu_count
                    jobs[user] = jobs.get(user, 0) + 1
            self._memo["user_usage"] = {u: TeamUsage(gpus=gpus[u], running_jobs=jobs[u]) for u in gpus}
        return dict(self._memo["user_usage"])

    def gpu_headroom(self, job: JobView) -> int | None:
        """How many more devices the job's team and user may take now (None: no limit)."""
        return gpu_headroom(
            self.quotas.get(job.team),
            self.team_usage().get(job.team, TeamUsage()),
            self.user_usage().get((job.team, job.owner), TeamUsage()),
        )
