"""Nodes, their devices and which job holds each (a user sees other teams' devices as busy,
without the job)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from services.api.auth import Principal, authenticate
from services.api.cluster_feed import gpu_holders
from services.api.errors import AUTHENTICATED
from services.api.nodes_snapshot import labels_for, node_items

router = APIRouter(tags=["cluster"])


class NodeOut(BaseModel):
    id: str
    status: str
    rack: str
    last_heartbeat_age_s: float
    devices: list[dict[str, Any]]
    free: int


class NodeList(BaseModel):
    items: list[NodeOut]
    frame: str | None = Field(None, description="with telemetry: the live frame `telemetry` is of")
    telemetry: list[dict[str, Any]] | None = Field(
        None, description="with telemetry: each reporting node's latest readings, as /v1/nodes/stream sends them"
    )


@router.get(
    "/v1/nodes", response_model=NodeList, responses=AUTHENTICATED, summary="Nodes, their devices and which are in use"
)
async def list_nodes(
    request: Request,
    who: Principal = Depends(authenticate),
    telemetry: bool = Query(
        False,
        description="also each node's latest readings and the frame they are of: pass `frame` to "
        "/v1/nodes/stream as `since`, and it sends only what changed after",
    ),
):
    app = request.app.state
    if telemetry:  # the dashboard's first read: the same bytes for every caller of an audience, per build
        zipped = "gzip" in request.headers.get("accept-encoding", "")
        headers = {"Vary": "Accept-Encoding"} | ({"Content-Encoding": "gzip"} if zipped else {})
        return Response(await app.nodes_snapshots.body(who, zipped), media_type="application/json", headers=headers)
    nodes = await app.pool.fetch("SELECT * FROM nodes ORDER BY id")
    labels = labels_for(who, await gpu_holders(app.pool))
    items = node_items(nodes, labels, app.clock.now(), app.config.worker.node_timeout)
    # Built as the model describes it; returned as is, as 8,000 devices take longer to validate again than to list.
    return JSONResponse({"items": items})
