"""Job routes: submit, list, get, cancel. The api writes new jobs and cancel requests only."""
from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse

from services.api.auth import Principal, authenticate
from services.api.views import job_view
from shared.job_spec import JobSpec, SpecError, parse_document, validate_job
from shared.job_status import JobStatus
from shared.messages import AuditEvent, JobEvent

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_SPEC_SCHEMA = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
_SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "description": "An ADC job spec (JSON or YAML), or a bare LLaMA-Factory YAML config.",
        "content": {
            "application/json": {"schema": _SPEC_SCHEMA},
            "application/yaml": {"schema": _SPEC_SCHEMA},
        },
    }
}


def _unprocessable(errors: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": [{"type": "invalid", **e} for e in errors]})


async def _read_limited(request: Request) -> bytes:
    limit = request.app.state.config.api.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"body larger than {limit} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"body larger than {limit} bytes")
    return body


@router.post("", status_code=201, openapi_extra=_SUBMIT_BODY, summary="Submit a fine-tuning job")
async def submit_job(request: Request, who: Principal = Depends(authenticate)):
    app = request.app.state
    body = await _read_limited(request)
    try:
        doc = parse_document(body, request.headers.get("content-type", ""))
        spec, train = validate_job(doc, app.config, base_dir=app.data_root)
    except SpecError as err:
        return _unprocessable(err.errors)
    except UnicodeDecodeError:
        return _unprocessable([{"loc": ["body"], "msg": "body is not UTF-8 text"}])

    sched = app.config.strategies.priority_scheduling
    priority = spec.priority or sched.default
    level = sched.level(priority)
    preemptible = level.preemptible if spec.preemptible is None else spec.preemptible
    stored = spec.model_dump() | {"priority": priority, "preemptible": preemptible, "train": train}
    job_id = "j" + secrets.token_hex(8)
    now = app.clock.now()

    async with app.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *",
            job_id, spec.name, who.name, who.team, priority, sched.rank(priority), spec.gpus, preemptible, stored,
        )
        await conn.execute(
            "INSERT INTO job_status_history (job_id, old_status, new_status, reason) VALUES ($1, NULL, 'pending', 'submitted')",
            job_id,
        )
        # Published inside the transaction: if the bus is down nothing is queued and the caller sees 503.
        await app.bus.audit(AuditEvent(
            event_id=f"{job_id}:submitted", ts=now, source="api", kind="job.submitted", actor=who.actor,
            job_id=job_id, reason=f"{who.name} submitted {spec.name!r} ({spec.gpus} device(s), priority {priority})",
            data={"name": spec.name, "gpus": spec.gpus, "priority": priority, "team": who.team,
                  "model": train.get("model_name_or_path"), "finetuning_type": train.get("finetuning_type")},
        ))
        await app.bus.publish_js(
            app.bus.subjects.job_events(job_id),
            JobEvent(job_id=job_id, kind="submitted", ts=now, actor=who.actor), f"{job_id}:submitted",
        )
    return job_view(row)


async def _visible_job(request: Request, job_id: str, who: Principal):
    row = await request.app.state.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    if row is None or not who.may_act_on_team(row["team"]):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return row


@router.get("", summary="List jobs, newest first")
async def list_jobs(
    request: Request,
    who: Principal = Depends(authenticate),
    status_: JobStatus | None = Query(None, alias="status"),
    team: str | None = Query(None, max_length=64),
    limit: int = Query(50, ge=1, le=500),
    before: str | None = Query(None, max_length=32, description="cursor: the last id of the previous page"),
):
    where, args = [], []
    if not who.sees_all:
        args.append(who.team)
        where.append(f"team = ${len(args)}")
    elif team:
        args.append(team)
        where.append(f"team = ${len(args)}")
    if status_:
        args.append(status_.value)
        where.append(f"status = ${len(args)}")
    if before:
        args.append(before)
        where.append(f"(submitted_at, id) < (SELECT submitted_at, id FROM jobs WHERE id = ${len(args)})")
    args.append(limit)
    sql = ("SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
           + f" ORDER BY submitted_at DESC, id DESC LIMIT ${len(args)}")
    rows = await request.app.state.pool.fetch(sql, *args)
    items = [job_view(r) for r in rows]
    return {"items": items, "next": items[-1]["id"] if len(items) == limit else None}


@router.get("/{job_id}", summary="One job: status, placement, progress, output folder")
async def get_job(request: Request, job_id: str, who: Principal = Depends(authenticate)):
    return job_view(await _visible_job(request, job_id, who))


@router.post("/{job_id}/cancel", status_code=202, summary="Ask for a job to be cancelled")
async def cancel_job(request: Request, job_id: str, who: Principal = Depends(authenticate)):
    app = request.app.state
    row = await _visible_job(request, job_id, who)
    if JobStatus(row["status"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is already {row['status']}")
    now = app.clock.now()
    async with app.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow("UPDATE jobs SET cancel_requested = true WHERE id = $1 RETURNING *", job_id)
        await app.bus.audit(AuditEvent(
            event_id=f"{job_id}:cancel_requested", ts=now, source="api", kind="job.cancel_requested",
            actor=who.actor, job_id=job_id, reason=f"{who.name} asked to cancel the job",
        ))
        await app.bus.publish_js(
            app.bus.subjects.job_events(job_id),
            JobEvent(job_id=job_id, kind="cancel_requested", ts=now, actor=who.actor), f"{job_id}:cancel_requested",
        )
    return job_view(row)
