"""The REST API: FastAPI app factory, lifespan (NATS, Postgres, the audit feed), routers.

Every request passes, outermost first: metrics → authentication gate (401 unless public) →
request limits (413, NUL in the URL) → FastAPI (validation 422, role checks 403, the route).
"""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from services.api import (
    adc_metrics,
    audit,
    bandit,
    cluster,
    controller,
    dashboard,
    job_chains,
    job_export,
    job_logs,
    job_telemetry,
    jobs,
    manual_actions,
    ops,
    policies,
    quotas,
    serving,
    tokens,
)
from services.api.audit_feed import AuditFeed
from services.api.auth import TOKENS_CHANGED, AuthenticationGate, TokenCache
from services.api.cluster_feed import ClusterFeed
from services.api.cluster_frames import ClusterFrames
from services.api.errors import AUTHENTICATED, CONFLICT, NOT_FOUND, TOO_LARGE, install_handlers
from services.api.nodes_snapshot import NodesSnapshots
from services.api.ops import ApiMetrics, RequestMetrics
from services.api.request_limits import RequestLimits, known_query_only
from services.api.streams import StreamLimits
from shared.infra import tracing
from shared.infra.audit_chain import load_chain_key
from shared.infra.bus import Bus
from shared.infra.bus_auth import bus_credential
from shared.infra.clock import Clock, SystemClock
from shared.infra.config import AdcConfig
from shared.infra.db import create_pool, service_url
from shared.specs.train_spec import TrainSpecError, load_schema


def create_app(config: AdcConfig, clock: Clock | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        state.config = config
        state.clock = clock or SystemClock()
        state.data_root = Path(config.storage.data_root or Path.cwd()).resolve()
        key_file = config.audit.chain_key_file
        state.chain_key = load_chain_key(key_file) if key_file else None
        db_url = service_url(
            config.database.url, "api", config.database.passwords_dir
        )  # its own role: records requests, never job status
        state.pool = await create_pool(db_url, config.database.pool_min, config.database.pool_max)
        state.bus = await Bus.connect(config.bus.url, config.bus.prefix, "adc-api", bus_credential(config, "api"))
        state.streams = StreamLimits(config.api.stream_recheck_s, config.api.max_streams_per_token)
        # Token rows cached while the feed's LISTEN connection is up; a change to any token empties it.
        state.tokens = TokenCache(state.clock, lambda: state.audit_feed.listening)
        state.audit_feed = AuditFeed(db_url, also={TOKENS_CHANGED: state.tokens.forget})
        await state.audit_feed.start()
        state.cluster_feed = ClusterFeed(state.bus, state.pool)
        await state.cluster_feed.start()
        state.cluster_frames = ClusterFrames(state.cluster_feed)
        state.nodes_snapshots = NodesSnapshots(
            state.pool, state.cluster_frames, state.clock, config.worker.node_timeout
        )
        try:
            load_schema()  # LLaMA-Factory's schema, read now to be frozen with the rest
        except TrainSpecError:
            pass  # each submission says so (422) until scripts/install.sh exports it
        # What startup made lives as long as the process: frozen out of the collector's sight, a full
        # collection no longer walks it (one took 50-90 ms, the p99 of every request it stalled).
        gc.freeze()
        try:
            yield
        finally:
            await state.streams.close()
            await state.nodes_snapshots.close()
            await state.cluster_feed.close()
            await state.audit_feed.close()
            await state.bus.close()
            await state.pool.close()

    app = FastAPI(
        title="ADC",
        version="0.1.0",
        description="The Adaptive Dynamic Controller: submit LLaMA-Factory fine-tunes, watch them, read why ADC "
        "acted. Every call but /healthz, /readyz, /metrics and the schema needs "
        "`Authorization: Bearer <token>`.",
        lifespan=lifespan,
        dependencies=[Depends(known_query_only)],
    )
    app.state.metrics = ApiMetrics()
    # dashboard first: its /v1/jobs/stream and /v1/nodes/stream must not be read as a job or node id.
    for module in (
        dashboard,
        jobs,
        job_chains,
        job_export,
        job_logs,
        job_telemetry,
        serving,
        cluster,
        audit,
        policies,
        quotas,
        tokens,
        controller,
        bandit,
        ops,
        adc_metrics,
    ):
        app.include_router(module.router)
    app.mount("/ui/static", dashboard.static, name="ui-static")
    # Manual actions document their own outcomes; the errors every mutation may answer are added here.
    app.include_router(manual_actions.router, responses=AUTHENTICATED | TOO_LARGE | NOT_FOUND | CONFLICT)
    install_handlers(app)

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, err: RecursionError) -> JSONResponse:
        return JSONResponse(
            {"detail": [{"type": "invalid", "loc": ["body"], "msg": "nested too deeply"}]}, status_code=422
        )

    # add_middleware wraps: the last added runs first.
    app.add_middleware(RequestLimits, max_body_bytes=config.api.max_body_bytes)
    app.add_middleware(AuthenticationGate)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    # A server span per request, continuing a caller's traceparent, once tracing.setup has run (as the api's
    # main does before this); without it the middleware would only cost every request its wrapping.
    if tracing.enabled():
        FastAPIInstrumentor.instrument_app(
            app, excluded_urls="/healthz,/readyz,/metrics$,/ui", exclude_spans=["receive", "send"]
        )
    return app
