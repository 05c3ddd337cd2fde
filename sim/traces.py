"""Readers for the job traces in ../shared/traces/, each into the same `TraceJob` rows.

Formats are told apart by their header:
- Philly (`philly.csv`): timestamp (YYYY-MM-DD HH:MM:SS), duration, num_gpus, gpu_time, cluster.
  Rows are not sorted; submission times become seconds after the earliest one.
- Microsoft ITP (`clusterNN.csv`): job_id, submission_time (s), duration (s), num_gpu.
- Pollux (`workload-N.csv`): name, time (s), application, num_replicas, batch_size. It has no
  duration: a job trains until its model converges, which Pollux computed from throughput
  models we do not have. Here each application gets a GPU-hours figure (`POLLUX_GPU_HOURS`,
  the middle of the Pollux paper's size class for that model: small, medium, large, x-large),
  spread by a seeded log-normal factor (sigma 0.5) and divided by the job's GPUs. Made up by us,
  documented as such.

`window(jobs, start_s, days)` keeps the jobs submitted in [first + start_s, first + start_s + days).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

POLLUX_GPU_HOURS = {"ncf": 0.25, "cifar10": 0.5, "deepspeech2": 2.0, "bert": 2.0, "yolov3": 12.0, "imagenet": 60.0}


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class TraceJob:
    name: str
    submit_s: float  # seconds after the trace's first submission
    duration_s: float  # seconds it runs on `gpus` devices (never shown to a policy)
    gpus: int


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if any((v or "").strip() for v in r.values())]
        return list(reader.fieldnames or []), rows


def _positive(value: str, field: str, line: int) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"line {line}: {field} {value!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise TraceError(f"line {line}: {field} {value!r} must be a finite number >= 0")
    return x


def _gpus(value: str, field: str, line: int) -> int:
    x = _positive(value, field, line)
    if x < 1 or x != int(x):
        raise TraceError(f"line {line}: {field} {value!r} must be a whole number >= 1")
    return int(x)


def read_trace(path: str | Path, seed: int = 0) -> list[TraceJob]:
    """Every job of the trace, sorted by submission, times relative to the first submission."""
    path = Path(path)
    header, rows = _rows(path)
    fields = set(header)
    if {"timestamp", "duration", "num_gpus"} <= fields:
        jobs = _philly(rows)
    elif {"submission_time", "duration", "num_gpu"} <= fields:
        jobs = [
            TraceJob(
                r.get("job_id") or f"job-{i}",
                _positive(r["submission_time"], "submission_time", i + 2),
                max(1.0, _positive(r["duration"], "duration", i + 2)),
                _gpus(r["num_gpu"], "num_gpu", i + 2),
            )
            for i, r in enumerate(rows)
        ]
    elif {"time", "application", "num_replicas"} <= fields:
        jobs = _pollux(rows, seed)
    else:
        raise TraceError(f"{path}: unknown trace format (columns {header}); expected Philly, ITP or Pollux")
    if not jobs:
        raise TraceError(f"{path}: no jobs")
    jobs.sort(key=lambda j: (j.submit_s, j.name))
    first = jobs[0].submit_s
    return [TraceJob(j.name, j.submit_s - first, j.duration_s, j.gpus) for j in jobs]


# A timestamp written exactly as YYYY-MM-DD HH:MM:SS: `fromisoformat` reads it as `strptime` does, at a
# tenth of the cost (82 k rows are read for every run, even of a short window); anything else goes to strptime.
_PLAIN_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")


def _timestamp(text: str) -> float:
    if isinstance(text, str) and _PLAIN_TIMESTAMP.fullmatch(text):
        return datetime.fromisoformat(text).timestamp()
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()


def _philly(rows: list[dict[str, str]]) -> list[TraceJob]:
    jobs = []
    for i, r in enumerate(rows):
        try:
            ts = _timestamp(r["timestamp"])
        except (TypeError, ValueError):
            raise TraceError(f"line {i + 2}: timestamp {r['timestamp']!r} is not YYYY-MM-DD HH:MM:SS") from None
        jobs.append(
            TraceJob(
                f"philly-{i}",
                ts,
                max(1.0, _positive(r["duration"], "duration", i + 2)),
                _gpus(r["num_gpus"], "num_gpus", i + 2),
            )
        )
    return jobs


def _pollux(rows: list[dict[str, str]], seed: int) -> list[TraceJob]:
    rng = np.random.default_rng([seed, 0x9011])
    jobs = []
    for i, r in enumerate(rows):
        app = r["application"]
        if app not in POLLUX_GPU_HOURS:
            raise TraceError(f"line {i + 2}: application {app!r} is not one of {sorted(POLLUX_GPU_HOURS)}")
        gpus = _gpus(r["num_replicas"], "num_replicas", i + 2)
        gpu_s = POLLUX_GPU_HOURS[app] * 3600 * float(rng.lognormal(0.0, 0.5))
        jobs.append(
            TraceJob(r.get("name") or f"{app}-{i}", _positive(r["time"], "time", i + 2), max(60.0, gpu_s / gpus), gpus)
        )
    return jobs


def window(jobs: list[TraceJob], start_s: float = 0.0, days: float | None = None) -> list[TraceJob]:
    """Jobs submitted in [start_s, start_s + days), times shifted so the window starts at 0."""
    end = math.inf if days is None else start_s + days * 86400
    return [TraceJob(j.name, j.submit_s - start_s, j.duration_s, j.gpus) for j in jobs if start_s <= j.submit_s < end]
