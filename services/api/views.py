"""How rows from Postgres are shown to API clients."""
from __future__ import annotations

from typing import Any

import asyncpg


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def job_view(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "owner": row["owner"],
        "team": row["team"],
        "priority": row["priority"],
        "gpus": row["gpus"],
        "preemptible": row["preemptible"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "placement": row["placement"],
        "attempt": row["attempt"],
        "progress": row["progress"],
        "last_checkpoint": row["last_checkpoint"],
        "last_checkpoint_step": row["last_checkpoint_step"],
        "job_dir": row["job_dir"],
        "output_dir": f"{row['job_dir']}/output" if row["job_dir"] else None,
        "exit_code": row["exit_code"],
        "cancel_requested": row["cancel_requested"],
        "submitted_at": _iso(row["submitted_at"]),
        "started_at": _iso(row["started_at"]),
        "finished_at": _iso(row["finished_at"]),
        "spec": row["spec"],
    }


def audit_view(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "event_id": row["event_id"],
        "ts": _iso(row["ts"]),
        "source": row["source"],
        "kind": row["kind"],
        "actor": row["actor"],
        "job_id": row["job_id"],
        "node": row["node"],
        "decision_id": row["decision_id"],
        "rule": row["rule"],
        "action": row["action"],
        "reason": row["reason"],
        "evidence": row["evidence"],
        "data": row["data"],
        "hash": row["hash"],
    }
