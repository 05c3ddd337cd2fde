"""The audit log over HTTP: query, live tail (Server-Sent Events, resumable), and verification
of the hash chain.

Ids are the cursor everywhere. The audit sink appends under one advisory lock, so ids commit
in order and "every row with id > N" never skips a row that commits later.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from services.api import redaction
from services.api.auth import Principal, authenticate, require
from services.api.errors import AUTHENTICATED, field_errors
from services.api.streams import sse_response
from services.api.views import AuditPage, audit_view
from shared.infra.audit_chain import GENESIS, find_break

router = APIRouter(prefix="/v1/audit", tags=["audit"])

MAX_ID = 2**63 - 1
STREAM_BATCH = 500
VERIFY_BATCH = 5000


# Times are ISO 8601 text only: a bare number is refused, not read as seconds since the epoch.
ISO_TIME = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:?\d{2})?$"


def _instant(name: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError as err:
        raise HTTPException(422, [{"type": "invalid", "loc": ["query", name], "msg": str(err)}]) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class AuditFilters:
    """The filters query and stream share; a user sees only their own team's jobs' events."""

    def __init__(
        self,
        job_id: str | None = Query(None, max_length=64),
        kind: str | None = Query(None, max_length=64, description="e.g. decision, job.submitted, policy.updated"),
        node: str | None = Query(None, max_length=64),
        rule: str | None = Query(None, max_length=64),
        action: str | None = Query(None, max_length=32),
        actor: str | None = Query(None, max_length=200),
        source: str | None = Query(None, max_length=32, description="api, decider, executor, ..."),
        decision_id: str | None = Query(None, max_length=64),
        since: str | None = Query(None, pattern=ISO_TIME, description="ts >= since (ISO 8601; no zone: UTC)"),
        until: str | None = Query(None, pattern=ISO_TIME, description="ts < until (ISO 8601; no zone: UTC)"),
    ) -> None:
        self.columns = {
            "job_id": job_id,
            "kind": kind,
            "node": node,
            "rule": rule,
            "action": action,
            "actor": actor,
            "source": source,
            "decision_id": decision_id,
        }
        self.since, self.until = _instant("since", since), _instant("until", until)

    def where(self, who: Principal, args: list[Any]) -> list[str]:
        """SQL conditions, appending their arguments to `args`."""
        where = []
        for column, value in self.columns.items():
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        if self.since is not None:
            args.append(self.since)
            where.append(f"ts >= ${len(args)}")
        if self.until is not None:
            args.append(self.until)
            where.append(f"ts < ${len(args)}")
        if not who.sees_all:  # the team of the row's job, which the sink wrote beside it (migration 026)
            args.append(who.team)
            where.append(f"team = ${len(args)}")
        return where


async def _after(pool, who: Principal, filters: AuditFilters, after_id: int, limit: int) -> list:
    args: list[Any] = [after_id]
    where = ["id > $1", *filters.where(who, args)]
    args.append(limit)
    return await pool.fetch(
        f"SELECT * FROM audit_events WHERE {' AND '.join(where)} ORDER BY id LIMIT ${len(args)}", *args
    )


async def _last(pool, who: Principal, filters: AuditFilters, count: int) -> list:
    args: list[Any] = []
    where = filters.where(who, args)
    args.append(count)
    sql = (
        "SELECT * FROM audit_events"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + f" ORDER BY id DESC LIMIT ${len(args)}"
    )
    return list(reversed(await pool.fetch(sql, *args)))


@router.get("", response_model=AuditPage, responses=AUTHENTICATED, summary="Query the audit log, oldest first")
async def query_audit(
    request: Request,
    who: Principal = Depends(authenticate),
    filters: AuditFilters = Depends(),
    after_id: int = Query(0, ge=0, le=MAX_ID, description="cursor: the last id already seen"),
    limit: int = Query(100, ge=1, le=1000),
    last: int | None = Query(None, ge=1, le=1000, description="the last N matching events instead (ignores after_id)"),
):
    pool = request.app.state.pool
    rows = await (_last(pool, who, filters, last) if last else _after(pool, who, filters, after_id, limit))
    items = await redaction.for_viewer(pool, who, [audit_view(r) for r in rows])
    return {"items": items, "next_after_id": items[-1]["id"] if items else after_id}


async def _sse(pool, who: Principal, row) -> ServerSentEvent:
    view = await redaction.for_viewer(pool, who, audit_view(row))
    return ServerSentEvent(json.dumps(view, separators=(",", ":")), id=str(row["id"]), event="audit")


@router.get(
    "/stream",
    response_class=EventSourceResponse,
    responses=AUTHENTICATED
    | {200: {"content": {"text/event-stream": {}}, "description": "`event: audit` messages, each `id:` the row id"}},
    summary="Follow the audit log live (Server-Sent Events); resumable with Last-Event-ID",
)
async def stream_audit(
    request: Request,
    who: Principal = Depends(authenticate),
    filters: AuditFilters = Depends(),
    after_id: int | None = Query(None, ge=0, le=MAX_ID, description="start after this id (default: now)"),
    backlog: int = Query(0, ge=0, le=1000, description="without a cursor: first send the last N matching events"),
    last_event_id: str | None = Header(
        None, max_length=20, pattern=r"^[0-9]+$", description="set by a reconnecting client; wins over after_id"
    ),
):
    state = request.app.state
    pool, feed = state.pool, state.audit_feed
    state.streams.admit(who)
    cursor = int(last_event_id) if last_event_id else after_id
    first: list = []
    if cursor is None:
        first = await _last(pool, who, filters, backlog) if backlog else []
        cursor = first[-1]["id"] if first else await pool.fetchval("SELECT coalesce(max(id), 0) FROM audit_events")

    async def events():
        nonlocal cursor
        state.metrics.audit_tails.inc()
        try:
            yield ServerSentEvent(retry=1000)
            for row in first:
                yield await _sse(pool, who, row)
            # Where the stream starts: a client cut off before the first event resumes from here.
            yield ServerSentEvent(id=str(cursor))
            while not feed.closing:  # quiet meanwhile: the response sends keep-alives
                wake = feed.changed()
                rows = await _after(pool, who, filters, min(cursor, MAX_ID), STREAM_BATCH)
                for row in rows:
                    cursor = row["id"]
                    yield await _sse(pool, who, row)
                if len(rows) == STREAM_BATCH:
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), timeout=feed.poll_s)
                except TimeoutError:
                    pass
        finally:
            state.metrics.audit_tails.dec()

    return sse_response(request, who, events())


class BrokenRow(BaseModel):
    id: int
    event_id: str
    kind: str
    ts: str
    why: str


class AnchorCheck(BaseModel):
    id: int
    hash: str
    held: bool
    why: str | None = None


class AuditVerification(BaseModel):
    ok: bool
    keyed: bool = Field(
        description="hashes are HMACs under audit.chain_key_file; false: a database superuser"
        " could rewrite the log and its chain"
    )
    rows_checked: int
    last_id: int | None
    last_hash: str
    broken: BrokenRow | None
    anchor: AnchorCheck | None = Field(None, description="the head kept from an earlier verify, checked")
    elapsed_s: float


@router.get(
    "/verify",
    response_model=AuditVerification,
    responses=AUTHENTICATED,
    summary="Check the whole hash chain (admin); names the first altered row",
)
async def verify_audit(
    request: Request,
    _: Principal = Depends(require("admin")),
    anchor_id: int | None = Query(None, ge=1, description="id of a head kept outside Postgres"),
    anchor_hash: str | None = Query(
        None, pattern="^[0-9a-f]{64}$", description="its hash, as an earlier verify returned it"
    ),
):
    """Deleting rows at the very end of the log leaves a valid (shorter) chain: pass the
    `last_id`/`last_hash` of an earlier answer, kept elsewhere, as the anchor to catch that."""
    if (anchor_id is None) != (anchor_hash is None):
        return field_errors(
            [
                {
                    "loc": ["query", "anchor_hash" if anchor_hash is None else "anchor_id"],
                    "msg": "anchor_id and anchor_hash go together",
                }
            ]
        )
    started = time.monotonic()
    key = request.app.state.chain_key
    checked, last_id, prev = 0, 0, GENESIS
    anchor_seen: str | None = None
    broken_row = None
    async with request.app.state.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        while broken_row is None:
            rows = [
                dict(r)
                for r in await conn.fetch(
                    "SELECT * FROM audit_events WHERE id > $1 ORDER BY id LIMIT $2", last_id, VERIFY_BATCH
                )
            ]
            if not rows:
                break
            if broken := find_break(rows, prev, key):
                at = next(i for i, r in enumerate(rows) if r["id"] == broken[0])
                row = rows[at]
                rows = rows[:at]
                broken_row = {
                    "id": row["id"],
                    "event_id": row["event_id"],
                    "kind": row["kind"],
                    "ts": row["ts"].isoformat(),
                    "why": broken[1],
                }
                checked += 1
            for row in rows:
                if row["id"] == anchor_id:
                    anchor_seen = row["hash"]
            if rows:
                checked += len(rows)
                last_id, prev = rows[-1]["id"], rows[-1]["hash"]
            await asyncio.sleep(0)  # let other requests run between batches
    anchor = None
    if anchor_id is not None:
        held = anchor_seen is not None and anchor_seen == anchor_hash
        why = (
            None
            if held
            else (
                f"row #{anchor_id} has another hash: the log was rewritten"
                if anchor_seen is not None
                else f"row #{anchor_id} is gone: rows were cut from the log"
                if broken_row is None or anchor_id < broken_row["id"]
                else f"not reached: the chain breaks before row #{anchor_id}"
            )
        )
        anchor = {"id": anchor_id, "hash": anchor_hash, "held": held, "why": why}
    ok = broken_row is None and (anchor is None or anchor["held"])
    return {
        "ok": ok,
        "keyed": key is not None,
        "rows_checked": checked,
        "last_id": last_id or None,
        "last_hash": prev,
        "broken": broken_row,
        "anchor": anchor,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
