"""priority_scheduling: make room for a job of a higher level that cannot fit.

Design note. Admission itself is the `priority_fifo` rule; this rule replays the same
admission plan and looks at the jobs it leaves waiting, highest level first. For each it looks
at running jobs of strictly lower levels, cheapest first: the fewest GPU-hours of progress lost
since their last checkpoint, then the newest checkpoint, then the lowest level. Each candidate
gives up devices the least harmful way it can: an elastic job is shrunk, just enough and never
below its floor (its `min_gpus`, and never below its level's `min_gpus`), and keeps running; otherwise a preemptible job
is checkpointed and requeued (`preempt`) and resumes later from that checkpoint. A
non-preemptible job is never preempted, and a job this rule made give way less than its
`cooldown_s` ago is left alone (arbitration would refuse acting on it again): the next cheapest is
asked instead, so a burst of high-priority jobs does not wait out the cooldown. Candidates are
added until the waiting job fits (gang, same topology rules as admission); then any that turn
out not to be needed are dropped. Every
action names the job it makes room for (`for_job` in the evidence), so arbitration takes all
of them or none, and the freed devices are counted as that job's for later waiting jobs.
A schedule can switch this rule off (e.g. no preemption at night).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.decider.admission_plan import plan_admission
from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import NodeGpus, Preempt, Scale
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.contracts.strategies import PriorityScheduling

NAME = "priority_scheduling"


@dataclass(frozen=True)
class Yield:
    """What one running job gives up: shrink to `keep` (a Scale) or everything (a Preempt)."""

    job: JobView
    keep: tuple[NodeGpus, ...] | None

    @property
    def freed(self) -> list[NodeGpus]:
        if self.keep is None:
            return list(self.job.placement)
        kept = {(p.node, g) for p in self.keep for g in p.gpus}
        return [
            NodeGpus(node=p.node, gpus=tuple(g for g in p.gpus if (p.node, g) not in kept)) for p in self.job.placement
        ]


def decide(snapshot: Snapshot, config: PriorityScheduling) -> RuleOutput:
    plan = plan_admission(snapshot)
    free = plan.free
    taken: set[str] = set()
    actions, pending = [], {}
    ranked: list[JobView] | None = None  # sorted once, when a waiting job first has lower levels to ask
    # The levels as a set, then their max: cheaper than a generator over every running job.
    lowest = max({v.priority_rank for v in snapshot.running() if v.placement}, default=None) if plan.waiting else None
    for job in plan.waiting:
        if lowest is None or job.priority_rank >= lowest:
            continue  # no running job of a lower level: nobody to make room
        if ranked is None:
            ranked = _by_cost(snapshot)
        yields = _make_room(snapshot, job, free, taken, config, ranked)
        if not yields:
            cooling = [
                v.id for v in ranked if v.id in snapshot.leave_alone(NAME) and v.priority_rank > job.priority_rank
            ]
            if cooling:
                pending[job.id] = Reason(
                    ReasonCode.PENDING_VICTIMS_COOLING,
                    f"no lower-level job can make room now; {', '.join(cooling[:4])}"
                    f"{' and others' if len(cooling) > 4 else ''} gave way within the last "
                    f"{config.cooldown_s:g} s and are left alone until then",
                )
            continue
        pending[job.id] = Reason(
            ReasonCode.PENDING_MAKING_ROOM,
            "making room for it: "
            + ", ".join(
                f"{'shrinking' if y.keep is not None else 'preempting'} {y.job.id} ({y.job.priority})" for y in yields
            ),
        )
        for y in yields:
            taken.add(y.job.id)
            free.release(y.freed)
            actions.append(_action(snapshot, job, y, yields, config))
        fitted = place(job.gpus, free, snapshot.nodes, multi_node=job.multi_node)
        if fitted is not None:  # the freed devices are this job's: later waiting jobs must not count on them
            free.book(fitted.placement)
    return RuleOutput(actions, pending)


def _action(snapshot: Snapshot, job: JobView, y: Yield, group: list[Yield], config: PriorityScheduling):
    victim = y.job
    lost_h = victim.lost_gpu_hours(snapshot.ts)
    evidence = {
        "for_job": job.id,
        "for_priority": job.priority,
        "gpus_needed": job.gpus,
        "victim_priority": victim.priority,
        "victim_gpus": victim.gpu_count,
        "lost_gpu_hours": round(lost_h, 4),
        "last_checkpoint_step": victim.last_checkpoint_step,
        "group": [g.job.id for g in group],
    }
    why = (
        f"job {job.id} (priority {job.priority}) needs {job.gpus} device(s) and cannot fit; "
        f"{victim.id} (priority {victim.priority}) loses the least ({lost_h:.3f} GPU-hours since its last checkpoint)"
    )
    if y.keep is not None:
        n = sum(len(p.gpus) for p in y.keep)
        return Scale(
            job_id=victim.id,
            placement=list(y.keep),
            reason_code=ReasonCode.PRIORITY_SHRINK,
            reason=f"{why}: shrink it from {victim.gpu_count} to {n} device(s) (floor {_floor(victim, config)})",
            evidence=evidence | {"to_gpus": n},
        )
    return Preempt(
        job_id=victim.id,
        reason_code=ReasonCode.PRIORITY_PREEMPT,
        reason=f"{why}: checkpoint and requeue",
        evidence=evidence,
    )


def _floor(job: JobView, config: PriorityScheduling) -> int:
    try:
        level_min = config.level(job.priority).min_gpus
    except ValueError:
        level_min = 0
    return min(job.gpu_count, max(job.floor, level_min))


def _yield_of(job: JobView, config: PriorityScheduling, escalate: bool) -> Yield | None:
    floor = _floor(job, config)
    if job.elastic and floor < job.gpu_count and not (escalate and job.preemptible):
        return Yield(job, job.shrunk_to(floor))
    if job.preemptible:
        return Yield(job, None)
    return None


def _by_cost(snapshot: Snapshot) -> list[JobView]:
    """Running jobs with devices, cheapest to displace first: the fewest GPU-hours lost since their
    checkpoint, then the newest checkpoint, then the lowest level (sorted once a pass)."""
    return sorted(
        (v for v in snapshot.running() if v.placement),
        key=lambda v: (v.lost_gpu_hours(snapshot.ts), -(v.last_checkpoint_at or 0.0), -v.priority_rank, v.id),
    )


def _make_room(
    snapshot: Snapshot,
    job: JobView,
    free: FreeDevices,
    taken: set[str],
    config: PriorityScheduling,
    ranked: list[JobView] | None = None,
) -> list[Yield] | None:
    cooling = snapshot.leave_alone(NAME)  # made to give way within the cooldown: left alone, others asked instead
    candidates = [
        v
        for v in (ranked if ranked is not None else _by_cost(snapshot))
        if v.priority_rank > job.priority_rank and v.id not in taken and v.id not in cooling
    ]
    # First shrinking elastic jobs where that can do; if it cannot, preempting them too.
    for escalate in (False, True):
        trial = free.copy()
        chosen: list[Yield] = []
        for candidate in candidates:
            y = _yield_of(candidate, config, escalate)
            if y is None:
                continue
            if len(chosen) == config.max_victims:
                break
            if y.keep is not None:
                y = _least_shrink(snapshot, job, trial, y, config)
            chosen.append(y)
            trial.release(y.freed)
            if place(job.gpus, trial, snapshot.nodes, multi_node=job.multi_node) is not None:
                return _prune(snapshot, job, free, chosen)
    return None


def _least_shrink(snapshot: Snapshot, job: JobView, trial: FreeDevices, y: Yield, config: PriorityScheduling) -> Yield:
    """Shrink only as far as needed: the most devices kept (down to the floor) that still lets `job` fit."""
    victim = y.job
    for keep in range(victim.gpu_count - 1, _floor(victim, config), -1):
        partial = Yield(victim, victim.shrunk_to(keep))
        test = trial.copy()
        test.release(partial.freed)
        if place(job.gpus, test, snapshot.nodes, multi_node=job.multi_node) is not None:
            return partial
    return y


def _prune(snapshot: Snapshot, job: JobView, free: FreeDevices, chosen: list[Yield]) -> list[Yield]:
    """Drop the ones not needed after all, the costliest first."""
    kept = list(chosen)
    for y in sorted(chosen, key=lambda c: -c.job.lost_gpu_hours(snapshot.ts)):
        rest = [c for c in kept if c is not y]
        trial = free.copy()
        for c in rest:
            trial.release(c.freed)
        if place(job.gpus, trial, snapshot.nodes, multi_node=job.multi_node) is not None:
            kept = rest
    return kept


RULE = Rule(
    name=NAME,
    decide=decide,
    config=PriorityScheduling,
    precedence=50,
    description="make room for a higher-level job: shrink elastic, else preempt the cheapest lower-level jobs",
)
