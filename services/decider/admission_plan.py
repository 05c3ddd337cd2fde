"""The admission plan every queue-related rule replays: the pending jobs in the snapshot's queue
order (priority level first) placed in turn on the free devices, gang and topology-aware, each
one left waiting with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.decider.free_devices import FreeDevices
from services.decider.placement import Choice, fits_anywhere, place
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.specs.quota import TeamUsage, over_quota


@dataclass(frozen=True)
class Admitted:
    job: JobView
    choice: Choice
    position: int
    free_before: dict[str, int]


@dataclass
class AdmissionPlan:
    """The queue replayed in admission order over the free devices."""

    admitted: list[Admitted] = field(default_factory=list)
    waiting: list[JobView] = field(default_factory=list)  # do not fit now; making room would help
    reasons: dict[str, str] = field(default_factory=dict)  # every job left pending, and why
    free: FreeDevices = field(default_factory=lambda: FreeDevices({}))


def plan_admission(
    snapshot: Snapshot, *, backfill: str = "within_level", aggregate_fragments: bool = True
) -> AdmissionPlan:
    """Admit pending jobs in the snapshot's queue order (priority level first), gang, topology-aware.

    Several rules replay the same plan over the same snapshot: it is computed once per snapshot
    and each caller gets its own copy to book into.
    """
    key = ("plan_admission", backfill, aggregate_fragments)
    plan = snapshot._memo.get(key)
    if plan is None:
        plan = _plan_admission(snapshot, backfill, aggregate_fragments)
        snapshot._memo[key] = plan
    return AdmissionPlan(list(plan.admitted), list(plan.waiting), dict(plan.reasons), plan.free.copy())


def _plan_admission(snapshot: Snapshot, backfill: str, aggregate_fragments: bool) -> AdmissionPlan:
    """Admit pending jobs in priority order, then queue order (FIFO by default), gang, topology-aware.

    A job that does not fit does not block smaller jobs of its own level behind it (backfill);
    with backfill="within_level" it does hold back jobs of lower levels, so the devices that
    free up go to it first. A team over its quota waits with the quota's reason.
    """
    plan = AdmissionPlan(free=FreeDevices.of(snapshot))
    quotas = bool(snapshot.quotas)  # without any, nobody is over one: usage is not worth counting
    usage = snapshot.team_usage() if quotas else {}
    users = snapshot.user_usage() if quotas else {}
    blocking_rank: int | None = None
    # Whether a job fits, and its reason, rest on its size and multi_node alone while nothing is booked:
    # a size that did not fit is not placed again until the next booking (most of a backlog waits), which
    # changes the reason's "most free".
    unfit: dict[tuple[int, bool], tuple[str, bool]] = {}  # (gpus, multi_node) -> (its reason, fits_anywhere)
    for position, job in enumerate(snapshot.pending(), start=1):
        quota_reason = (
            over_quota(
                snapshot.quotas.get(job.team),
                usage.get(job.team, TeamUsage()),
                job.gpus,
                job.owner,
                users.get((job.team, job.owner), TeamUsage()),
            )
            if quotas
            else None
        )
        if quota_reason:
            plan.reasons[job.id] = Reason(ReasonCode.PENDING_OVER_QUOTA, f"over quota: {quota_reason}")
            continue
        if backfill == "within_level" and blocking_rank is not None and job.priority_rank > blocking_rank:
            head = next(w for w in plan.waiting if w.priority_rank == blocking_rank)
            plan.reasons[job.id] = Reason(
                ReasonCode.PENDING_BEHIND_HIGHER_PRIORITY,
                f"held behind higher-priority job {head.id} ({head.priority}), which waits for {head.gpus} device(s)",
            )
            continue
        size = (job.gpus, job.multi_node)
        known = unfit.get(size)
        if known is None:
            choice = place(
                job.gpus, plan.free, snapshot.nodes, multi_node=job.multi_node, whole_nodes=not aggregate_fragments
            )
            if choice is None:
                most_node, most = plan.free.most()
                reason = (
                    f"no node has {job.gpus} free device(s) (most free: {most_node} with {most})"
                    if snapshot.nodes
                    else "no nodes are registered"
                )
                code = ReasonCode.PENDING_NO_FREE_DEVICES if snapshot.nodes else ReasonCode.PENDING_NO_NODES
                anywhere = fits_anywhere(job, snapshot)
                if not anywhere and snapshot.nodes:
                    reason += "; it needs more devices than any schedulable node has"
                    code = ReasonCode.PENDING_NEVER_FITS
                known = unfit[size] = (Reason(code, reason), anywhere)
        if known is not None:
            plan.reasons[job.id], anywhere = known
            if anywhere:
                plan.waiting.append(job)
                if blocking_rank is None:
                    blocking_rank = job.priority_rank
            continue
        before = {n: len(d) for n, d in plan.free.free.items()}  # placing takes nothing: as it was before
        plan.free.book(choice.placement)
        unfit.clear()
        plan.admitted.append(Admitted(job, choice, position, before))
        if not quotas:
            continue
        u = usage.get(job.team, TeamUsage())
        usage[job.team] = TeamUsage(gpus=u.gpus + job.gpus, running_jobs=u.running_jobs + 1)
        u = users.get((job.team, job.owner), TeamUsage())
        users[(job.team, job.owner)] = TeamUsage(gpus=u.gpus + job.gpus, running_jobs=u.running_jobs + 1)
    return plan
