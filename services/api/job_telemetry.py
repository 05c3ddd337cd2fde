"""A job's metrics (loss curve, learning rate, tokens/s) and its event history, read from the
JetStream stream the workers publish to (`<PREFIX>_JOBS`, subject `<prefix>.jobs.<node>.<job>.events`;
the api's own on `<prefix>.jobs._api.<job>.events`). Only the rightful sender's events count: a
trainer's from a node its attempt was placed on (`job_attempt_nodes`), whatever another node's
worker publishes about the job (ignored and counted, `adc_rejected_messages_total`).

Nothing is copied into Postgres: the stream is the record, so history goes back as far as the
stream keeps it (its max_age). Each request reads through a short-lived consumer filtered
to the one job's subject, and deletes it afterwards.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg
from fastapi import APIRouter, Depends, Query, Request
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict

from services.api import redaction
from services.api.auth import Principal, authenticate
from services.api.errors import AUTHENTICATED, NOT_FOUND
from services.api.jobs import JOB_ID, visible_job
from shared.contracts.messages import JobEvent
from shared.contracts.subjects import API_EVENT_KINDS, Subjects
from shared.infra.bus import Bus
from shared.infra.rejections import refused_not_placed

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

FETCH_BATCH = 512
MAX_EVENTS = 200_000  # a bound on one read; a job logging every step for weeks stays under it
POINT_KEYS = (
    "step",
    "max_steps",
    "epoch",
    "loss",
    "learning_rate",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "peak_memory_bytes",
)


async def attempt_nodes(pool: asyncpg.Pool, job_id: str) -> dict[int, frozenset[str]]:
    """The nodes each attempt of the job was placed on."""
    rows = await pool.fetch("SELECT attempt, nodes FROM job_attempt_nodes WHERE job_id = $1", job_id)
    return {r["attempt"]: frozenset(r["nodes"]) for r in rows}


def from_its_sender(subjects: Subjects, subject: str, event: JobEvent, placed: dict[int, frozenset[str]]) -> bool:
    """The api's kinds from the api; a trainer's from a node its attempt was placed on, on that node's subject."""
    if subjects.event_sender_refusal(subject, event.kind, event.node):
        return False
    return event.kind in API_EVENT_KINDS or event.node in placed.get(event.attempt, ())


async def read_job_events(bus: Bus, pool: asyncpg.Pool, job_id: str) -> list[tuple[int, JobEvent]]:
    """Every event of the job still in the stream from its rightful sender, oldest first, with its
    stream sequence."""
    placed = await attempt_nodes(pool, job_id)
    subject, stream = bus.subjects.job_events(job_id), bus.subjects.jobs_stream
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=30.0,
        mem_storage=True,
        max_ack_pending=-1,
    )
    try:
        sub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    except NotFoundError:
        return []
    events: list[tuple[int, JobEvent]] = []
    info = None
    try:
        info = await sub.consumer_info()
        pending = info.num_pending
        while pending > 0 and len(events) < MAX_EVENTS:
            msgs = await sub.fetch(min(pending, FETCH_BATCH), timeout=5)
            for msg in msgs:
                try:
                    event = JobEvent.decode(msg.data)
                except ValueError:
                    continue  # not ours to judge here; the executor logs undecodable events
                if event.job_id != job_id or not from_its_sender(bus.subjects, msg.subject, event, placed):
                    refused_not_placed()  # another node's word on this job: not shown
                    continue
                events.append((msg.metadata.sequence.stream, event))
            pending = msgs[-1].metadata.num_pending if msgs else 0
    finally:
        try:
            await sub.unsubscribe()
            if info is not None:
                await bus.js.delete_consumer(stream, info.name)
        except Exception:  # it expires on its own after inactive_threshold
            pass
    return events


def _finite(value: Any) -> Any:
    """JSON has no NaN: a diverged loss is shown as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def progress_point(event: JobEvent) -> dict[str, Any]:
    """One point of the curve, from a progress event."""
    return {
        "attempt": event.attempt,
        "ts": event.ts,
        **{k: _finite(event.data[k]) for k in POINT_KEYS if k in event.data},
    }


class ProgressPoint(BaseModel):
    model_config = ConfigDict(extra="allow")
    attempt: int
    ts: float
    step: int | None = None
    loss: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None


class MetricsSummary(BaseModel):
    points: int
    last_step: int | None
    last_loss: float | None
    min_loss: float | None
    mean_tokens_per_s: float | None


class JobMetrics(BaseModel):
    job_id: str
    summary: MetricsSummary
    points: list[ProgressPoint]


def _thin(points: list[dict[str, Any]], most: int) -> list[dict[str, Any]]:
    """At most `most` points, evenly spaced, always keeping the last."""
    if len(points) <= most:
        return points
    stride = math.ceil((len(points) - 1) / (most - 1))
    return points[:-1][::stride] + [points[-1]]


@router.get(
    "/{job_id}/metrics",
    response_model=JobMetrics,
    responses=AUTHENTICATED | NOT_FOUND,
    summary="Training metrics of a job: the loss curve, learning rate, tokens/s per logging step",
)
async def job_metrics(
    request: Request,
    job_id: str = JOB_ID,
    who: Principal = Depends(authenticate),
    attempt: int | None = Query(None, ge=1, le=1_000_000, description="default: every attempt"),
    max_points: int = Query(1000, ge=2, le=100_000, description="thin the curve evenly to at most this many"),
):
    await visible_job(request, job_id, who)
    points = []
    for _, event in await read_job_events(request.app.state.bus, request.app.state.pool, job_id):
        if event.kind != "progress" or (attempt is not None and event.attempt != attempt):
            continue
        points.append(progress_point(event))
    losses = [p["loss"] for p in points if isinstance(p.get("loss"), (int, float)) and p["loss"] is not None]
    speeds = [p["tokens_per_s"] for p in points if isinstance(p.get("tokens_per_s"), (int, float))]
    summary = {
        "points": len(points),
        "last_step": points[-1].get("step") if points else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "mean_tokens_per_s": round(sum(speeds) / len(speeds), 3) if speeds else None,
    }
    return {"job_id": job_id, "summary": summary, "points": _thin(points, max_points)}


class JobEventOut(BaseModel):
    seq: int
    kind: str
    ts: float
    attempt: int
    node: str | None
    actor: str | None
    data: dict[str, Any]


class JobEvents(BaseModel):
    items: list[JobEventOut]


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return _finite(value)


@router.get(
    "/{job_id}/events",
    response_model=JobEvents,
    responses=AUTHENTICATED | NOT_FOUND,
    summary="A job's events from the bus: submitted, started, checkpointed, exited, ...",
)
async def job_events(
    request: Request,
    job_id: str = JOB_ID,
    who: Principal = Depends(authenticate),
    include_progress: bool = Query(False, description="also every progress event (see /metrics for the curve)"),
    limit: int = Query(1000, ge=1, le=10_000, description="the last N"),
):
    await visible_job(request, job_id, who)
    items = [
        {
            "seq": seq,
            "kind": e.kind,
            "ts": e.ts,
            "attempt": e.attempt,
            "node": e.node,
            "actor": e.actor,
            "data": _clean(e.data),
        }
        for seq, e in await read_job_events(request.app.state.bus, request.app.state.pool, job_id)
        if include_progress or e.kind != "progress"
    ][-limit:]
    # An event's data may speak of other jobs (a preemption's reason): redacted for a user. Progress
    # points are the job's own trainer's numbers.
    told = [n for n, item in enumerate(items) if item["kind"] != "progress"]
    for n, shown in zip(told, await redaction.for_viewer(request.app.state.pool, who, [items[n] for n in told])):
        items[n] = shown
    return {"items": items}
