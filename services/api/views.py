"""How rows from Postgres are shown to API clients, and the response models that document it."""

from __future__ import annotations

from typing import Any

import asyncpg
from pydantic import BaseModel, ConfigDict, Field

from shared.infra.tracing import trace_id_of


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


class JobOut(BaseModel):
    # Open to fields added later (e.g. the decider's pending_reason), so they reach clients.
    model_config = ConfigDict(extra="allow")
    id: str
    name: str
    owner: str
    team: str
    priority: str
    gpus: int
    preemptible: bool
    status: str
    status_reason: str | None
    placement: list[dict[str, Any]] | None
    attempt: int
    progress: dict[str, Any] | None
    last_checkpoint: str | None
    last_checkpoint_step: int | None
    job_dir: str | None
    output_dir: str | None
    exit_code: int | None
    evaluation: dict[str, Any] = Field(
        default_factory=dict,
        description="newest metrics of each evaluation pass: {eval: {step, eval_loss, ...}, "
        "predict: {...}} (LLaMA-Factory's do_eval / val_size / do_predict)",
    )
    last_outcome: str | None = Field(None, description="how the last attempt ended: succeeded, stopped, oom, ...")
    oom_retries: int = 0
    train_overrides: dict[str, Any] = Field(default_factory=dict, description="train keys ADC changed (OOM retries)")
    cancel_requested: bool
    submitted_at: str | None
    started_at: str | None
    finished_at: str | None
    pending_reason: str | None = None
    trace_id: str | None = None
    spec: dict[str, Any]


class JobPage(BaseModel):
    items: list[JobOut]
    next: str | None


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
        "evaluation": row.get("evaluation") or {},
        "last_outcome": row["last_outcome"],
        "oom_retries": row["oom_retries"],
        "train_overrides": row["train_overrides"],
        "cancel_requested": row["cancel_requested"],
        "submitted_at": _iso(row["submitted_at"]),
        "started_at": _iso(row["started_at"]),
        "finished_at": _iso(row["finished_at"]),
        "trace_id": trace_id_of(row.get("trace_parent")),
        "spec": row["spec"],
    }


class AuditEventOut(BaseModel):
    id: int
    event_id: str
    ts: str
    source: str
    kind: str
    actor: str | None
    job_id: str | None
    node: str | None
    decision_id: str | None
    rule: str | None
    action: str | None
    reason: str | None
    evidence: dict[str, Any]
    data: dict[str, Any]
    hash: str


class AuditPage(BaseModel):
    items: list[AuditEventOut]
    next_after_id: int


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
