"""defragmentation: migrate a small job when that lets a waiting large job fit.

Design note. Free devices scattered over nodes can add up to enough for a waiting job that
still fits on no single node. For each waiting job (admission order, after replaying
admission) whose size fits the cluster's free total, this rule looks for one running job of
at most `max_move_gpus` devices on some node X such that X's free devices plus that job's
make room for the waiting one, and the small job itself fits on another node (same GPU
model, tightest topology). Among such moves it picks the one losing the least progress (and
never one losing more than `max_lost_s`). One migrate per waiting job, named in `for_job`;
it comes before preemption in arbitration, since a move loses less than a requeue.
"""

from __future__ import annotations

from services.decider.admission_plan import plan_admission
from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import Migrate
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.contracts.strategies import Defragmentation

NAME = "defragmentation"


def decide(snapshot: Snapshot, config: Defragmentation) -> RuleOutput:
    plan = plan_admission(snapshot)
    free = plan.free
    actions, pending, moved = [], {}, set()
    none_for: set[tuple[int, bool]] = set()  # sizes no move helps, until a move changes what is free
    movable: list[JobView] | None = None  # running one-node jobs small enough to move, listed once (in running order)
    for job in plan.waiting:
        if job.gpus > free.total():
            continue
        size = (job.gpus, job.multi_node)  # all _best_move asks of the waiting job
        if size in none_for:
            continue
        if movable is None:
            movable = [s for s in snapshot.running() if s.gpu_count <= config.max_move_gpus and len(s.placement) == 1]
        move = _best_move(snapshot, job, free, moved, config, movable)
        if move is None:
            none_for.add(size)
            continue
        none_for.clear()
        small, target, node = move
        moved.add(small.id)
        free.book(target.placement)
        free.release(small.placement)
        room = place(job.gpus, free, snapshot.nodes, multi_node=job.multi_node)
        if room is not None:
            free.book(room.placement)
        pending[job.id] = Reason(
            ReasonCode.PENDING_MAKING_ROOM, f"making room for it on {node}: moving {small.id} to {target.describe()}"
        )
        actions.append(
            Migrate(
                job_id=small.id,
                placement=list(target.placement),
                reason_code=ReasonCode.DEFRAG_MIGRATE,
                reason=(
                    f"job {job.id} needs {job.gpus} device(s) and no node has them free; moving {small.id} "
                    f"({small.gpu_count} device(s)) from {node} to {target.describe()} frees enough on {node}"
                ),
                evidence={
                    "for_job": job.id,
                    "gpus_needed": job.gpus,
                    "freed_node": node,
                    "free_before": {n: len(d) for n, d in plan.free.free.items()},
                    "target": [p.model_dump() for p in target.placement],
                    "lost_s": round(small.lost_progress_s(snapshot.ts), 1),
                },
            )
        )
    return RuleOutput(actions, pending)


def _best_move(
    snapshot: Snapshot,
    job: JobView,
    free: FreeDevices,
    moved: set[str],
    config: Defragmentation,
    movable: list[JobView],
):
    best = None
    for small in movable:
        if small.id in moved:
            continue
        node = small.placement[0].node
        if free.count(node) + small.gpu_count < job.gpus or node not in snapshot.nodes:
            continue  # tested before the lost progress: on a busy cluster most nodes fail here
        if small.lost_progress_s(snapshot.ts) > config.max_lost_s:
            continue
        model = snapshot.nodes[node].gpu(small.placement[0].gpus[0]).model
        target = place(
            small.gpu_count,
            free,
            snapshot.nodes,
            exclude={node},
            eligible=lambda n, g: snapshot.nodes[n].gpu(g).model == model,  # noqa: B023 (place calls it at once)
        )
        if target is None:
            continue
        trial = free.copy()
        trial.book(target.placement)
        trial.release(small.placement)
        if place(job.gpus, trial, snapshot.nodes, multi_node=job.multi_node) is None:
            continue
        cost = (small.lost_progress_s(snapshot.ts), small.gpu_count, small.id)
        if best is None or cost < best[0]:
            best = (cost, small, target, node)
    return best[1:] if best else None


RULE = Rule(
    name=NAME,
    decide=decide,
    config=Defragmentation,
    precedence=30,
    description="migrate a small job when that lets a waiting large job fit",
)
