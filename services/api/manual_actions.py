"""Manual actions: the same path as the decider's decisions, audited with the actor.

The api never acts itself: it publishes a Decision (rule "manual", actor set) to ADC_DECISIONS,
and the executor carries it out and arbitrates it like any other, refusing what conflicts. A move
names no devices, so it is recorded as a request that the decider completes (`move_requests`);
a drain only marks the node draining, and the decider moves its jobs off.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from services.api.auth import Principal, authenticate, require
from shared.contracts.actions import Cordon, Drain, Pause, Resume, Uncordon
from shared.contracts.messages import AuditEvent, Decision
from shared.contracts.reason_codes import ReasonCode
from shared.infra import tracing
from shared.infra.job_reads import one_job

router = APIRouter(tags=["manual actions"])


class MigrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target_node: str | None = Field(
        None, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$", description="default: any other node with room"
    )


async def _publish(request: Request, who: Principal, action, subject_id: str) -> dict:
    app = request.app.state
    action = action.model_copy(update={"reason_code": ReasonCode.MANUAL})
    decision = Decision(
        decision_id=uuid.uuid4().hex,
        ts=app.clock.now(),
        rule="manual",
        action=action,
        snapshot_ts=app.clock.now(),
        actor=who.actor,
    )
    # A job's manual decision is in the job's trace, as the decider's are, linked both ways with the
    # operator's request (a trace of its own); a node's stays in the request's trace.
    job_id = getattr(action, "job_id", None)
    job_trace = await tracing.job_context(app.pool, job_id) if job_id else None
    asked = tracing.current_span()
    with tracing.span(
        "api",
        f"decide {action.action}",
        parent=job_trace,
        links=[asked] if job_trace else [],
        job_id=job_id,
        decision_id=decision.decision_id,
        rule="manual",
        actor=who.actor,
    ):
        decided = tracing.current_span()
        await _announce(app, who, action, subject_id, decision)
    tracing.link_current(decided, link="the decision this request became", decision_id=decision.decision_id)
    return {"decision_id": decision.decision_id, "action": action.action, "accepted": True}


async def _announce(app, who: Principal, action, subject_id: str, decision: Decision) -> None:
    await app.bus.audit(
        AuditEvent(
            event_id=f"{decision.decision_id}:decided",
            ts=decision.ts,
            source="api",
            kind="decision",
            actor=who.actor,
            job_id=getattr(action, "job_id", None) if not subject_id.startswith("node:") else None,
            node=getattr(action, "node", None),
            decision_id=decision.decision_id,
            rule="manual",
            action=action.action,
            reason=action.reason,
            data={"reason_code": action.reason_code},
        )
    )
    await app.bus.publish_js(app.bus.subjects.decisions, decision, decision.decision_id)


async def _job_for(request: Request, job_id: str, who: Principal) -> one_job.ActionTarget:
    row = await one_job.action_target(request.app.state.pool, job_id)
    if row is None or not who.may_act_on_team(row.team):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return row


async def _node(request: Request, node: str):
    row = await request.app.state.pool.fetchrow("SELECT id, status FROM nodes WHERE id = $1", node)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {node!r}")
    return row


@router.post("/v1/jobs/{job_id}/pause", status_code=202, summary="Checkpoint a running job and hold it")
async def pause_job(request: Request, job_id: str, who: Principal = Depends(authenticate)):
    job = await _job_for(request, job_id, who)
    if job.status != "running":
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {job.status}; only a running job can be paused")
    return await _publish(request, who, Pause(job_id=job_id, reason=f"paused by {who.name}"), job_id)


@router.post("/v1/jobs/{job_id}/resume", status_code=202, summary="Queue a paused job to continue from its checkpoint")
async def resume_job(request: Request, job_id: str, who: Principal = Depends(authenticate)):
    job = await _job_for(request, job_id, who)
    if job.status != "paused":
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {job.status}, not paused")
    return await _publish(request, who, Resume(job_id=job_id, reason=f"resumed by {who.name}"), job_id)


@router.post("/v1/jobs/{job_id}/migrate", status_code=202, summary="Move a running job without losing a step")
async def migrate_job(
    request: Request,
    job_id: str,
    body: MigrateRequest | None = None,
    who: Principal = Depends(require("operator", "admin")),
):
    job = await _job_for(request, job_id, who)
    if job.status != "running":
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {job.status}; only a running job can move")
    target = body.target_node if body else None
    if target:
        await _node(request, target)
    where = f"to {target}" if target else "to any node with room"
    # A request, not a decision: which devices it lands on is the decider's choice (its `drain` rule).
    app = request.app.state
    request_id = uuid.uuid4().hex
    reason = f"{who.name} asked to migrate it {where}"
    async with app.pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO move_requests (id, job_id, target_node, actor, reason, trace_parent)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            request_id,
            job_id,
            target,
            who.actor,
            reason,
            tracing.traceparent(),  # this request's span: the decision made of it links it
        )
        await app.bus.audit(
            AuditEvent(
                event_id=f"{request_id}:requested",
                ts=app.clock.now(),
                source="api",
                kind="job.move_requested",
                actor=who.actor,
                job_id=job_id,
                node=target,
                action="migrate",
                reason=reason,
                data={"request_id": request_id, "target_node": target, "reason_code": ReasonCode.MANUAL},
            )
        )
    # The decider turns the request into a decision later, in the job's trace: linked from here, and
    # that decision's span links back to this one.
    job_trace = tracing.context_span(await tracing.job_context(app.pool, job_id))
    tracing.link_current(job_trace, link="the job's trace, where its decision follows", request_id=request_id)
    return {"request_id": request_id, "action": "migrate", "accepted": True}


@router.post("/v1/nodes/{node}/cordon", status_code=202, summary="Place no new work on a node")
async def cordon_node(request: Request, node: str, who: Principal = Depends(require("operator", "admin"))):
    await _node(request, node)
    return await _publish(request, who, Cordon(node=node, reason=f"cordoned by {who.name}"), f"node:{node}")


@router.post("/v1/nodes/{node}/uncordon", status_code=202, summary="Let a cordoned node take work again")
async def uncordon_node(request: Request, node: str, who: Principal = Depends(require("operator", "admin"))):
    await _node(request, node)
    return await _publish(request, who, Uncordon(node=node, reason=f"uncordoned by {who.name}"), f"node:{node}")


@router.post("/v1/nodes/{node}/drain", status_code=202, summary="Move every job off a node losslessly, then cordon it")
async def drain_node(request: Request, node: str, who: Principal = Depends(require("operator", "admin"))):
    await _node(request, node)
    return await _publish(
        request, who, Drain(node=node, reason=f"drain asked by {who.name} (maintenance)"), f"node:{node}"
    )
