"""The REST API: FastAPI app factory, lifespan (NATS + Postgres), health endpoints."""
from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from services.api import cluster, jobs, manual_actions
from shared.bus import Bus
from shared.clock import Clock, SystemClock
from shared.config import AdcConfig
from shared.db import create_pool


def create_app(config: AdcConfig, clock: Clock | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        state.config = config
        state.clock = clock or SystemClock()
        state.data_root = Path(config.storage.data_root or Path.cwd()).resolve()
        state.pool = await create_pool(config.database.url, config.database.pool_min, config.database.pool_max)
        state.bus = await Bus.connect(config.bus.url, config.bus.prefix, "adc-api")
        try:
            yield
        finally:
            await state.bus.close()
            await state.pool.close()

    app = FastAPI(
        title="ADC",
        version="0.1.0",
        description="The Adaptive Dynamic Controller: submit LLaMA-Factory fine-tunes, watch them, read why ADC acted.",
        lifespan=lifespan,
    )
    app.include_router(jobs.router)
    app.include_router(cluster.router)
    app.include_router(manual_actions.router)

    @app.get("/healthz", tags=["ops"], summary="The process is alive")
    async def healthz():
        return {"ok": True}

    @app.get("/readyz", tags=["ops"], summary="NATS and Postgres are reachable")
    async def readyz(request: Request):
        state = request.app.state
        checks = {"nats": state.bus.nc.is_connected}
        try:
            await state.pool.fetchval("SELECT 1")
            checks["postgres"] = True
        except Exception:
            checks["postgres"] = False
        ready = all(checks.values())
        return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, **checks})

    return app
