"""The columns the decider's rules read of each job (services/decider/job_rows.py makes each row a
`JobView`; the simulator builds rows with the same columns as dicts)."""

from __future__ import annotations

import asyncpg

from shared.infra.job_reads.one_job import Db

# Values from the jobs' jsonb (spec, progress, overrides) are read as text and parsed per row: a cast in
# SQL would fail the whole query, so every pass, for one job whose value does not fit.
_RULE_COLUMNS = (
    "SELECT id, name, status, priority, priority_rank, gpus, preemptible, team, owner, placement::text AS placement,"
    " resume_from, attempt,"
    " extract(epoch FROM submitted_at) AS submitted, extract(epoch FROM started_at) AS started,"
    " spec->>'multi_node' AS multi_node, spec->>'min_gpus' AS min_gpus, spec->>'max_gpus' AS max_gpus,"
    " last_checkpoint_step, progress->>'step' AS step, progress->>'step_time_s' AS step_time_s,"
    " last_outcome, oom_retries, progress->>'peak_memory_bytes' AS peak_memory,"
    " ((spec->'train') || train_overrides)->>'per_device_train_batch_size' AS micro_batch,"
    " ((spec->'train') || train_overrides)->>'gradient_accumulation_steps' AS grad_accum,"
    " ((spec->'train') || train_overrides)->>'disable_gradient_checkpointing' AS no_gradient_checkpointing,"
    " coalesce(spec->'train'->>'max_steps', progress->>'max_steps') AS max_steps,"
    " spec->'train'->>'max_steps' AS spec_max_steps,"
    # `after`: the job this one waits for (services/api/job_refs.py), and that job's status now.
    " spec->>'after' AS after, (SELECT a.status FROM jobs a WHERE a.id = jobs.spec->>'after') AS after_status"
    " FROM jobs"
)
_BY_STATUS = _RULE_COLUMNS + " WHERE status = ANY($1::text[])"
_BY_ID = _RULE_COLUMNS + " WHERE id = ANY($1::text[])"


async def rule_rows_in(db: Db, statuses: list[str]) -> list[asyncpg.Record]:
    """The rule columns of every job in one of `statuses`."""
    return await db.fetch(_BY_STATUS, statuses)


async def rule_rows_of(db: Db, ids: list[str]) -> list[asyncpg.Record]:
    """The rule columns of the jobs `ids`, whatever their status (one that ended leaves the book)."""
    return await db.fetch(_BY_ID, ids)
