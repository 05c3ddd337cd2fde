"""Nodes, their devices and which job holds each (a user sees other teams' devices as busy,
without the job)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.api.auth import Principal, authenticate
from services.api.cluster_feed import gpu_holders
from services.api.errors import AUTHENTICATED

router = APIRouter(tags=["cluster"])


OTHER_TEAM = "(another team)"


def holder_label(who: Principal, job_id: str, team: str) -> str:
    """What the caller may know of the job holding a device: its id, or only that it is taken."""
    return job_id if who.may_act_on_team(team) else OTHER_TEAM


class NodeOut(BaseModel):
    id: str
    status: str
    rack: str
    last_heartbeat_age_s: float
    devices: list[dict[str, Any]]
    free: int


class NodeList(BaseModel):
    items: list[NodeOut]


@router.get(
    "/v1/nodes", response_model=NodeList, responses=AUTHENTICATED, summary="Nodes, their devices and which are in use"
)
async def list_nodes(request: Request, who: Principal = Depends(authenticate)):
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
    return JSONResponse({"items": items})
