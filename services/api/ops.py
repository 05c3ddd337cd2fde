"""What operators' tooling asks of the api process itself: liveness, readiness (NATS and
Postgres reachable) and Prometheus metrics.

These three answer without a token: probes and scrapers hold none, and the metrics are
aggregate counts (by route template and status, and ADC's aggregates: services/api/adc_metrics.py),
with no job, team or token in them; `/v1/metrics` (operators) has the per-job and per-GPU series.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.adc_metrics import aggregate_families, prometheus_response
from shared.contracts import dcgm

log = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])


class ApiMetrics:
    """One registry per app, so several apps in one process (tests) do not collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "adc_api_requests_total", "HTTP requests answered", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "adc_api_request_seconds",
            "Time to the response's first byte",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.jobs_submitted = Counter("adc_api_jobs_submitted_total", "Jobs accepted", registry=self.registry)
        self.audit_tails = Gauge("adc_api_audit_tails", "Live audit tails connected", registry=self.registry)


# Labels come from fixed sets only (a route template, not the path; these methods, else "other"):
# a client sending arbitrary methods or paths must not be able to grow the series without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetrics:
    """ASGI middleware counting every answer, 401s from the gate included, by route template."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        answered = False

        async def counting_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                route = scope.get("route")
                # No route: refused before routing (401, 413) or no such path.
                template = getattr(route, "path", None) or "(not routed)"
                method = scope["method"] if scope["method"] in METHODS else "other"
                self.metrics.requests.labels(method, template, str(message["status"])).inc()
                self.metrics.latency.labels(method, template).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, counting_send)


class Health(BaseModel):
    ok: bool


class Readiness(BaseModel):
    ready: bool
    nats: bool
    postgres: bool


@router.get("/healthz", response_model=Health, summary="The process is alive")
async def healthz():
    return {"ok": True}


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="NATS and Postgres are reachable",
    responses={503: {"model": Readiness, "description": "NATS or Postgres is not reachable"}},
)
async def readyz(request: Request):
    state = request.app.state
    checks = {"nats": state.bus.nc.is_connected}
    try:
        await asyncio.wait_for(state.pool.fetchval("SELECT 1"), timeout=2)
        checks["postgres"] = True
    except Exception:  # any failure means not ready; the reason is in the Postgres logs
        checks["postgres"] = False
    ready = all(checks.values())
    return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, **checks})


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "text exposition"}},
)
async def metrics(request: Request):
    state = request.app.state
    try:
        adc = dcgm.exposition(await aggregate_families(state.pool))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:  # the HTTP counters still answer
        log.warning("ADC series left out of /metrics, Postgres unreachable: %s", err)
        adc = b""
    return prometheus_response(generate_latest(state.metrics.registry), adc)
