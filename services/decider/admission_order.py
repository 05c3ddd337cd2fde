"""The order in which pending jobs of one priority level are admitted, and what it is built on.

Levels always come first (`priority_rank`); inside a level the queue order decides who gets
devices first. Methods:
- `fifo`: submission order (the seeds' way, and the default without a config).
- `las`: Tiresias-style discretized least attained service: a job's attained GPU-seconds (steps
  done x step time x devices, from its progress events) put it in one of a few queues split at
  `las_thresholds_gpu_s`; lower queues first, FIFO inside a queue. Needs no knowledge of a job's length.
- `shortest_remaining`: least estimated remaining work first. A fine-tune declares `max_steps`;
  once it runs, its trainer reports `step` and `step_time_s`, so remaining work is
  (max_steps - step) x step time x devices. Before its first progress event a job's step time is
  estimated by the median of the step times the running jobs report (or `default_step_s`).
  A job without `max_steps` is estimated as unbounded and keeps FIFO among such jobs.

The order is computed once per pass, when the snapshot is built (`Snapshot.order`), so every
rule that replays admission sees the same queue. The `queue_order` rule is its preemptive half.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from services.decider.plugin import section_config
from services.decider.snapshot import JobView
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import QueueOrder
from shared.infra.config import AdcConfig

NAME = "queue_order"


def configured(config: AdcConfig) -> QueueOrder:
    return section_config(config, NAME, QueueOrder)


def attained_gpu_s(job: JobView) -> float:
    """GPU-seconds of training the job has had, from its progress (0 before the first event)."""
    if not job.step or not job.step_time_s:
        return 0.0
    return job.step * job.step_time_s * (job.gpu_count or job.gpus)


_reported: tuple | None = None  # (jobs, the step times their running jobs report, sorted) of the last call


def typical_step_s(jobs: Iterable[JobView], default: float) -> float:
    """The median step time the running jobs report (`default` when none has). Asked by the snapshot's
    queue order and by several rules over the same snapshot's jobs: worked out once per tuple of jobs."""
    global _reported
    known = _reported
    if known is not None and known[0] is jobs:
        times = known[1]
    else:
        running = JobStatus.RUNNING  # once: an enum member's lookup costs more than the comparison
        times = sorted([j.step_time_s for j in jobs if j.step_time_s and j.status == running])
        if isinstance(jobs, tuple):  # immutable: the same tuple always has the same answer
            _reported = (jobs, times)
    if not times:
        return default
    # statistics.median of the sorted times, as it works it out.
    n = len(times)
    return times[n // 2] if n % 2 == 1 else (times[n // 2 - 1] + times[n // 2]) / 2


def remember_step_times(jobs: tuple[JobView, ...], times: list[float]) -> None:
    """Hand `typical_step_s` what it would gather from these jobs: the step times their running jobs
    report, sorted (no NaN among them). For a caller that follows them as views change (the simulator),
    so a pass does not loop over every job for them."""
    global _reported
    _reported = (jobs, times)


def remaining_gpu_s(job: JobView, typical_s: float) -> float:
    """Estimated GPU-seconds still to train; inf when the job does not declare max_steps.

    With a reported step time the answer depends on the view alone, so it is kept on the view
    (views outlive passes while their job does not change)."""
    known = job.__dict__.get("_left_gpu_s")  # only ever kept for a view with a reported step time
    if known is not None:
        return known
    if job.step_time_s:
        left = job.remaining_steps()
        known = math.inf if left is None else left * job.step_time_s * (job.gpu_count or job.gpus)
        object.__setattr__(job, "_left_gpu_s", known)
        return known
    left = job.remaining_steps()
    if left is None:
        return math.inf
    return left * (job.step_time_s or typical_s) * (job.gpu_count or job.gpus)


def las_queue(job: JobView, thresholds: list[float]) -> int:
    attained = attained_gpu_s(job)
    return sum(attained >= t for t in thresholds)


class Keys:
    """Each job's place in the queue order, for pending and running jobs alike."""

    def __init__(self, config: QueueOrder, jobs: Iterable[JobView]) -> None:
        self.config = config
        self.jobs = tuple(jobs)
        self._typical_s: float | None = None
        self._known: dict[str, tuple[JobView, tuple]] = {}  # job id -> (the view asked about, its key)

    @property
    def typical_s(self) -> float:
        """The typical step time of these jobs, worked out when first asked for: in about half the
        passes of a busy Philly day no job in question lacks a step time of its own, and nobody asks."""
        if self._typical_s is None:
            self._typical_s = typical_step_s(self.jobs, self.config.default_step_s)
        return self._typical_s

    def remaining(self, job: JobView) -> float:
        """`remaining_gpu_s`, asking for the typical step time only for a job without one of its own."""
        return remaining_gpu_s(job, 0.0 if job.step_time_s else self.typical_s)

    def key(self, job: JobView) -> tuple:
        known = self._known.get(job.id)
        if known is not None and known[0] is job:
            return known[1]
        method = self.config.method
        if method == "las":
            key = (las_queue(job, self.config.las_thresholds_gpu_s),)
        elif method == "shortest_remaining":
            key = (self.remaining(job),)
        else:
            key = ()
        self._known[job.id] = (job, key)
        return key


def admission_order(config: AdcConfig, jobs: Iterable[JobView]) -> dict[str, tuple]:
    """Sort keys of the pending jobs, for `Snapshot.order` (empty for FIFO or a disabled rule)."""
    try:
        typed = configured(config)
    except ValueError:
        return {}  # the engine reports the config problem as the rule's; admission stays FIFO
    jobs = tuple(jobs)
    if not typed.enabled or typed.method == "fifo":
        return {}
    keys = Keys(typed, jobs)
    pending = JobStatus.PENDING
    return {j.id: keys.key(j) for j in jobs if j.status == pending}
