"""What rules may ask about telemetry: a frozen copy of the metric windows at snapshot time.

Series: per GPU `gpu_memory` (used / total) and `gpu_util` (0..1); per node `cpu` (0..1); per
job, communication latency samples (microseconds) from each of its nodes. Answers carry
their evidence (the window values), so a rule can put it straight into its action.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from services.decider.metric_windows import hot_spells, newest_first, window_mean

GPU_SERIES = ("gpu_memory", "gpu_util")
NODE_SERIES = ("cpu",)
EVIDENCE_POINTS = 30  # window values quoted in an action's evidence, newest last


@dataclass(frozen=True)
class HotGpu:
    """A GPU whose series has been above a threshold for at least the asked duration."""

    node: str
    gpu: int
    series: str
    threshold: float
    for_s: float
    since: float
    latest_ts: float
    values: tuple[float, ...]  # the window, oldest first, rounded
    spell_len: int             # how many of the newest values belong to the spell

    @property
    def duration_s(self) -> float:
        return self.latest_ts - self.since

    @property
    def satisfied_at(self) -> float:
        """When the window was first satisfied: the spell's start plus the asked duration."""
        return self.since + self.for_s

    def evidence(self) -> dict[str, Any]:
        recent = [v for v in self.values if not np.isnan(v)]
        in_spell = recent[-self.spell_len:]
        return {
            "gpu": f"{self.node}:{self.gpu}", "series": self.series, "threshold": self.threshold, "for_s": self.for_s,
            "above_since": round(self.since, 3), "window_satisfied_at": round(self.satisfied_at, 3),
            "duration_s": round(self.duration_s, 3), "latest": recent[-1] if recent else None,
            "peak": max(in_spell) if in_spell else None,
            "mean": round(sum(in_spell) / len(in_spell), 4) if in_spell else None,
            "window": recent[-EVIDENCE_POINTS:],
        }


@dataclass(frozen=True)
class GpuReading:
    used_bytes: int
    total_bytes: int
    age_s: float

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)


class TelemetryView:
    """Read-only telemetry as of `ts`. Built by the cluster view; every array is a private copy."""

    def __init__(self, ts: float, *, rows: Mapping[tuple[str, int], int], node_index: Mapping[str, int],
                 row_node: np.ndarray, row_since: np.ndarray, node_times: np.ndarray, node_cursor: np.ndarray, node_filled: np.ndarray,
                 gpu_rings: dict[str, np.ndarray], node_rings: dict[str, np.ndarray], gpu_latest: dict[str, np.ndarray],
                 comm: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], max_gap_s: float, stale_after_s: float):
        self.ts = ts
        self.max_gap_s = max_gap_s
        self.stale_after_s = stale_after_s
        self._rows = MappingProxyType(dict(rows))
        self._node_index = MappingProxyType(dict(node_index))
        self._row_node = row_node
        self._row_since = row_since
        self._node_times = node_times
        self._node_cursor = node_cursor
        self._node_filled = node_filled
        self._gpu_rings = gpu_rings
        self._node_rings = node_rings
        self._latest = gpu_latest
        self._comm = comm
        self._keys = {row: key for key, row in self._rows.items()}
        # Rows of GPUs that exist now (a node whose inventory changed left its old rows behind).
        self._live = np.array(sorted(self._keys), dtype=np.int64)
        for array in (row_node, row_since, node_times, node_cursor, node_filled, *gpu_rings.values(), *node_rings.values(),
                      *gpu_latest.values()):
            array.flags.writeable = False

    @classmethod
    def empty(cls, ts: float = 0.0) -> "TelemetryView":
        z = np.zeros((0, 1))
        return cls(ts, rows={}, node_index={}, row_node=np.zeros(0, dtype=np.int64), row_since=np.zeros(0), node_times=z,
                   node_cursor=np.zeros(0, dtype=np.int64), node_filled=np.zeros(0, dtype=np.int64),
                   gpu_rings={s: np.zeros((0, 1), dtype=np.float32) for s in GPU_SERIES},
                   node_rings={s: np.zeros((0, 1), dtype=np.float32) for s in NODE_SERIES},
                   gpu_latest={"used": np.zeros(0), "total": np.zeros(0)}, comm={}, max_gap_s=3.5, stale_after_s=5.0)

    # --- lookups ---------------------------------------------------------------------

    def row(self, node: str, gpu: int) -> int | None:
        return self._rows.get((node, gpu))

    def gpus(self) -> list[tuple[str, int]]:
        return list(self._rows)

    def node_age_s(self, node: str) -> float | None:
        """Seconds since the node's newest sample, or None if it never reported."""
        n = self._node_index.get(node)
        if n is None or self._node_filled[n] == 0:
            return None
        return self.ts - float(self._node_times[n, (self._node_cursor[n] - 1) % self._node_times.shape[1]])

    def gpu_latest(self, node: str, gpu: int) -> GpuReading | None:
        row = self.row(node, gpu)
        if row is None:
            return None
        age = self.node_age_s(node)
        return GpuReading(int(self._latest["used"][row]), int(self._latest["total"][row]),
                          age if age is not None else float("inf"))

    # --- windows ---------------------------------------------------------------------

    def _latest_values(self, series: str, rows: np.ndarray) -> np.ndarray:
        ring = self._gpu_rings[series]
        slots = (self._node_cursor[self._row_node[rows]] - 1) % ring.shape[1]
        return ring[rows, slots]

    def _ordered(self, series: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if series not in self._gpu_rings:
            raise KeyError(f"unknown GPU series {series!r}; known: {list(self._gpu_rings)}")
        nodes = self._row_node[rows]
        cursor = self._node_cursor[nodes]
        values = newest_first(self._gpu_rings[series][rows], cursor)
        times = newest_first(self._node_times[nodes], cursor)
        # Newest first, so a row's own samples are a prefix: those not older than its first sample.
        own = (times >= self._row_since[rows][:, None]).sum(axis=1)
        return values, times, np.minimum(self._node_filled[nodes], own)

    def hot_gpus(self, series: str, above: float, for_s: float, *, clear_below: float | None = None,
                 only: list[tuple[str, int]] | None = None) -> list[HotGpu]:
        """GPUs whose `series` has been above `above` for at least `for_s` seconds (hysteresis: stays
        hot until at or below `clear_below`). `only` limits the question to some GPUs."""
        if series not in self._gpu_rings:
            raise KeyError(f"unknown GPU series {series!r}; known: {list(self._gpu_rings)}")
        # Only a GPU whose newest value is above the clearing level can be in a hot spell: the full
        # window is examined for those few, not for every GPU of the cluster.
        rows = self._live
        floor = np.float32(above if clear_below is None else min(clear_below, above))
        rows = rows[self._latest_values(series, rows) > floor]
        if not len(rows):
            return []
        if only is not None:
            wanted = set(only)
            rows = np.array([r for r in rows if self._keys[int(r)] in wanted], dtype=np.int64)
        values, times, counts = self._ordered(series, rows)
        spells = hot_spells(values, times, counts, self.ts, above=above, for_s=for_s, clear_below=clear_below,
                            max_gap_s=self.max_gap_s, stale_after_s=self.stale_after_s)
        found = []
        for i, picked in enumerate(spells.rows):
            node, gpu = self._keys[int(rows[picked])]
            window = tuple(round(float(v), 4) for v in spells.values[i][::-1])
            found.append(HotGpu(node=node, gpu=gpu, series=series, threshold=above, for_s=for_s,
                                since=float(spells.since[i]), latest_ts=float(spells.latest[i]), values=window,
                                spell_len=int(spells.length[i])))
        return found

    def gpu_mean(self, series: str, node: str, gpu: int, span_s: float) -> float | None:
        row = self.row(node, gpu)
        if row is None:
            return None
        values, times, counts = self._ordered(series, np.array([row]))
        mean = float(window_mean(values, times, counts, self.ts, span_s)[0])
        return None if np.isnan(mean) else mean

    def node_means(self, series: str, span_s: float) -> dict[str, float]:
        """Per node, the mean over the last `span_s` seconds of a node series (`cpu`), or of a GPU
        series averaged over the node's GPUs. Nodes without samples in the span are left out."""
        nodes = len(self._node_cursor)
        if series in self._node_rings:
            means = window_mean(self._node_rings[series], self._node_times, self._node_filled, self.ts, span_s)
        elif series in self._gpu_rings:
            owner = self._row_node[self._live]
            times = self._node_times[owner]
            times = np.where(times >= self._row_since[self._live][:, None], times, -np.inf)  # not this row's
            per_gpu = window_mean(self._gpu_rings[series][self._live], times, self._node_filled[owner], self.ts, span_s)
            ok = ~np.isnan(per_gpu)
            total = np.bincount(owner[ok], weights=per_gpu[ok], minlength=nodes)
            count = np.bincount(owner[ok], minlength=nodes)
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        else:
            raise KeyError(f"unknown series {series!r}")
        return {name: float(means[n]) for name, n in self._node_index.items() if n < nodes and not np.isnan(means[n])}

    def node_mean(self, series: str, node: str, span_s: float) -> float | None:
        return self.node_means(series, span_s).get(node)

    def comm_latency(self, job_id: str, span_s: float) -> dict[str, np.ndarray]:
        """The job's communication latency samples (us) of the last `span_s` seconds, per node."""
        out = {}
        for node, (times, values) in self._comm.get(job_id, {}).items():
            recent = values[times >= self.ts - span_s]
            if len(recent):
                out[node] = recent
        return out
