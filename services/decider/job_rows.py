"""Job rows as rules see them: the columns the decider reads from `jobs`, and the `JobView` each
row becomes. The live decider (job book) and the simulator (rows built as dicts with these
columns) share `job_from_row`, so both hand rules the same jobs."""
from __future__ import annotations

import json

from services.decider.snapshot import JobView
from shared.actions import NodeGpus
from shared.job_status import HOLDING_GPUS, JobStatus

# The live jobs as rules see them (`job_from_row`); the simulator builds rows with these columns.
_JOB_COLUMNS = (
    "SELECT id, name, status, priority, priority_rank, gpus, preemptible, team, owner, placement::text AS placement,"
    " resume_from, attempt,"
    " extract(epoch FROM submitted_at) AS submitted, extract(epoch FROM started_at) AS started,"
    " coalesce((spec->>'multi_node')::boolean, false) AS multi_node,"
    " (spec->>'min_gpus')::float8 AS min_gpus, (spec->>'max_gpus')::float8 AS max_gpus,"
    " last_checkpoint_step, (progress->>'step')::float8 AS step, (progress->>'step_time_s')::float8 AS step_time_s,"
    " last_outcome, (progress->>'peak_memory_bytes')::float8 AS peak_memory,"
    " ((spec->'train') || train_overrides)->>'per_device_train_batch_size' AS micro_batch,"
    " ((spec->'train') || train_overrides)->>'gradient_accumulation_steps' AS grad_accum,"
    " ((spec->'train') || train_overrides)->>'disable_gradient_checkpointing' AS no_gradient_checkpointing,"
    " coalesce((spec->'train'->>'max_steps')::float8, (progress->>'max_steps')::float8) AS max_steps,"
    " (spec->'train'->>'max_steps')::float8 AS spec_max_steps"
    " FROM jobs"
)
JOBS_SQL = _JOB_COLUMNS + " WHERE status = ANY($1::text[])"
JOBS_BY_ID_SQL = _JOB_COLUMNS + " WHERE id = ANY($1::text[])"  # whatever their status: one that ended leaves


def live_statuses() -> list[str]:
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
        gradient_checkpointing=r.get("no_gradient_checkpointing") not in ("true", True),
        max_steps=_int(r["max_steps"]) if (r["max_steps"] or 0) > 0 else None,
    )
