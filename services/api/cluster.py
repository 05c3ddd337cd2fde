"""Nodes, their devices and which job holds each (a user sees other teams' devices as busy,
without the job)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from services.api.auth import Principal, authenticate
from services.api.cluster_feed import gpu_holders
from services.api.cluster_frames import holder_label
from services.api.errors import AUTHENTICATED

router = APIRouter(tags=["cluster"])
READINGS_MAX_AGE_S = 2.0  # readings come once a second: a build this recent serves a read as it is


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
    nodes = await app.pool.fetch("SELECT * FROM nodes ORDER BY id")
    used: dict[str, dict[int, str]] = {}
    for (node, gpu), (job_id, team) in (await gpu_holders(app.pool)).items():
        used.setdefault(node, {})[gpu] = holder_label(who, job_id, team)
    now = app.clock.now()
    timeout = app.config.worker.node_timeout
    items = []
    for n in nodes:
        age = now - n["last_heartbeat"].timestamp()
        in_use = used.get(n["id"], {})
        items.append(
            {
                "id": n["id"],
                "status": n["status"] if age <= timeout else "unreachable",
                "rack": n["rack"],
                "last_heartbeat_age_s": round(age, 1),
                "devices": [d | {"job_id": in_use.get(d["index"])} for d in n["devices"]],
                "free": sum(1 for d in n["devices"] if d["index"] not in in_use),
            }
        )
    # Built as the model describes it; returned as is, as 8,000 devices take longer to validate again than to list.
    if not telemetry:
        return JSONResponse({"items": items})
    frames = await app.cluster_frames.latest(who, max_age_s=READINGS_MAX_AGE_S)
    listed = json.dumps({"items": items, "frame": frames.token}, separators=(",", ":"))
    # The readings are already encoded, once for every caller of the audience: spliced in, not decoded again.
    return Response(f'{listed[:-1]},"telemetry":[{",".join(frames.since(0))}]}}', media_type="application/json")
