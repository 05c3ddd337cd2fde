"""Read-only routes over the cluster: nodes and the audit log."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends, Query, Request

from services.api.auth import Principal, authenticate
from services.api.views import audit_view
from shared.job_status import HOLDING_GPUS

router = APIRouter(tags=["cluster"])


@router.get("/v1/nodes", summary="Nodes, their devices and which are in use")
async def list_nodes(request: Request, who: Principal = Depends(authenticate)):
    app = request.app.state
    nodes = await app.pool.fetch("SELECT * FROM nodes ORDER BY id")
    jobs = await app.pool.fetch(
        "SELECT id, placement FROM jobs WHERE status = ANY($1::text[]) AND placement IS NOT NULL",
        [s.value for s in HOLDING_GPUS],
    )
    used: dict[str, dict[int, str]] = {}
    for job in jobs:
        for part in job["placement"]:
            for gpu in part["gpus"]:
                used.setdefault(part["node"], {})[gpu] = job["id"]
    now = app.clock.now()
    timeout = app.config.worker.node_timeout
    items = []
    for n in nodes:
        age = now - n["last_heartbeat"].timestamp()
        in_use = used.get(n["id"], {})
        items.append({
            "id": n["id"],
            "status": n["status"] if age <= timeout else "unreachable",
            "rack": n["rack"],
            "last_heartbeat_age_s": round(age, 1),
            "devices": [d | {"job_id": in_use.get(d["index"])} for d in n["devices"]],
            "free": sum(1 for d in n["devices"] if d["index"] not in in_use),
        })
    return {"items": items}


@router.get("/v1/audit", summary="Query the audit log, oldest first")
async def query_audit(
    request: Request,
    who: Principal = Depends(authenticate),
    job_id: str | None = Query(None, max_length=64),
    kind: str | None = Query(None, max_length=64),
    node: str | None = Query(None, max_length=64),
    rule: str | None = Query(None, max_length=64),
    action: str | None = Query(None, max_length=32),
    actor: str | None = Query(None, max_length=200),
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: int = Query(0, ge=0, description="cursor: the last id already seen"),
    limit: int = Query(100, ge=1, le=1000),
):
    filters = {"job_id": job_id, "kind": kind, "node": node, "rule": rule, "action": action, "actor": actor}
    where, args = ["id > $1"], [after_id]
    for column, value in filters.items():
        if value is not None:
            args.append(value)
            where.append(f"{column} = ${len(args)}")
    if since is not None:
        args.append(since)
        where.append(f"ts >= ${len(args)}")
    if until is not None:
        args.append(until)
        where.append(f"ts < ${len(args)}")
    if not who.sees_all:
        # A user reads the trail of their own team's jobs only.
        args.append(who.team)
        where.append(f"job_id IN (SELECT id FROM jobs WHERE team = ${len(args)})")
    args.append(limit)
    rows = await request.app.state.pool.fetch(
        f"SELECT * FROM audit_events WHERE {' AND '.join(where)} ORDER BY id LIMIT ${len(args)}", *args,
    )
    items = [audit_view(r) for r in rows]
    return {"items": items, "next_after_id": items[-1]["id"] if items else after_id}
