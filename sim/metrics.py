"""The figures of one simulated run: job completion time, queueing delay per priority level,
makespan, utilization, protocol counts and the GPU-hours they cost; memory spikes, what
oom_protection did about them (`oom_actions`, by action) and the out-of-memory deaths left.

Queueing delay is submission to first start. Utilization is devices held by jobs over all
devices, averaged over the makespan (first submission to last completion); `productive` counts
only devices of jobs making progress (not checkpointing or restarting).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from sim.simulator import SimResult


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"avg": None, "p50": None, "p95": None}
    a = np.asarray(values)
    return {"avg": float(a.mean()), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}


def utilization_series(result: SimResult, end: float, bins: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bin start times, held fraction, productive fraction), time-weighted within each bin."""
    edges = np.linspace(0.0, max(end, 1.0), bins + 1)
    held, busy = np.zeros(bins), np.zeros(bins)
    points = result.timeline + [(end, 0, 0)]
    for (t0, h, b), (t1, _, _) in zip(points, points[1:]):
        if t1 <= t0:
            continue
        lo, hi = np.searchsorted(edges, t0, side="right") - 1, np.searchsorted(edges, t1, side="left")
        for i in range(max(lo, 0), min(hi, bins)):
            overlap = min(t1, edges[i + 1]) - max(t0, edges[i])
            if overlap > 0:
                held[i] += h * overlap
                busy[i] += b * overlap
    width = np.diff(edges) * result.gpus
    return edges[:-1], held / width, busy / width


def figures(result: SimResult) -> dict:
    done = [j for j in result.jobs if j.finish_s is not None]
    jct = [j.finish_s - j.submit_s for j in done]
    first = min((j.submit_s for j in result.jobs), default=0.0)
    end = max((j.finish_s for j in done), default=first)
    makespan = end - first
    held_area = busy_area = 0.0
    points = result.timeline + [(end, 0, 0)]
    for (t0, h, b), (t1, _, _) in zip(points, points[1:]):
        held_area += h * max(0.0, min(t1, end) - t0)
        busy_area += b * max(0.0, min(t1, end) - t0)
    queueing = {}
    for level in sorted({j.priority for j in result.jobs}):
        delays = [
            j.first_start_s - j.submit_s for j in result.jobs if j.priority == level and j.first_start_s is not None
        ]
        s = _stats(delays)
        queueing[level] = {"avg": s["avg"], "p95": s["p95"], "jobs": len(delays)}
    c = result.counters
    return {
        "policy": result.policy,
        "gpus": result.gpus,
        "jobs": len(result.jobs),
        "finished": len(done),
        "dropped": result.dropped,
        "jct_s": _stats(jct),
        "queueing_s": queueing,
        "makespan_s": makespan,
        "utilization": held_area / (result.gpus * makespan) if makespan > 0 else 0.0,
        "productive_utilization": busy_area / (result.gpus * makespan) if makespan > 0 else 0.0,
        "preemptions": c.preemptions,
        "migrations": c.migrations,
        "resizes": c.resizes,
        "tunes": c.tunes,
        "refused": c.refused,
        "checkpoint_gpu_h": c.checkpoint_gpu_s / 3600,
        "restart_gpu_h": c.restart_gpu_s / 3600,
        "memory_spikes": c.memory_spikes,
        "oom_crashes": c.oom_crashes,
        "oom_lost_gpu_h": c.oom_lost_gpu_s / 3600,
        "oom_migrations": c.oom_actions.get("migrate", 0),
        "oom_actions": dict(c.oom_actions),
        "passes": result.passes,
        "wall_s": result.wall_s,
        "cpu_s": result.cpu_s,
        "rule_ms": {k: round(v, 1) for k, v in sorted(result.rule_ms.items())},
        "counters": asdict(c),
    }
