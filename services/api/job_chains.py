"""Chained submission: several specs in one request (`adc submit sft.yaml dpo.yaml export.yaml --chain`).

Each spec is checked as a single submission is, and may name an earlier one of the chain by its name
in `after` and in `job://` references; a spec without `after` waits for the one before it. Every spec
is checked before anything is stored, and then all are stored and audited in one transaction: the
chain is queued whole or not at all. The decider starts a job only once the job it waits for has
succeeded, and cancels it, saying why, if that job fails or is cancelled.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.api import job_refs
from services.api.auth import Principal, authenticate
from services.api.errors import WITH_BODY, Problem, field_errors
from services.api.jobs import SubmittedJob, announce, checked, parse_document, refs_audit, store_job, validated
from services.api.request_limits import unstorable
from shared.infra import tracing
from shared.specs.job_spec import SpecError, wrap_bare_llamafactory

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
MAX_CHAIN = 16


class ChainOut(BaseModel):
    chain: str
    items: list[SubmittedJob]


def _decode_chain(body: bytes, content_type: str, app) -> list[Any]:
    doc = parse_document(body, content_type, app.config.api.spec_limits)
    if problems := unstorable(doc):
        raise SpecError(problems)
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list) or not jobs or (isinstance(doc, dict) and doc.keys() - {"jobs"}):
        raise SpecError([{"loc": ["body"], "msg": "expected {jobs: [spec, ...]}, the chain's specs in order"}])
    if len(jobs) > MAX_CHAIN:
        raise SpecError([{"loc": ["jobs"], "msg": f"{len(jobs)} specs; a chain holds at most {MAX_CHAIN}"}])
    return [wrap_bare_llamafactory(spec) if isinstance(spec, dict) else spec for spec in jobs]


def _within(errors: list[dict], index: int) -> list[dict]:
    return [{**e, "loc": ["jobs", index, *e["loc"]]} for e in errors]


@router.post(
    "/chain",
    status_code=201,
    response_model=ChainOut,
    summary="Submit a chain of jobs: each waits for the one before it (or its `after`)",
    responses=WITH_BODY | {429: {"model": Problem, "description": "over the team's quota, which says refuse"}},
)
async def submit_chain(request: Request, who: Principal = Depends(authenticate)):
    app = request.app.state
    body = await request.body()
    try:
        docs = await checked(app, _decode_chain, body, request.headers.get("content-type", ""), app)
    except SpecError as err:
        return field_errors(err.errors)
    ids = ["j" + secrets.token_hex(8) for _ in docs]
    chain = ids[0]
    tracing.annotate(service="api", job_id=chain)
    checked_specs, errors, earlier, chain_after = [], [], {}, {}  # earlier: name or id -> id
    async with app.pool.acquire() as conn:
        for i, doc in enumerate(docs):
            if isinstance(doc, dict) and i and not doc.get("after"):
                doc = {**doc, "after": ids[i - 1]}
            try:
                spec = await validated(app, who, doc, job_refs.Lookup(conn, who.team, earlier), chain_after)
            except SpecError as err:
                errors += _within(err.errors, i)
                spec = None
            checked_specs.append(spec)
            chain_after[ids[i]] = spec[2].after if spec and spec[2] else None
            earlier[ids[i]] = ids[i]
            if isinstance(doc, dict) and isinstance(doc.get("name"), str):
                earlier[doc["name"]] = ids[i]  # a later spec of the same name is the one named from then on
        if errors:
            return field_errors(errors)
        stored = []
        try:
            async with conn.transaction():  # rolled back whole when one job is refused
                for i, (spec, train, refs) in enumerate(checked_specs):
                    audit = refs_audit(refs) | {"chain": chain, "chain_position": i + 1, "chain_length": len(ids)}
                    row = await store_job(conn, app, who, ids[i], spec, train, audit)
                    if isinstance(row, JSONResponse):
                        raise _Refused(_chain_refusal(row, i))
                    stored.append(row)
        except _Refused as refused:
            return refused.response
    for job_id in ids:
        announce(app, who, job_id)
    return JSONResponse({"chain": chain, "items": stored}, status_code=status.HTTP_201_CREATED)


class _Refused(Exception):
    def __init__(self, response: JSONResponse) -> None:
        self.response = response


def _chain_refusal(response: JSONResponse, index: int) -> JSONResponse:
    """A quota refusal of one spec, said of the chain (nothing of it was stored)."""
    body = json.loads(response.body)
    if isinstance(body.get("detail"), list):
        return field_errors(_within(body["detail"], index))
    return JSONResponse(
        {"detail": f"jobs[{index}]: {body.get('detail')}; nothing of the chain was queued"},
        status_code=response.status_code,
    )
