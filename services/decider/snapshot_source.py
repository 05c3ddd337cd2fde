"""Builds each pass's snapshot: jobs, quotas and node states from Postgres (the executor and
api write them), nodes' devices and telemetry from the live cluster view.

Devices promised by decisions still in flight count as taken, so a pass never hands out what
the previous one already gave away. Elastic floors are made effective here: an elastic job's
`min_gpus` is never below its priority level's `min_gpus`.
"""
from __future__ import annotations

import json

import asyncpg

from services.decider.cluster_view import ClusterView
from services.decider.queue_order import admission_order
from services.decider.snapshot import JobView, MoveRequest, NodeView, Snapshot
from shared.actions import NodeGpus
from shared.config import AdcConfig
from shared.job_status import HOLDING_GPUS, JobStatus
from shared.quota import Quota

_JOBS_SQL = (
    "SELECT id, name, status, priority, priority_rank, gpus, preemptible, team, owner, placement::text AS placement,"
    " resume_from, attempt,"
    " extract(epoch FROM submitted_at) AS submitted, extract(epoch FROM started_at) AS started,"
    " coalesce((spec->>'multi_node')::boolean, false) AS multi_node,"
    " (spec->>'min_gpus')::float8 AS min_gpus, (spec->>'max_gpus')::float8 AS max_gpus,"
    " last_checkpoint_step, (progress->>'step')::float8 AS step, (progress->>'step_time_s')::float8 AS step_time_s,"
    " last_outcome, (progress->>'peak_memory_bytes')::float8 AS peak_memory,"
    " ((spec->'train') || train_overrides)->>'per_device_train_batch_size' AS micro_batch,"
    " ((spec->'train') || train_overrides)->>'gradient_accumulation_steps' AS grad_accum,"
    " coalesce((spec->'train'->>'max_steps')::float8, (progress->>'max_steps')::float8) AS max_steps"
    " FROM jobs WHERE status = ANY($1::text[])"
)


# Move requests of the last hour that no decision has answered yet (the decision names the request).
_OPEN_REQUESTS_SQL = (
    "SELECT r.id, r.job_id, r.target_node, r.actor, r.reason FROM move_requests r"
    " WHERE r.requested_at > to_timestamp($1) - interval '1 hour' AND NOT EXISTS (SELECT 1 FROM decisions d"
    " WHERE d.payload->'action'->'evidence'->>'request_id' = r.id) ORDER BY r.requested_at"
)


def _live_statuses() -> list[str]:
    return [JobStatus.PENDING.value] + sorted(s.value for s in HOLDING_GPUS)


def _int(value) -> int | None:
    return int(value) if value is not None else None


class PlacementCache:
    """Placements parsed once per distinct text: most jobs keep theirs for many passes."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._parsed: dict[str, tuple[NodeGpus, ...]] = {}

    def __call__(self, text: str | None) -> tuple[NodeGpus, ...]:
        if not text:
            return ()
        parsed = self._parsed.get(text)
        if parsed is None:
            if len(self._parsed) >= self.limit:
                self._parsed.clear()
            # Written by the executor from validated actions: no need to validate again.
            parsed = tuple(NodeGpus.model_construct(node=p["node"], gpus=tuple(p["gpus"])) for p in json.loads(text))
            self._parsed[text] = parsed
        return parsed


def job_from_row(r, levels: dict[str, int], checkpoints: dict[str, float],
                 placements: PlacementCache | None = None) -> JobView:
    """A job row as rules see it; `levels` maps each priority level to its min_gpus."""
    min_gpus, max_gpus = _int(r["min_gpus"]), _int(r["max_gpus"])
    if min_gpus is not None and r["priority"] in levels:
        min_gpus = min(r["gpus"], max(min_gpus, levels[r["priority"]]))
    return JobView(
        id=r["id"], name=r["name"], status=JobStatus(r["status"]), priority=r["priority"],
        priority_rank=r["priority_rank"], gpus=r["gpus"], preemptible=r["preemptible"],
        submitted_at=float(r["submitted"]), team=r["team"], owner=r.get("owner") or "",
        placement=(placements or PlacementCache())(r["placement"]),
        resume_from=r["resume_from"], multi_node=r["multi_node"], min_gpus=min_gpus, max_gpus=max_gpus,
        attempt=r["attempt"], started_at=float(r["started"]) if r["started"] is not None else None,
        last_checkpoint_step=r["last_checkpoint_step"], last_checkpoint_at=checkpoints.get(r["id"]),
        step=_int(r["step"]), step_time_s=r["step_time_s"],
        last_outcome=r["last_outcome"], peak_memory_bytes=_int(r["peak_memory"]),
        micro_batch=_int(r["micro_batch"]), grad_accum=_int(r["grad_accum"]),
        max_steps=_int(r["max_steps"]) if (r["max_steps"] or 0) > 0 else None,
    )


class SnapshotSource:
    def __init__(self, pool: asyncpg.Pool, view: ClusterView) -> None:
        self.pool = pool
        self.view = view
        self.placements = PlacementCache()

    async def controller_paused(self) -> str | None:
        """Why the controller is paused (operators pause it through the API), or None if it is not."""
        try:
            row = await self.pool.fetchrow("SELECT paused, reason, updated_by FROM controller_state")
        except asyncpg.UndefinedTableError:
            return None
        if row is None or not row["paused"]:
            return None
        by = f" by {row['updated_by']}" if row["updated_by"] else ""
        return f"the controller is paused{by}" + (f": {row['reason']}" if row["reason"] else "")

    async def latest_policy(self, known_version: int) -> tuple[int, dict | None] | None:
        """(version, body) of the newest policy document if it is not `known_version`; version 0: none."""
        try:
            version = await self.pool.fetchval("SELECT coalesce(max(version), 0) FROM policies")
        except asyncpg.UndefinedTableError:
            return None
        if version == known_version:
            return None
        body = await self.pool.fetchval("SELECT body FROM policies WHERE version = $1", version) if version else None
        return version, body

    async def decision_states(self, decision_ids: list[str]) -> dict[str, str]:
        if not decision_ids:
            return {}
        rows = await self.pool.fetch("SELECT decision_id, state FROM decisions WHERE decision_id = ANY($1::text[])",
                                     decision_ids)
        return {r["decision_id"]: r["state"] for r in rows}

    async def jobs(self, config: AdcConfig) -> tuple[JobView, ...]:
        rows = await self.pool.fetch(_JOBS_SQL, _live_statuses())
        levels = {lv.name: lv.min_gpus for lv in config.strategies.priority_scheduling.levels}
        return tuple(job_from_row(r, levels, self.view.checkpoints, self.placements) for r in rows)

    async def build(self, now: float, config: AdcConfig, jobs: tuple[JobView, ...], booked: list[NodeGpus],
                    schedules: tuple[str, ...] = ()) -> Snapshot:
        async with self.pool.acquire() as conn:
            quota_rows = await conn.fetch("SELECT * FROM quotas")
            node_rows = await conn.fetch("SELECT id, status FROM nodes")
            request_rows = await conn.fetch(_OPEN_REQUESTS_SQL, now)
        node_status = {r["id"]: r["status"] for r in node_rows}
        used: dict[str, set[int]] = {}
        for job in jobs:
            for part in job.placement if job.holds_gpus else ():
                used.setdefault(part.node, set()).update(part.gpus)
        for part in booked:
            used.setdefault(part.node, set()).update(part.gpus)
        timeout = config.worker.node_timeout
        nodes = {}
        for name, entry in self.view.nodes.items():
            if entry.beat is None:
                continue  # telemetry without a heartbeat: no worker there to run anything
            devices = tuple(d.index for d in entry.beat.devices)
            status = node_status.get(name, "ready")
            nodes[name] = NodeView(id=name, devices=devices, rack=entry.beat.rack, last_seen=entry.beat_at,
                                   free=tuple(i for i in devices if i not in used.get(name, set())),
                                   schedulable=now - entry.beat_at <= timeout and status == "ready",
                                   gpus=entry.gpus, status=status)
        requests = tuple(MoveRequest(id=r["id"], job_id=r["job_id"], target_node=r["target_node"], actor=r["actor"],
                                     reason=r["reason"]) for r in request_rows)
        return Snapshot(ts=now, nodes=nodes, jobs=jobs, telemetry=self.view.freeze(now),
                        quotas={r["team"]: Quota.from_row(r) for r in quota_rows}, schedules=schedules,
                        move_requests=requests, order=admission_order(config, jobs))
