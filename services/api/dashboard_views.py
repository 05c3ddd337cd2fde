"""What the dashboard shows that no other route serves in one read: the queue (every pending job
with its place, its wait and why it waits) and a job's checkpoints with their step and size.

The queue's position is within the job's priority level, in submission order, counted over every
team's pending jobs (a user sees only their own team's rows, but their true place). The reason
is the decider's (shared.infra.pending_reasons): its text and, by rule, the code that gave it. A job
"can never fit" when it needs more devices than any schedulable node has (or, multi-node, than
all of them together), as admission judges it: it waits until nodes are added.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from nats.errors import Error as NatsError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from pydantic import BaseModel, ValidationError

from services.api import redaction
from services.api.auth import Principal, authenticate
from services.api.errors import AUTHENTICATED, NOT_FOUND
from services.api.job_telemetry import read_job_events
from services.api.jobs import JOB_ID, visible_job
from shared.infra.bus import Bus
from shared.infra.job_reads import cluster_jobs
from shared.infra.pending_reasons import PendingReason, bucket_name

log = logging.getLogger(__name__)
router = APIRouter()
REASON_READS = 32  # direct gets of pending reasons in flight at once
MAX_SIZED_FILES = 100_000  # a checkpoint with more files is shown without a size


class QueuedJob(BaseModel):
    id: str
    name: str
    team: str
    owner: str
    priority: str
    priority_rank: int
    gpus: int
    multi_node: bool
    position: int
    submitted_at: str
    waiting_s: float
    reason: str | None
    reason_codes: dict[str, str]
    pending_since: float | None
    never_fits: bool
    never_fits_why: str | None


class Queue(BaseModel):
    items: list[QueuedJob]
    pending: int
    schedulable_nodes: int
    largest_node_gpus: int


async def pending_reasons(bus: Bus, job_ids: list[str]) -> dict[str, PendingReason]:
    """The decider's entries for these jobs: the bucket looked up once, then one direct get per job
    (what the api's bus permissions allow), a few at a time. A read that fails leaves that job
    without a reason rather than failing the page."""
    try:
        kv = await bus.js.key_value(bucket_name(bus))
    except (BucketNotFoundError, NotFoundError):
        return {}  # no decider has written one yet
    gate = asyncio.Semaphore(REASON_READS)

    async def one(job_id: str) -> PendingReason | None:
        async with gate:
            try:
                entry = await kv.get(f"job.{job_id}")
            except (KeyNotFoundError, NotFoundError):
                return None
            except (NatsError, TimeoutError) as err:
                log.warning("pending reason of %s not read: %s", job_id, err)
                return None
        try:
            return PendingReason.model_validate_json(entry.value) if entry.value else None
        except (ValueError, ValidationError):
            return None

    found = await asyncio.gather(*(one(j) for j in job_ids))
    return {j: r for j, r in zip(job_ids, found) if r is not None}


async def _sizes(request: Request) -> tuple[int, int, int]:
    """(schedulable nodes, the most devices one has, all their devices), as admission counts them."""
    state = request.app.state
    # Counted in Postgres: decoding a thousand nodes' device lists to count them cost more than the queue.
    rows = await state.pool.fetch(
        "SELECT jsonb_array_length(devices) AS devices, last_heartbeat FROM nodes WHERE status = 'ready'"
    )
    now, timeout = state.clock.now(), state.config.worker.node_timeout
    each = [r["devices"] for r in rows if now - r["last_heartbeat"].timestamp() <= timeout]
    return len(each), max(each, default=0), sum(each)


@router.get(
    "/v1/queue",
    response_model=Queue,
    responses=AUTHENTICATED,
    tags=["jobs"],
    summary="Pending jobs in admission order: position within their priority, waiting time, the "
    "decider's reason, and whether the job can never fit the cluster",
)
async def queue(
    request: Request,
    who: Principal = Depends(authenticate),
    limit: int = Query(500, ge=1, le=5000, description="at most this many rows, first in line first"),
):
    state = request.app.state
    rows = await cluster_jobs.pending_queue(state.pool, None if who.sees_all else who.team, limit)
    nodes, largest, total = await _sizes(request)
    reasons = await pending_reasons(state.bus, [r.id for r in rows]) if rows else {}
    now = state.clock.now()
    items = []
    for r in rows:
        why = reasons.get(r.id)
        room = total if r.multi_node else largest
        never = bool(nodes) and r.gpus > room
        items.append(
            {
                "id": r.id,
                "name": r.name,
                "team": r.team,
                "owner": r.owner,
                "priority": r.priority,
                "priority_rank": r.priority_rank,
                "gpus": r.gpus,
                "multi_node": r.multi_node,
                "position": r.position,
                "submitted_at": r.submitted_at.isoformat(),
                "waiting_s": round(max(0.0, now - r.submitted_at.timestamp()), 1),
                "reason": why.reason if why else None,
                "reason_codes": why.rules if why else {},
                "pending_since": why.since if why else None,
                "never_fits": never,
                "never_fits_why": (
                    f"needs {r.gpus} device(s); "
                    + (
                        f"all {nodes} schedulable nodes have {total}"
                        if r.multi_node
                        else f"the largest schedulable node has {largest}"
                    )
                )
                if never
                else None,
            }
        )
    items = await redaction.for_viewer(state.pool, who, items)  # a reason may name another team's job
    pending = rows[0].pending if rows else 0
    return {
        "items": items,
        "pending": pending if who.sees_all else len(items),
        "schedulable_nodes": nodes,
        "largest_node_gpus": largest,
    }


class Checkpoint(BaseModel):
    ts: float
    attempt: int
    node: str | None
    step: int | None
    path: str | None
    size_bytes: int | None


class Checkpoints(BaseModel):
    items: list[Checkpoint]


def folder_size(path: Path, inside: Path) -> int | None:
    """The bytes of the files under `path`, if it is a folder inside `inside` (symlinks not followed)."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):
        return None
    if not real.is_relative_to(inside) or not real.is_dir():
        return None
    total, seen = 0, 0
    for top, _dirs, files in os.walk(real):
        for name in files:
            seen += 1
            if seen > MAX_SIZED_FILES:
                return None
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total


@router.get(
    "/v1/jobs/{job_id}/checkpoints",
    response_model=Checkpoints,
    responses=AUTHENTICATED | NOT_FOUND,
    tags=["jobs"],
    summary="A job's checkpoints, oldest first: when, the step, the folder and its size",
)
async def checkpoints(request: Request, job_id: str = JOB_ID, who: Principal = Depends(authenticate)):
    row = await visible_job(request, job_id, who)
    inside = Path(row["job_dir"]).resolve() if row["job_dir"] else None
    items = []
    for _, e in await read_job_events(request.app.state.bus, request.app.state.pool, job_id):
        if e.kind != "checkpointed":
            continue
        step, path = e.data.get("step"), e.data.get("path")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        path = path if isinstance(path, str) and len(path) <= 4096 else None
        # The path comes from the trainer: sized only inside the job's own folder.
        size = await asyncio.to_thread(folder_size, Path(path), inside) if path and inside else None
        items.append({"ts": e.ts, "attempt": e.attempt, "node": e.node, "step": step, "path": path, "size_bytes": size})
    return {"items": items}
