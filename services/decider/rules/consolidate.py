"""consolidate: move a job that spans nodes onto one node once one has room for it.

Design note. A job that allows multi-node may have been started across nodes because no node
had room then (fragments aggregated); its collectives then cross the network for as long as it
runs. When nobody waits (after replaying admission) and one node's free devices now hold the
whole job (same GPU model), migrate it there: the move costs a checkpoint and a restart, so only
jobs with at least `min_remaining_s` of estimated work left are moved (remaining steps times
their reported step time; a job without `max_steps` or without a reported step time is left
alone), at most `max_moves` per pass, the longest remaining first. The cooldown keeps a job
from being moved again soon. comm_jitter moves jobs whose measured latency is erratic; this rule
needs no telemetry: a tighter placement is better whether or not the network is noisy yet.
"""

from __future__ import annotations

from services.decider.admission_plan import plan_admission
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Migrate
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import Consolidate

NAME = "consolidate"


def decide(snapshot: Snapshot, config: Consolidate) -> RuleOutput:
    plan = plan_admission(snapshot)
    if plan.waiting or plan.admitted:
        return RuleOutput([])  # free devices belong to the queue first
    free = plan.free
    spread = []
    for job in snapshot.running():
        if len(job.placement) < 2:
            continue  # on one node already (most jobs): nothing to work out
        left = job.remaining_steps()
        if left is None or not job.step_time_s:
            continue
        if left * job.step_time_s >= config.min_remaining_s:
            spread.append((left * job.step_time_s, job))
    actions = []
    for remaining_s, job in sorted(spread, key=lambda x: (-x[0], x[1].id)):
        if len(actions) == config.max_moves:
            break
        first = job.placement[0]
        model = snapshot.nodes[first.node].gpu(first.gpus[0]).model if first.node in snapshot.nodes else ""
        target = place(
            job.gpu_count,
            free,
            snapshot.nodes,
            eligible=lambda n, g: snapshot.nodes[n].gpu(g).model == model,  # noqa: B023 (place calls it at once)
        )
        if target is None:
            continue
        free.book(target.placement)
        actions.append(
            Migrate(
                job_id=job.id,
                placement=list(target.placement),
                reason_code=ReasonCode.CONSOLIDATE_MIGRATE,
                reason=(
                    f"{job.id} spans {len(job.placement)} nodes and has about {remaining_s / 3600:.1f} h of work left; "
                    f"{target.describe()} now has room for all {job.gpu_count} device(s): move it onto one node"
                ),
                evidence={
                    "from_nodes": list(job.nodes()),
                    "target": [p.model_dump() for p in target.placement],
                    "remaining_s": round(remaining_s, 1),
                    "min_remaining_s": config.min_remaining_s,
                },
            )
        )
    return RuleOutput(actions)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=Consolidate,
    precedence=65,
    description="move a job spanning nodes onto one node once one has room, when nobody waits",
)
