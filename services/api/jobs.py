"""Job routes: submit, list, get, cancel, export. The api records new jobs; status is the executor's alone."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path as Path_  # fastapi's Path is the route parameter
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.responses import JSONResponse

from services.api import job_refs, quotas, redaction
from services.api.audit_trail import record
from services.api.auth import Principal, authenticate
from services.api.errors import AUTHENTICATED, CONFLICT, NOT_FOUND, WITH_BODY, Problem, field_errors
from services.api.request_limits import unstorable
from services.api.views import JobOut, JobPage, job_view
from shared import tracing
from shared.job_spec import JobSpec, SpecError, parse_document, validate_job, wrap_bare_llamafactory
from shared.job_status import JobStatus
from shared.messages import AuditEvent, JobEvent
from shared.pending_reasons import pending_reason_fields
from shared.subjects import API_SOURCE
from shared.tenant_paths import CHECKPOINT_KEY, TenantRoots

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JOB_ID = Path(max_length=64, description="a job id, e.g. j0123456789abcdef")

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


def _decode(body: bytes, content_type: str, app) -> Any:
    doc = parse_document(body, content_type, app.config.api.spec_limits)  # its shape bounded before any check
    if problems := unstorable(doc):
        raise SpecError(problems)
    return wrap_bare_llamafactory(doc) if isinstance(doc, dict) else doc


async def checked(app, fn, *args):
    """fn(*args) off the event loop, bounded: a hostile body must not stall every other request. Raises
    SpecError for what is wrong with the body."""
    limit = app.config.api.validation_timeout_s
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout=limit)
    except TimeoutError:
        raise SpecError([{"loc": ["body"], "msg": f"the spec took over {limit} s to check; refused"}]) from None
    except (UnicodeDecodeError, RecursionError, ValueError) as err:
        if isinstance(err, SpecError):
            raise
        why = "body is not UTF-8 text" if isinstance(err, UnicodeDecodeError) else f"cannot decode the body: {err}"
        raise SpecError([{"loc": ["body"], "msg": why[:500]}]) from None


async def validated(app, who: Principal, doc: Any, lookup: job_refs.Lookup, chain_after: dict | None = None):
    """(spec, train, resolved references) of one decoded spec, or SpecError naming every problem."""
    roots = team_roots(app, who.team)
    refs = None
    if isinstance(doc, dict):
        refs = await job_refs.resolve(doc, roots, lookup, chain_after)
        if refs.errors:
            raise SpecError(refs.errors)
        doc, roots = refs.doc, refs.roots
    spec, train = await checked(app, validate_job, doc, app.config, app.data_root, roots)
    return spec, train, refs


def team_roots(app, team: str) -> TenantRoots:
    """The folders a team's jobs may read (tenancy in adc_config.yaml), resolved once per team: the api's
    config is fixed for its lifetime, and resolving every root (symlinks followed) cost a submission more
    than its own paths did."""
    cache = getattr(app, "tenant_roots", None)
    if cache is None:
        cache = app.tenant_roots = {}
    if (roots := cache.get(team)) is None:
        roots = cache[team] = TenantRoots.of(
            app.config.tenancy, team, app.data_root, Path_(app.config.storage.root).resolve()
        )
    return roots


async def foreign_checkpoint(conn, roots: TenantRoots, train: dict[str, Any]) -> list[dict] | None:
    """A resume_from_checkpoint in another team's job folder, refused as if it were outside the roots."""
    value = train.get(CHECKPOINT_KEY)
    other = roots.checkpoint_job(Path_(value)) if isinstance(value, str) else None
    if other is None or await conn.fetchval("SELECT team FROM jobs WHERE id = $1", other) == roots.team:
        return None
    return [
        {
            "loc": ["train", CHECKPOINT_KEY],
            "msg": f"{value!r} is not a checkpoint of team {roots.team!r}: it may resume from its own folders "
            f"({roots.describe(roots.own)}) and its own jobs' checkpoints under {roots.jobs_root}",
        }
    ]


class SubmittedJob(JobOut):
    quota_note: str | None = None


@router.post(
    "",
    status_code=201,
    openapi_extra=_SUBMIT_BODY,
    response_model=SubmittedJob,
    summary="Submit a fine-tuning job",
    responses=WITH_BODY | {429: {"model": Problem, "description": "over the team's quota, which says refuse"}},
)
async def submit_job(request: Request, who: Principal = Depends(authenticate)):
    app = request.app.state
    body = await request.body()
    try:
        doc = await checked(app, _decode, body, request.headers.get("content-type", ""), app)
        async with app.pool.acquire() as conn:
            spec, train, refs = await validated(app, who, doc, job_refs.Lookup(conn, who.team))
    except SpecError as err:
        return field_errors(err.errors)
    return await _queue_job(app, who, spec, train, audit_data=refs_audit(refs))


def refs_audit(refs: job_refs.Resolved | None) -> dict:
    """What the submission's audit event says of its references and of the job it waits for."""
    if refs is None:
        return {}
    return {**({"inputs": refs.inputs} if refs.inputs else {}), **({"after": refs.after} if refs.after else {})}


async def _queue_job(app, who: Principal, spec: JobSpec, train: dict[str, Any], audit_data: dict | None = None):
    """Admit (quotas), store and announce a checked job; the queued job's view or the refusal."""
    job_id = "j" + secrets.token_hex(8)
    tracing.annotate(service="api", job_id=job_id)
    async with app.pool.acquire() as conn, conn.transaction():
        stored = await store_job(conn, app, who, job_id, spec, train, audit_data)
        if isinstance(stored, JSONResponse):
            return stored
    await announce(app, who, job_id)
    return stored


async def store_job(
    conn, app, who: Principal, job_id: str, spec: JobSpec, train: dict[str, Any], audit_data: dict | None = None
) -> dict | JSONResponse:
    """Inside the caller's transaction: admit (quotas), insert and audit one checked job. Its view, or the
    refusal to answer with (the caller rolls back)."""
    sched = app.config.strategies.priority_scheduling
    priority = spec.priority or sched.default
    preemptible = sched.level(priority).preemptible if spec.preemptible is None else spec.preemptible
    stored = spec.model_dump(exclude={"after"} if spec.after is None else None) | {
        "priority": priority,
        "preemptible": preemptible,
        "train": train,
        **({"chain": audit_data["chain"]} if audit_data and audit_data.get("chain") else {}),
    }
    if foreign := await foreign_checkpoint(conn, team_roots(app, who.team), train):
        return field_errors(foreign)
    verdict = await quotas.admission(conn, who.team, priority, spec.gpus, who.name, spec.max_gpus)
    if verdict.invalid:
        return field_errors(verdict.invalid)
    if verdict.refused:
        await record(
            app,
            who,
            "job.refused",
            verdict.refused,
            action="submit",
            data={"name": spec.name, "gpus": spec.gpus, "priority": priority, "team": who.team},
        )
        return JSONResponse({"detail": verdict.refused}, status_code=status.HTTP_429_TOO_MANY_REQUESTS)
    row = await conn.fetchrow(
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, trace_parent)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING *",
        job_id,
        spec.name,
        who.name,
        who.team,
        priority,
        sched.rank(priority),
        spec.gpus,
        preemptible,
        stored,
        tracing.traceparent(),  # this request's span: the root of the job's trace
    )
    # Published inside the transaction: if the bus is down nothing is queued and the caller sees 503.
    await app.bus.audit(
        AuditEvent(
            event_id=f"{job_id}:submitted",
            ts=app.clock.now(),
            source="api",
            kind="job.submitted",
            actor=who.actor,
            job_id=job_id,
            reason=f"{who.name} submitted {spec.name!r} ({spec.gpus} device(s), priority {priority})"
            + (f", to run after {spec.after}" if spec.after else ""),
            data={
                "name": spec.name,
                "gpus": spec.gpus,
                "priority": priority,
                "team": who.team,
                "model": train.get("model_name_or_path"),
                "finetuning_type": train.get("finetuning_type"),
                **({"quota": verdict.queued} if verdict.queued else {}),
                **(audit_data or {}),
            },
        )
    )
    return job_view(row) | {"quota_note": verdict.queued}


async def announce(app, who: Principal, job_id: str) -> None:
    """After the commit: this event wakes the decider, which must then find the job in Postgres.
    If it is lost, the decider's next periodic pass finds the job all the same."""
    try:
        await app.bus.publish_js(
            app.bus.subjects.job_events(job_id, API_SOURCE),
            JobEvent(job_id=job_id, kind="submitted", ts=app.clock.now(), actor=who.actor),
            f"{job_id}:submitted",
        )
    except Exception as err:
        log.warning("job %s stored; its wake-up event was not published: %s", job_id, err)
    app.metrics.jobs_submitted.inc()


async def visible_job(request: Request, job_id: str, who: Principal):
    """The job, if it exists and the caller may see it (a user sees their own team's); else 404."""
    row = await request.app.state.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    if row is None or not who.may_act_on_team(row["team"]):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return row


@router.get("", response_model=JobPage, responses=AUTHENTICATED, summary="List jobs, newest first")
async def list_jobs(
    request: Request,
    who: Principal = Depends(authenticate),
    status_: JobStatus | None = Query(None, alias="status"),
    team: str | None = Query(None, max_length=64, description="operators and admins: any team; users: their own"),
    owner: str | None = Query(None, max_length=64, description="the token name that submitted it"),
    priority: str | None = Query(None, max_length=32),
    name: str | None = Query(None, max_length=64),
    limit: int = Query(50, ge=1, le=500),
    before: str | None = Query(None, max_length=64, description="cursor: the `next` of the previous page"),
):
    if not who.sees_all and team is not None and team != who.team:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"a user sees only their own team's jobs ({who.team})")
    filters: dict[str, Any] = {
        "team": who.team if not who.sees_all else team,
        "owner": owner,
        "priority": priority,
        "name": name,
        "status": status_.value if status_ else None,
    }
    where, args = [], []
    for column, value in filters.items():
        if value is not None:
            args.append(value)
            where.append(f"{column} = ${len(args)}")
    if before:
        args.append(before)
        where.append(f"(submitted_at, id) < (SELECT submitted_at, id FROM jobs WHERE id = ${len(args)})")
    args.append(limit)
    sql = (
        "SELECT * FROM jobs"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" ORDER BY submitted_at DESC, id DESC LIMIT ${len(args)}"
    )
    rows = await request.app.state.pool.fetch(sql, *args)
    items = await redaction.for_viewer(request.app.state.pool, who, [job_view(r) for r in rows])
    return {"items": items, "next": items[-1]["id"] if len(items) == limit else None}


@router.get(
    "/{job_id}",
    response_model=JobOut,
    responses=AUTHENTICATED | NOT_FOUND,
    summary="One job: status, placement, progress, last checkpoint, output folder",
)
async def get_job(request: Request, job_id: str = JOB_ID, who: Principal = Depends(authenticate)):
    row = await visible_job(request, job_id, who)
    view = job_view(row)
    if row["status"] == JobStatus.PENDING:  # why it waits, from the decider's last evaluation
        view |= await pending_reason_fields(request.app.state.bus, job_id)
    if chain := (row["spec"] or {}).get("chain"):  # the jobs submitted with it, in order
        members = await request.app.state.pool.fetch(
            "SELECT id, name, status, spec->>'after' AS after FROM jobs WHERE spec->>'chain' = $1 AND team = $2"
            " ORDER BY id",
            chain,
            row["team"],
        )
        view["chain"] = chain_order([dict(m) for m in members])
    return await redaction.for_viewer(request.app.state.pool, who, view)


def chain_order(members: list[dict]) -> list[dict]:
    """A chain's jobs in the order they run: each after the one it waits for (all were stored at once)."""
    ids = {m["id"] for m in members}
    ordered, placed = [], set()
    while len(ordered) < len(members):
        ready = [m for m in members if m["id"] not in placed and (m["after"] not in ids or m["after"] in placed)]
        if not ready:  # not a chain of `after`s (written around the api): the rest as stored
            ready = [m for m in members if m["id"] not in placed]
        ordered += ready
        placed |= {m["id"] for m in ready}
    return ordered


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    responses=WITH_BODY | NOT_FOUND | CONFLICT,
    summary="Ask for a job to be cancelled",
)
async def cancel_job(request: Request, job_id: str = JOB_ID, who: Principal = Depends(authenticate)):
    app = request.app.state
    row = await visible_job(request, job_id, who)
    if JobStatus(row["status"]).terminal:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is already {row['status']}")
    now = app.clock.now()
    request_id = f"{job_id}:cancel_requested:{secrets.token_hex(6)}"  # each request is audited, a repeat too
    # A request, not a change: the executor records it from this event and carries it out.
    await app.bus.audit(
        AuditEvent(
            event_id=request_id,
            ts=now,
            source="api",
            kind="job.cancel_requested",
            actor=who.actor,
            job_id=job_id,
            reason=f"{who.name} asked to cancel the job",
        )
    )
    await app.bus.publish_js(
        app.bus.subjects.job_events(job_id, API_SOURCE),
        JobEvent(job_id=job_id, kind="cancel_requested", ts=now, actor=who.actor),
        request_id,
        signed=True,  # on the api's own subject, and signed: the executor takes a cancel request only so
    )
    return job_view(row) | {"cancel_requested": True}
