"""priority_fifo: admit pending jobs in priority order, then FIFO, gang, topology-aware.

Design note. This is the admission half of the seed's priority scheduling (the preemption half
is the `priority_scheduling` rule). A job gets all its devices at once or waits. Placement
prefers one NVLink domain, then one node, then one rack; between equal choices, best fit (the
node left with the fewest free devices), which keeps large holes for large jobs. A job that
allows multi-node may aggregate free fragments across nodes. A job that does not fit does not
block smaller jobs of its level behind it (backfill), but holds back lower levels so freed
devices go to it first. A team over a `queue`-mode quota waits with the quota's reason. Every
job left waiting gets a plain-words pending reason, which `GET /v1/jobs/{id}` shows.
"""

from __future__ import annotations

from services.decider.admission_plan import plan_admission
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Start
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import PriorityFifo

NAME = "priority_fifo"


def decide(snapshot: Snapshot, config: PriorityFifo | None = None) -> RuleOutput:
    """Start actions for what fits now, and a pending reason for each job that waits."""
    config = config or PriorityFifo()
    plan = plan_admission(snapshot, backfill=config.backfill, aggregate_fragments=config.aggregate_fragments)
    actions = []
    for admitted in plan.admitted:
        job, choice = admitted.job, admitted.choice
        first = choice.placement[0]
        free_here = admitted.free_before.get(first.node, 0)
        fit = "best fit" if choice.nodes == 1 else "fragments aggregated across nodes"
        actions.append(
            Start(
                job_id=job.id,
                placement=list(choice.placement),
                resume_from=job.resume_from,
                reason_code=ReasonCode.ADMIT,
                reason=(
                    f"queue position {admitted.position} (priority {job.priority}, then submission order); "
                    f"node {first.node} has {free_here} free device(s), {job.gpus} needed: {fit}, "
                    f"{choice.describe()}"
                ),
                evidence={
                    "queue_position": admitted.position,
                    "priority": job.priority,
                    "gpus_needed": job.gpus,
                    "free_devices": admitted.free_before,
                    "chosen_node": first.node,
                    "devices": list(first.gpus),
                    "topology": choice.evidence(),
                },
            )
        )
    return RuleOutput(actions, plan.reasons)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=PriorityFifo,
    precedence=20,
    description="admission in priority order, FIFO within a level, gang, topology-aware placement",
)
