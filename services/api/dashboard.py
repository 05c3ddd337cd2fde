"""The web dashboard at /ui, and the live streams it (and any client) follows.

The page and its assets are static and public; every datum comes from the REST API under
the caller's own token, so the dashboard follows exactly the API's role and team rules.

Signing in: the page sends the token once, in an Authorization header, to `POST /ui/session`,
which answers with an HttpOnly, SameSite=Strict cookie holding it. Script cannot read the
cookie, no URL ever carries the token (so no access log does), and the browser sends it with
the page's own GETs and EventSource streams. The gate accepts that cookie for GET and HEAD
only: anything that changes state still needs the Authorization header, so a forged
cross-site request can change nothing.

Live updates are Server-Sent Events, one connection per view: the audit stream
(`/v1/audit/stream`), every node's telemetry (`/v1/nodes/stream`, from the api's one
subscription; frames built once a second for all who see the same, services/api/cluster_frames.py)
and jobs' progress (`/v1/jobs/stream`, all visible jobs or one). The page closes every stream
(and log follow) of a view when it leaves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse, ServerSentEvent

from services.api import dashboard_views, telemetry_history
from services.api.auth import SESSION_COOKIE, Principal, authenticate
from services.api.errors import AUTHENTICATED, NOT_FOUND
from services.api.job_telemetry import progress_point
from services.api.jobs import visible_job
from services.api.streams import KEEPALIVE_S, SSE_DOC, sse_response
from shared.contracts.messages import JobEvent
from shared.contracts.subjects import API_EVENT_KINDS
from shared.infra.job_reads import one_job
from shared.infra.rejections import refused_not_placed

UI_DIR = Path(__file__).resolve().parent / "ui"
PLACEMENT_REREAD_S = 5.0  # the live job stream's cache of each attempt's nodes
NODES_MIN_GAP_S = 1.0  # at most one cluster frame a second per client (frames are built once for all)

router = APIRouter()
router.include_router(dashboard_views.router)  # the queue, a job's checkpoints
router.include_router(telemetry_history.router)  # the last hour of node, GPU and cluster telemetry


class _Revalidated(StaticFiles):
    """The page's assets, revalidated on every load (their ETag answers 304 while they are unchanged):
    without a Cache-Control a browser may keep an upgraded installation's old script for hours."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


static = _Revalidated(directory=UI_DIR / "static")


@router.get("/ui", include_in_schema=False)
async def page() -> Response:
    # Read here, not streamed from a worker thread as FileResponse does: a few KB from the page cache
    # cost less than the thread hops, which a busy api makes the first wait of every page load.
    return Response(
        (UI_DIR / "index.html").read_bytes(),
        media_type="text/html; charset=utf-8",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; "
            "img-src 'self' data:; style-src 'self'; "
            "frame-ancestors 'none'",
        },
    )


@router.post("/ui/session", status_code=204, include_in_schema=False)
async def sign_in(request: Request, who: Principal = Depends(authenticate)) -> Response:
    """The gate has checked the Authorization header's token; keep it in the session cookie."""
    secret = request.headers["authorization"].partition(" ")[2].strip()
    response = Response(status_code=204)
    response.set_cookie(
        SESSION_COOKIE, secret, httponly=True, samesite="strict", path="/", secure=request.url.scheme == "https"
    )
    return response


@router.post("/ui/logout", status_code=204, include_in_schema=False)
async def sign_out() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _event(kind: str, data: Any) -> ServerSentEvent:
    return ServerSentEvent(json.dumps(data, separators=(",", ":")), event=kind)


@router.get(
    "/v1/nodes/stream",
    response_class=EventSourceResponse,
    responses=AUTHENTICATED | SSE_DOC,
    tags=["cluster"],
    summary="Every node's live telemetry (Server-Sent Events, `event: nodes`, at most one a second; "
    "`delta=true`: after the first, only the nodes that changed)",
)
async def stream_nodes(
    request: Request,
    who: Principal = Depends(authenticate),
    delta: bool = Query(
        False, description="after the first frame (every node), only the nodes whose readings or holders changed"
    ),
    since: str | None = Query(
        None, max_length=64, description="with delta: the `frame` of GET /v1/nodes?telemetry=true, to start after"
    ),
):
    state = request.app.state
    feed, frames = state.cluster_feed, state.cluster_frames
    state.streams.admit(who)

    async def events():
        yield ServerSentEvent(retry=2000)
        sent = -1  # the build this client has: none yet
        while not feed.closing:
            began = feed.clock.monotonic()
            wake = feed.changed()  # taken before reading: a sample arriving meanwhile wakes the next frame
            latest = await frames.latest(who)
            if sent < 0:
                sent = latest.version_of(since)
            yield frames.encoded(latest, sent if delta else 0)
            sent = latest.version
            # A frame a second, counted from when this one began.
            await asyncio.sleep(max(0.0, NODES_MIN_GAP_S - (feed.clock.monotonic() - began)))
            with contextlib.suppress(TimeoutError):  # quiet: a frame anyway (and `closing` looked at again)
                await asyncio.wait_for(wake.wait(), timeout=KEEPALIVE_S)

    return sse_response(request, who, events())


@router.get(
    "/v1/jobs/stream",
    response_class=EventSourceResponse,
    tags=["jobs"],
    responses=AUTHENTICATED | NOT_FOUND | SSE_DOC,
    summary="Live job events (Server-Sent Events): `event: progress` per logging step, `event: job` for "
    "the others (started, checkpointed, exited, ...); every job the caller may see, or one",
)
async def stream_jobs(
    request: Request,
    who: Principal = Depends(authenticate),
    job_id: str | None = Query(None, max_length=64, description="only this job's events"),
):
    state = request.app.state
    state.streams.admit(who)
    if job_id is not None:
        await visible_job(request, job_id, who)
    teams: dict[str, str | None] = {}  # job id -> team, as jobs never change team

    async def visible(event_job: str) -> bool:
        if who.sees_all or event_job == job_id:
            return True
        if event_job not in teams:
            teams[event_job] = await one_job.team_of(state.pool, event_job)
        return teams[event_job] == who.team

    placed: dict[tuple[str, int], tuple[float, frozenset[str]]] = {}  # (job, attempt) -> (read at, its nodes)

    async def from_its_sender(subject: str, event: JobEvent) -> bool:
        """As /metrics has it (job_telemetry.from_its_sender): an attempt's nodes are re-read at most
        every PLACEMENT_REREAD_S, so another node's flood of events costs no query each."""
        if state.bus.subjects.event_sender_refusal(subject, event.kind, event.node):
            return False
        if event.kind in API_EVENT_KINDS:
            return True
        key, now = (event.job_id, event.attempt), state.clock.now()
        read_at, nodes = placed.get(key, (float("-inf"), frozenset()))
        if event.node not in nodes and now - read_at >= PLACEMENT_REREAD_S:
            found = await state.pool.fetchval(
                "SELECT nodes FROM job_attempt_nodes WHERE job_id = $1 AND attempt = $2", event.job_id, event.attempt
            )
            placed[key] = (now, nodes := frozenset(found or ()))
        return event.node in nodes

    queue: asyncio.Queue[tuple[str, JobEvent]] = asyncio.Queue(maxsize=1000)

    async def on_event(msg) -> None:
        try:
            queue.put_nowait((msg.subject, JobEvent.decode(msg.data)))
        except (ValueError, asyncio.QueueFull):  # a slow client misses points; /metrics has them all
            pass

    async def events():
        # Subscribed here, not before: a stream refused by its guard never subscribes.
        sub = await state.bus.nc.subscribe(state.bus.subjects.job_events(job_id or "*"), cb=on_event)
        try:
            # The server has the subscription once it answers a ping: whatever is published after
            # the first message reaches this stream.
            await state.bus.round_trip()
            yield ServerSentEvent(retry=2000)
            while True:
                subject, event = await queue.get()  # quiet meanwhile: the response sends keep-alives
                if not await visible(event.job_id):
                    continue
                if not await from_its_sender(subject, event):
                    refused_not_placed()
                    continue
                if event.kind == "progress":
                    yield _event("progress", {"job_id": event.job_id, **progress_point(event)})
                else:
                    yield _event(
                        "job",
                        {
                            "job_id": event.job_id,
                            "kind": event.kind,
                            "ts": event.ts,
                            "attempt": event.attempt,
                            "node": event.node,
                        },
                    )
        finally:
            await sub.unsubscribe()

    return sse_response(request, who, events())
