"""Job routes: submit, list, get, cancel, export. The api records new jobs; status is the executor's alone."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import secrets
from dataclasses import dataclass
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
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import AuditEvent, JobEvent
from shared.contracts.subjects import API_SOURCE
from shared.infra import tracing
from shared.infra.job_reads import one_job, team_jobs
from shared.infra.pending_reasons import pending_reason_fields
from shared.specs.job_spec import JobSpec, SpecError, parse_document, validate_job, wrap_bare_llamafactory
from shared.specs.tenant_paths import CHECKPOINT_KEY, TenantRoots

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


# A JSON body this small decodes in microseconds whatever it holds (its shape is bounded as it is
# parsed): on the event loop, without the hand-off to a thread. YAML (aliases) and larger bodies go there.
INLINE_JSON_BYTES = 16 * 1024


async def checked(app, fn, *args, inline: bool = False):
    """fn(*args) off the event loop, bounded: a hostile body must not stall every other request. Raises
    SpecError for what is wrong with the body. `inline`: on the loop, for what is bounded by its size."""
    limit = app.config.api.validation_timeout_s
    try:
        if inline:
            return fn(*args)
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
    if other is None or await one_job.team_of(conn, other) == roots.team:
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
    content_type = request.headers.get("content-type", "")
    try:
        if len(body) <= INLINE_JSON_BYTES and content_type.split(";")[0].strip().lower() == "application/json":
            doc = await checked(app, _decode, body, content_type, app, inline=True)
        else:
            doc = await checked(app, _decode, body, content_type, app)
        # The pool, not a connection held through validation: only a spec with references looks jobs up.
        spec, train, refs = await validated(app, who, doc, job_refs.Lookup(app.pool, who.team))
    except SpecError as err:
        return field_errors(err.errors)
    job_id = "j" + secrets.token_hex(8)
    tracing.annotate(service="api", job_id=job_id)
    return _created(await group_commit(app).store(who, job_id, spec, train, refs_audit(refs)))


def _created(stored: dict | JSONResponse) -> JSONResponse:
    """201 with the stored job's view, as `SubmittedJob` documents it, serialized without a second
    validation of what the api itself just built; or the refusal."""
    if isinstance(stored, JSONResponse):
        return stored
    return JSONResponse({"pending_reason": None} | stored, status_code=status.HTTP_201_CREATED)


def refs_audit(refs: job_refs.Resolved | None) -> dict:
    """What the submission's audit event says of its references and of the job it waits for."""
    if refs is None:
        return {}
    return {**({"inputs": refs.inputs} if refs.inputs else {}), **({"after": refs.after} if refs.after else {})}


async def _queue_job(app, who: Principal, spec: JobSpec, train: dict[str, Any], audit_data: dict | None = None):
    """Admit (quotas), store and announce a checked job; the queued job's view or the refusal."""
    job_id = "j" + secrets.token_hex(8)
    tracing.annotate(service="api", job_id=job_id)
    return _created(await group_commit(app).store(who, job_id, spec, train, audit_data))


def _columns(app, who: Principal, job_id: str, spec: JobSpec, train: dict[str, Any], audit_data: dict | None) -> dict:
    """The jobs row of one checked job, as submitted (no status: that is the executor's)."""
    sched = app.config.strategies.priority_scheduling
    priority = spec.priority or sched.default
    preemptible = sched.level(priority).preemptible if spec.preemptible is None else spec.preemptible
    stored = spec.model_dump(exclude={"after"} if spec.after is None else None) | {
        "priority": priority,
        "preemptible": preemptible,
        "train": train,
        **({"chain": audit_data["chain"]} if audit_data and audit_data.get("chain") else {}),
    }
    return {
        "id": job_id,
        "name": spec.name,
        "owner": who.name,
        "team": who.team,
        "priority": priority,
        "priority_rank": sched.rank(priority),
        "gpus": spec.gpus,
        "preemptible": preemptible,
        "spec": stored,
        "trace_parent": tracing.traceparent(),  # this request's span: the root of the job's trace
    }


def _submitted(app, who: Principal, spec: JobSpec, train: dict[str, Any], row: dict, queued, audit_data) -> AuditEvent:
    return AuditEvent(
        event_id=f"{row['id']}:submitted",
        ts=app.clock.now(),
        source="api",
        kind="job.submitted",
        actor=who.actor,
        job_id=row["id"],
        reason=f"{who.name} submitted {spec.name!r} ({spec.gpus} device(s), priority {row['priority']})"
        + (f", to run after {spec.after}" if spec.after else ""),
        data={
            "name": spec.name,
            "gpus": spec.gpus,
            "priority": row["priority"],
            "team": who.team,
            "model": train.get("model_name_or_path"),
            "finetuning_type": train.get("finetuning_type"),
            **({"quota": queued} if queued else {}),
            **(audit_data or {}),
        },
    )


# The columns a submission writes (`_columns` gives their values), with their types for the batch insert.
_JOB_COLUMNS = {
    "id": "text",
    "name": "text",
    "owner": "text",
    "team": "text",
    "priority": "text",
    "priority_rank": "int",
    "gpus": "int",
    "preemptible": "boolean",
    "spec": "jsonb",
    "trace_parent": "text",
}
_NAMES = ", ".join(_JOB_COLUMNS)
_INSERT = (
    f"INSERT INTO jobs ({_NAMES}) VALUES ({', '.join(f'${i}' for i in range(1, len(_JOB_COLUMNS) + 1))}) RETURNING *"
)


async def store_job(
    conn, app, who: Principal, job_id: str, spec: JobSpec, train: dict[str, Any], audit_data: dict | None = None
) -> dict | JSONResponse:
    """Inside the caller's transaction: admit (quotas), insert and audit one checked job. Its view, or the
    refusal to answer with (the caller rolls back)."""
    columns = _columns(app, who, job_id, spec, train, audit_data)
    if foreign := await foreign_checkpoint(conn, team_roots(app, who.team), train):
        return field_errors(foreign)
    verdict = await quotas.admission(conn, who.team, columns["priority"], spec.gpus, who.name, spec.max_gpus)
    if verdict.invalid:
        return field_errors(verdict.invalid)
    if verdict.refused:
        await record(
            app,
            who,
            "job.refused",
            verdict.refused,
            action="submit",
            data={"name": spec.name, "gpus": spec.gpus, "priority": columns["priority"], "team": who.team},
        )
        return JSONResponse({"detail": verdict.refused}, status_code=status.HTTP_429_TOO_MANY_REQUESTS)
    row = await conn.fetchrow(_INSERT, *(columns[name] for name in _JOB_COLUMNS))
    # Published inside the transaction: if the bus is down nothing is queued and the caller sees 503.
    await app.bus.audit(_submitted(app, who, spec, train, columns, verdict.queued, audit_data))
    return job_view(row) | {"quota_note": verdict.queued}


@dataclass
class _Submission:
    who: Principal
    job_id: str
    spec: JobSpec
    train: dict[str, Any]
    audit_data: dict | None
    context: contextvars.Context  # the request's: its trace, for the row, the audit event and the wake-up
    answer: asyncio.Future


# Rows of a team without a quota, inserted by one statement: the batch's specs as one jsonb array.
_INSERT_MANY = (
    f"INSERT INTO jobs ({_NAMES}) SELECT {_NAMES} FROM jsonb_to_recordset($1::jsonb)"
    f" AS r({', '.join(f'{name} {kind}' for name, kind in _JOB_COLUMNS.items())}) RETURNING *"
)


class GroupCommit:
    """Stores the submissions that arrive together in one transaction (group commit).

    One batch is in flight per api process; the submissions that arrive meanwhile wait and go together
    in the next, so an idle api stores each at once and a busy one pays a transaction's round trips
    (acquire, BEGIN, the quota look-up, COMMIT, the connection's reset) once per batch, not once per job.
    Inside the batch each job is admitted as alone: a team with a quota takes its advisory lock and counts
    its jobs in the same transaction, so the earlier jobs of the batch count against the later ones and
    concurrent submissions against a quota of N accept exactly N. The jobs of teams without a quota go in
    one INSERT. Every job.submitted audit event is published, and acked by JetStream, before the COMMIT
    (as for one job: a job answered 201 has its audit event on the bus); the answers go out after it.
    If the batch's transaction fails as a whole, each of its jobs is stored again alone (same id, same
    audit event id: JetStream and the sink drop the repeat), so one job's failure is only its own."""

    def __init__(self, app, max_batch: int = 64) -> None:
        self.app = app
        self.max_batch = max_batch
        self._waiting: list[_Submission] = []
        self._draining = False
        self._task: asyncio.Task | None = None
        self.largest = 0  # the most submissions one transaction has stored

    async def store(
        self, who: Principal, job_id: str, spec: JobSpec, train: dict[str, Any], audit_data: dict | None
    ) -> dict | JSONResponse:
        """The stored job's view (announced), or the refusal to answer with."""
        item = _Submission(
            who, job_id, spec, train, audit_data, contextvars.copy_context(), asyncio.get_running_loop().create_future()
        )
        self._waiting.append(item)
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain())
        return await item.answer

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
                self.largest = max(self.largest, len(batch))
                try:
                    answers = await self._batch(batch)
                except Exception as err:  # the whole transaction: each again alone
                    log.info("a batch of %d submissions failed whole (%s); storing each alone", len(batch), err)
                    await asyncio.gather(*(self._alone(item) for item in batch))
                    continue
                for item, answer in zip(batch, answers):
                    _answer(item, answer)
                self._announce([item for item, answer in zip(batch, answers) if isinstance(answer, dict)])
        finally:
            self._draining = False
            for item in self._waiting:  # only after a cancellation: nobody is left waiting for ever
                if not item.answer.done():
                    item.answer.set_exception(RuntimeError("the api is stopping"))

    async def _batch(self, batch: list[_Submission]) -> list[dict | JSONResponse]:
        app = self.app
        answers: list[dict | JSONResponse | None] = [None] * len(batch)
        async with app.pool.acquire() as conn, conn.transaction():
            teams = list({item.who.team for item in batch})
            limited = {r["team"] for r in await conn.fetch("SELECT team FROM quotas WHERE team = ANY($1)", teams)}
            free, events = [], []
            for i, item in enumerate(batch):
                checkpoint = item.train.get(CHECKPOINT_KEY)
                if item.who.team in limited or checkpoint is not None:
                    # Admitted one by one, in order, in this transaction (its audit event published inside).
                    answers[i] = await item.context.run(
                        asyncio.create_task,
                        store_job(conn, app, item.who, item.job_id, item.spec, item.train, item.audit_data),
                    )
                else:
                    free.append(i)
            if free:
                columns = [
                    batch[i].context.run(
                        _columns, app, batch[i].who, batch[i].job_id, batch[i].spec, batch[i].train, batch[i].audit_data
                    )
                    for i in free
                ]
                rows = {r["id"]: r for r in await conn.fetch(_INSERT_MANY, columns)}
                for i, cols in zip(free, columns):
                    item = batch[i]
                    answers[i] = job_view(rows[item.job_id]) | {"quota_note": None}
                    event = _submitted(app, item.who, item.spec, item.train, cols, None, item.audit_data)
                    events.append(item.context.run(asyncio.create_task, app.bus.audit(event)))
            # Every audit event acked before the COMMIT; one refused rolls the whole batch back.
            await _all(events)
        return answers

    async def _alone(self, item: _Submission) -> None:
        async def one():
            async with self.app.pool.acquire() as conn, conn.transaction():
                return await store_job(conn, self.app, item.who, item.job_id, item.spec, item.train, item.audit_data)

        try:
            answer = await item.context.run(asyncio.create_task, one())
        except Exception as err:  # the request answers it as it would have (503 for an outage)
            if not item.answer.done():
                item.answer.set_exception(err)
            return
        _answer(item, answer)
        if isinstance(answer, dict):
            self._announce([item])

    def _announce(self, items: list[_Submission]) -> None:
        for item in items:
            item.context.run(announce, self.app, item.who, item.job_id)


def _answer(item: _Submission, answer) -> None:
    if not item.answer.done():
        item.answer.set_result(answer)


async def _all(tasks: list[asyncio.Task]) -> None:
    """Await every task (none left running behind), then raise the first failure."""
    if tasks:
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


def group_commit(app) -> GroupCommit:
    if (committer := getattr(app, "group_commit", None)) is None:
        committer = app.group_commit = GroupCommit(app)
    return committer


def announce(app, who: Principal, job_id: str) -> None:
    """After the commit: this event wakes the decider, which must then find the job in Postgres.
    Published without waiting for JetStream's ack: the job is already durable in Postgres, and if the
    event is lost the decider's next periodic pass finds the job all the same."""
    subject = app.bus.subjects.job_events(job_id, API_SOURCE)
    event = JobEvent(job_id=job_id, kind="submitted", ts=app.clock.now(), actor=who.actor)

    async def publish() -> None:
        try:
            await app.bus.publish_js_unacked(subject, event, f"{job_id}:submitted")
        except Exception as err:
            log.warning("job %s stored; its wake-up event was not published: %s", job_id, err)

    _background.add(task := asyncio.create_task(publish()))
    task.add_done_callback(_background.discard)
    app.metrics.jobs_submitted.inc()


_background: set[asyncio.Task] = set()  # wake-ups being published: held, so none is collected midway


async def visible_job(request: Request, job_id: str, who: Principal):
    """The job, if it exists and the caller may see it (a user sees their own team's); else 404."""
    row = await one_job.job_row(request.app.state.pool, job_id)
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
    filters: dict[str, str | None] = {
        "team": who.team if not who.sees_all else team,
        "owner": owner,
        "priority": priority,
        "name": name,
        "status": status_.value if status_ else None,
    }
    rows = await team_jobs.page(request.app.state.pool, filters, limit, before)
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
        members = await team_jobs.chain_members(request.app.state.pool, chain, row["team"])
        view["chain"] = chain_order([m._asdict() for m in members])
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
