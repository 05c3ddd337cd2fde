"""Job rows as rules see them: the `JobView` each row of the rule columns (shared/infra/job_reads/
rule_rows.py) becomes. The live decider (job book) and the simulator (rows built as dicts with these
columns) share `job_from_row`, so both hand rules the same jobs."""

from __future__ import annotations

import json
import math

from services.decider.snapshot import JobView
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import HOLDING_GPUS, JobStatus


def live_statuses() -> list[str]:
    return [JobStatus.PENDING.value] + sorted(s.value for s in HOLDING_GPUS)


MAX_COUNT = 2**53  # what a count (devices, steps, bytes) may be: exact as a float, far above any real one


class UnreadableRow(ValueError):
    """A job row with a value the decider cannot read; `problems` names each column and its value."""

    def __init__(self, job_id: str, problems: list[str]) -> None:
        self.job_id = job_id
        self.problems = problems
        super().__init__(f"job {job_id}: " + "; ".join(problems))


class _Reader:
    """One row's values, each parsed or, if it cannot be, None and noted (the row is then unreadable)."""

    def __init__(self, row) -> None:
        self.row = row
        self.problems: list[str] = []

    def number(self, column: str, integral: bool = True) -> float | int | None:
        raw = self.row[column]
        if raw is None:
            return None
        try:
            value = float(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError, OverflowError):
            value = None
        if value is None or not math.isfinite(value) or abs(value) > MAX_COUNT:
            self.problems.append(f"{column} {str(raw)[:40]!r} is not a number of at most {MAX_COUNT}")
            return None
        return int(value) if integral else value

    def flag(self, column: str) -> bool:
        raw = self.row[column]
        if raw in (None, False, "false"):
            return False
        if raw in (True, "true"):
            return True
        self.problems.append(f"{column} {str(raw)[:40]!r} is not true or false")
        return False


def read_count(value) -> int | None:
    """A count read from a row, or None if it is absent or not a number of at most MAX_COUNT."""
    read = _Reader({"value": value})
    count = read.number("value")
    return None if read.problems else count


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


def job_from_row(
    r,
    levels: dict[str, int],
    checkpoints: dict[str, float],
    placements: PlacementCache | None = None,
    problems: list[str] | None = None,
) -> JobView:
    """A job row as rules see them; `levels` maps each priority level to its min_gpus. A value that cannot be
    read is left out (None) and noted in `problems`; without that list, it raises UnreadableRow."""
    read = _Reader(r)
    min_gpus, max_gpus = read.number("min_gpus"), read.number("max_gpus")
    if min_gpus is not None and r["priority"] in levels:
        min_gpus = min(r["gpus"], max(min_gpus, levels[r["priority"]]))
    max_steps = read.number("max_steps")
    view = JobView(
        id=r["id"],
        name=r["name"],
        status=JobStatus(r["status"]),
        priority=r["priority"],
        priority_rank=r["priority_rank"],
        gpus=r["gpus"],
        preemptible=r["preemptible"],
        submitted_at=float(r["submitted"]),
        team=r["team"],
        owner=r.get("owner") or "",
        placement=(placements or PlacementCache())(r["placement"]),
        resume_from=r["resume_from"],
        multi_node=read.flag("multi_node"),
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        attempt=r["attempt"],
        started_at=float(r["started"]) if r["started"] is not None else None,
        last_checkpoint_step=r["last_checkpoint_step"],
        last_checkpoint_at=checkpoints.get(r["id"]),
        step=read.number("step"),
        step_time_s=read.number("step_time_s", integral=False),
        last_outcome=r["last_outcome"],
        oom_retries=r.get("oom_retries") or 0,
        peak_memory_bytes=read.number("peak_memory"),
        micro_batch=read.number("micro_batch"),
        grad_accum=read.number("grad_accum"),
        gradient_checkpointing=r.get("no_gradient_checkpointing") not in ("true", True),
        max_steps=max_steps if (max_steps or 0) > 0 else None,
    )
    if read.problems:
        if problems is None:
            raise UnreadableRow(r["id"], read.problems)
        problems.extend(read.problems)
    return view
