"""The executor's writes to Postgres: job status through the transition table, nodes, decisions.

The executor is the one writer of job status and placement; every change goes through
`transition`, which enforces the table and records the history row in the same transaction.
"""
from __future__ import annotations

import json
from typing import Any

import asyncpg

from shared.job_status import HOLDING_GPUS, JobStatus, check_transition

_JOB_FIELDS = {"placement", "attempt", "resume_from", "last_checkpoint", "last_checkpoint_step", "progress",
               "job_dir", "exit_code", "started_at", "finished_at", "env"}


async def transition(
    conn: asyncpg.Connection, job_id: str, new: JobStatus, *, reason: str | None = None,
    decision_id: str | None = None, **fields: Any,
) -> asyncpg.Record | None:
    """Move a job to `new`; None if it is already there. Raises InvalidTransition if not allowed."""
    if unknown := set(fields) - _JOB_FIELDS:
        raise ValueError(f"not job fields: {sorted(unknown)}")
    async with conn.transaction():
        row = await conn.fetchrow("SELECT status FROM jobs WHERE id = $1 FOR UPDATE", job_id)
        if row is None:
            raise LookupError(f"no job {job_id}")
        old = JobStatus(row["status"])
        if old == new:
            return None
        check_transition(job_id, old, new)
        sets = ["status = $2", "status_reason = $3", "updated_at = now()"]
        args: list[Any] = [job_id, new.value, reason]
        for key, value in fields.items():
            args.append(value)
            sets.append(f"{key} = ${len(args)}")
        updated = await conn.fetchrow(f"UPDATE jobs SET {', '.join(sets)} WHERE id = $1 RETURNING *", *args)
        await conn.execute(
            "INSERT INTO job_status_history (job_id, old_status, new_status, decision_id, reason) VALUES ($1,$2,$3,$4,$5)",
            job_id, old.value, new.value, decision_id, reason,
        )
        return updated


async def scheduled_by(conn: asyncpg.Connection, job_id: str, decision_id: str) -> bool:
    """Whether this decision already moved the job to scheduled (a redelivery after a crash)."""
    return bool(await conn.fetchval(
        "SELECT 1 FROM job_status_history WHERE job_id = $1 AND decision_id = $2 AND new_status = 'scheduled'",
        job_id, decision_id,
    ))


async def booked_devices(conn: asyncpg.Connection, exclude_job: str | None = None) -> dict[tuple[str, int], str]:
    """(node, device) -> job, for every job that holds devices now."""
    rows = await conn.fetch(
        "SELECT id, placement FROM jobs WHERE status = ANY($1::text[]) AND placement IS NOT NULL AND id <> $2",
        [s.value for s in HOLDING_GPUS], exclude_job or "",
    )
    return {(p["node"], g): r["id"] for r in rows for p in r["placement"] for g in p["gpus"]}


async def record_decision(conn: asyncpg.Connection, decision_id: str, job_id: str, rule: str, action: str,
                          payload: dict[str, Any]) -> str:
    """Record a received decision; return its state (received for a new one)."""
    await conn.execute(
        "INSERT INTO decisions (decision_id, job_id, rule, action, payload, state) VALUES ($1,$2,$3,$4,$5,'received')"
        " ON CONFLICT (decision_id) DO NOTHING",
        decision_id, job_id, rule, action, payload,
    )
    return await conn.fetchval("SELECT state FROM decisions WHERE decision_id = $1", decision_id)


async def finish_decision(conn: asyncpg.Connection, decision_id: str, state: str, outcome: str) -> None:
    await conn.execute(
        "UPDATE decisions SET state = $2, outcome = $3, finished_at = now() WHERE decision_id = $1",
        decision_id, state, outcome,
    )


async def upsert_node(conn: asyncpg.Connection, node: str, devices: list[dict], rack: str, started_at, seen_at,
                      address: str = "127.0.0.1") -> bool:
    """Record a heartbeat; True if the node is new."""
    inserted = await conn.fetchval(
        "INSERT INTO nodes (id, devices, rack, started_at, last_heartbeat, address) VALUES ($1, $2, $3, $4, $5, $6)"
        " ON CONFLICT (id) DO UPDATE SET devices = EXCLUDED.devices, rack = EXCLUDED.rack, address = EXCLUDED.address,"
        " started_at = EXCLUDED.started_at, last_heartbeat = EXCLUDED.last_heartbeat,"
        " status = CASE WHEN nodes.status = 'lost' THEN 'ready' ELSE nodes.status END"
        " RETURNING (xmax = 0)",
        node, json.loads(json.dumps(devices)), rack, started_at, seen_at, address,
    )
    return bool(inserted)


async def _update_row(conn: asyncpg.Connection, table: str, key: str, fields: dict[str, Any],
                      extra_sets: tuple[str, ...] = ()) -> asyncpg.Record:
    sets, args = ["updated_at = now()", *extra_sets], [key]
    for column, value in fields.items():
        args.append(value)
        sets.append(f"{column} = ${len(args)}")
    return await conn.fetchrow(f"UPDATE {table} SET {', '.join(sets)} WHERE id = $1 RETURNING *", *args)


async def update_job(conn: asyncpg.Connection, job_id: str, **fields: Any) -> asyncpg.Record:
    """Change fields other than status (e.g. a new attempt while migrating)."""
    if unknown := set(fields) - _JOB_FIELDS:
        raise ValueError(f"not job fields: {sorted(unknown)}")
    return await _update_row(conn, "jobs", job_id, fields)


async def free_devices(conn: asyncpg.Connection, node_timeout: float, exclude_job: str | None = None,
                       exclude_nodes: set[str] = frozenset()) -> dict[str, list[int]]:
    """Free devices of each ready, live node."""
    nodes = await conn.fetch(
        "SELECT id, devices FROM nodes WHERE status = 'ready' AND last_heartbeat > now() - make_interval(secs => $1)",
        node_timeout,
    )
    booked = await booked_devices(conn, exclude_job)
    return {n["id"]: [d["index"] for d in n["devices"] if (n["id"], d["index"]) not in booked]
            for n in nodes if n["id"] not in exclude_nodes}


async def begin_protocol(conn: asyncpg.Connection, protocol_id: str, job_id: str, kind: str, step: str,
                         source: Any, target: Any, detail: dict | None = None) -> tuple[str, asyncpg.Record | None]:
    """Start recording a protocol. Returns ("new"|"exists"|"busy", row)."""
    existing = await conn.fetchrow("SELECT * FROM protocols WHERE id = $1", protocol_id)
    if existing is not None:
        return "exists", existing
    try:
        row = await conn.fetchrow(
            "INSERT INTO protocols (id, job_id, kind, step, source, target, detail) VALUES ($1,$2,$3,$4,$5,$6,$7)"
            " RETURNING *", protocol_id, job_id, kind, step, source, target, detail or {},
        )
        return "new", row
    except asyncpg.UniqueViolationError:  # another protocol is running for this job
        return "busy", await conn.fetchrow("SELECT * FROM protocols WHERE job_id = $1 AND state = 'running'", job_id)


async def set_protocol(conn: asyncpg.Connection, protocol_id: str, **fields: Any) -> asyncpg.Record:
    allowed = {"step", "state", "checkpoint", "ckpt_step", "target", "detail", "error"}
    if unknown := set(fields) - allowed:
        raise ValueError(f"not protocol fields: {sorted(unknown)}")
    ended = ("finished_at = now()",) if fields.get("state") in ("done", "failed", "rolled_back") else ()
    return await _update_row(conn, "protocols", protocol_id, fields, ended)
