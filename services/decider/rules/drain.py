"""drain: moves people asked for, made complete. The executor only carries out whole placements.

Design note. Two kinds of request name no devices: an operator's `adc migrate JOB [--to NODE]`
(a row in `move_requests`) and `adc drain NODE` (the executor marks the node `draining`). This
rule chooses for both, with the same placement as admission (tightest topology, best fit): a
requested move goes to the named node, else to any other schedulable node with room, and waits
while none has room; every running job on a draining node moves elsewhere, or, when nowhere has
room, is checkpointed and requeued (nothing is lost either way); once nothing holds a device on
the draining node, it is cordoned. Jobs mid-start or mid-move are left until they settle. It
comes first in arbitration: what people asked for goes before what rules would like.
"""

from __future__ import annotations

from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import Cordon, Migrate, Preempt
from shared.contracts.job_status import JobStatus
from shared.contracts.node_status import NodeStatus
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import Drain

NAME = "drain"


def _target(job: JobView, free: FreeDevices, snapshot: Snapshot, only: str | None = None):
    exclude = set(job.nodes()) if only is None else set(snapshot.nodes) - {only}
    return place(job.gpu_count, free, snapshot.nodes, multi_node=job.multi_node, exclude=exclude)


def decide(snapshot: Snapshot, config: Drain) -> RuleOutput:
    draining = NodeStatus.DRAINING  # looked up once: most passes ask every node and find none
    nodes = sorted([n for n, v in snapshot.nodes.items() if v.status == draining])  # a list: cheaper than a generator
    if not snapshot.move_requests and not nodes:
        return RuleOutput([])
    free = FreeDevices.of(snapshot)
    actions = []
    for request in snapshot.move_requests:
        job = snapshot.job(request.job_id)
        if job is None or job.status != JobStatus.RUNNING:
            continue  # it ended or is moving already: nothing to answer until it runs
        choice = _target(job, free, snapshot, only=request.target_node)
        if choice is None:
            continue  # no room yet: the request stays open (for an hour) and is tried each pass
        free.book(choice.placement)
        where = ", ".join(f"{p.node}:{list(p.gpus)}" for p in choice.placement)
        actions.append(
            Migrate(
                job_id=job.id,
                placement=list(choice.placement),
                reason_code=ReasonCode.DRAIN_REQUESTED_MIGRATE,
                reason=f"{request.reason} (asked by {request.actor}): to {where}, {choice.describe()}",
                evidence={
                    "request_id": request.id,
                    "requested_by": request.actor,
                    "target_node": request.target_node,
                    "topology": choice.evidence(),
                }
                | ({"traceparent": request.trace_parent} if request.trace_parent else {}),  # the request's span
            )
        )
    for node in nodes:
        on_node = [j for j in snapshot.jobs if j.holds_gpus and node in j.nodes()]
        if not on_node:
            actions.append(
                Cordon(
                    node=node,
                    reason_code=ReasonCode.DRAIN_CORDON,
                    reason=f"drain of {node} done: no job holds a device there; cordoned",
                    evidence={"drained": node},
                )
            )
            continue
        for job in on_node:
            if job.status != JobStatus.RUNNING:
                continue  # mid-start or mid-move: look again once it settles
            choice = _target(job, free, snapshot)
            if choice is not None:
                free.book(choice.placement)
                actions.append(
                    Migrate(
                        job_id=job.id,
                        placement=list(choice.placement),
                        reason_code=ReasonCode.DRAIN_MIGRATE,
                        reason=f"drain of node {node}: moved to {choice.placement[0].node}, {choice.describe()}",
                        evidence={"drained": node},
                    )
                )
            else:
                actions.append(
                    Preempt(
                        job_id=job.id,
                        reason_code=ReasonCode.DRAIN_PREEMPT,
                        reason=f"drain of node {node}: no room elsewhere; checkpointed and requeued",
                        evidence={"drained": node},
                    )
                )
    return RuleOutput(actions)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=Drain,
    precedence=5,
    description="complete manual moves and drains: choose the target, or requeue; cordon a drained node",
)
