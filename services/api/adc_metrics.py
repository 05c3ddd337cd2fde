"""ADC's own Prometheus series, computed at scrape time from Postgres (the record), so no
service keeps counters that a restart would lose and no other service has to export them.

- `/metrics` (public, like the HTTP counters): aggregates only, with no job or team in them:
  jobs by status and priority, queue wait, decisions by rule and action, protocol durations.
- `/v1/metrics` (operator, admin): per-job series only: training (step, loss, learning rate,
  tokens/s, steps/s, last checkpoint's size and time) and `adc_job_info{hpc_job, team, name}`,
  which joins a team onto the collectors' GPU series (`hpc_job`, as dcgm-exporter names the
  job holding a GPU; shared/contracts/dcgm.py).

No series is in both, and the GPU series are only the collectors', so a Prometheus scraping
the api's two paths and every collector stores each series once.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from services.api.auth import OPERATORS, Principal, require
from services.api.errors import AUTHENTICATED
from shared.contracts import dcgm
from shared.infra.job_reads import cluster_jobs

router = APIRouter(tags=["ops"])
JOB_LABELS = [dcgm.JOB_LABEL, "team", "name"]
LIVE = ("running", "checkpointing", "migrating", "resizing", "starting")


async def aggregate_families(pool) -> list[Metric]:
    jobs = GaugeMetricFamily("adc_jobs", "Jobs by status and priority.", labels=["status", "priority"])
    for r in await cluster_jobs.counts_by_status(pool):
        jobs.add_metric([r.status, r.priority], r.n)
    oldest = GaugeMetricFamily(
        "adc_queue_oldest_pending_seconds", "How long the oldest pending job has waited.", labels=["priority"]
    )
    for r in await cluster_jobs.oldest_pending(pool):
        oldest.add_metric([r.priority], r.s)
    wait = SummaryMetricFamily(
        "adc_job_queue_wait_seconds", "From submission to the first start, per started job.", labels=["priority"]
    )
    for r in await cluster_jobs.queue_waits(pool):
        wait.add_metric([r.priority], r.n, r.s or 0.0)
    decisions = CounterMetricFamily(
        "adc_decisions",
        "Decisions the executor received, by rule, action, reason code and outcome.",
        labels=["rule", "action", "reason_code", "state"],
    )
    for r in await pool.fetch(
        "SELECT rule, action, coalesce(payload->'action'->>'reason_code', '') AS code, state, count(*) AS n"
        " FROM decisions GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
    ):
        decisions.add_metric([r["rule"], r["action"], r["code"], r["state"]], r["n"])
    protocols = SummaryMetricFamily(
        "adc_protocol_duration_seconds", "Finished protocols (migrate, preempt, ...).", labels=["kind", "state"]
    )
    running = GaugeMetricFamily("adc_protocols_running", "Protocols under way.", labels=["kind"])
    for r in await pool.fetch(
        "SELECT kind, state, count(*) AS n, sum(extract(epoch FROM finished_at - started_at)) AS s"
        " FROM protocols GROUP BY 1, 2 ORDER BY 1, 2"
    ):
        if r["state"] == "running":
            running.add_metric([r["kind"]], r["n"])
        else:
            protocols.add_metric([r["kind"], r["state"]], r["n"], float(r["s"] or 0))
    return [jobs, oldest, wait, decisions, protocols, running]


_PER_JOB = [
    ("adc_job_step", "Optimizer steps done.", "step"),
    ("adc_job_max_steps", "Optimizer steps planned.", "max_steps"),
    ("adc_job_loss", "Training loss at the last logging step.", "loss"),
    ("adc_job_learning_rate", "Learning rate at the last logging step.", "learning_rate"),
    ("adc_job_tokens_per_second", "Training throughput.", "tokens_per_s"),
]


def _checkpoint_facts(path: str | None, root: Path) -> tuple[int, float] | None:
    """(bytes, completed at) of a checkpoint folder inside the storage root; None if unreadable."""
    if not path:
        return None
    folder = Path(path)
    try:
        if not folder.resolve().is_relative_to(root):
            return None
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        return size, os.stat(folder).st_mtime  # published by an atomic rename: the folder's time is its completion
    except OSError:
        return None


async def job_families(pool, storage_root: Path) -> list[Metric]:
    info = GaugeMetricFamily(
        "adc_job_info", "A live job's team and name (always 1): join it on hpc_job.", labels=JOB_LABELS
    )
    gauges = {key: GaugeMetricFamily(name, doc, labels=JOB_LABELS) for name, doc, key in _PER_JOB}
    steps = GaugeMetricFamily("adc_job_steps_per_second", "Optimizer steps per second.", labels=JOB_LABELS)
    size = GaugeMetricFamily("adc_job_checkpoint_bytes", "Size of the job's last checkpoint.", labels=JOB_LABELS)
    saved = GaugeMetricFamily(
        "adc_job_checkpoint_timestamp_seconds", "When the last checkpoint was completed.", labels=JOB_LABELS
    )
    for r in await cluster_jobs.live_progress(pool, list(LIVE)):
        labels, progress = [r.id, r.team, r.name], r.progress or {}
        info.add_metric(labels, 1)
        for _, _, key in _PER_JOB:
            if isinstance(progress.get(key), (int, float)):
                gauges[key].add_metric(labels, float(progress[key]))
        if isinstance(progress.get("step_time_s"), (int, float)) and progress["step_time_s"] > 0:
            steps.add_metric(labels, 1.0 / progress["step_time_s"])
        if facts := _checkpoint_facts(r.last_checkpoint, storage_root):
            size.add_metric(labels, facts[0])
            saved.add_metric(labels, facts[1])
    return [info, *gauges.values(), steps, size, saved]


def prometheus_response(*parts: bytes) -> Response:
    return Response(b"".join(parts), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/metrics",
    response_class=Response,
    responses=AUTHENTICATED
    | {200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "text exposition"}},
    summary="Prometheus metrics per job (operator); aggregates are on /metrics, GPUs on each collector's /metrics",
)
async def job_metrics(request: Request, _: Principal = Depends(require(*OPERATORS))):
    state = request.app.state
    families = await job_families(state.pool, Path(state.config.storage.root).resolve())
    return prometheus_response(dcgm.exposition(families))
