"""What rules may ask about telemetry: the metric windows frozen at snapshot time.

Series: per GPU `gpu_memory` (used / total) and `gpu_util` (0..1); per node `cpu` (0..1); per
job, communication latency samples (microseconds) from each of its nodes. Answers carry
their evidence (the window values, the newest sample's time, and the newest sample in the window
that named its collector's publish span), so a rule can put it straight into its action.
"""

from __future__ import annotations

import numpy as np

from services.decider.metric_windows import hot_spells, newest_first_from, window_mean
from services.decider.telemetry_types import GpuReading, HotGpu, Layout, TracedSamples

GPU_SERIES = ("gpu_memory", "gpu_util")
NODE_SERIES = ("cpu",)
NO_SAMPLE = -1e300  # the time of a column without a sample: before any span (and no NaN in differences)


_EMPTY: dict[type, TelemetryView] = {}  # the empty view of each class, built once


class TelemetryView:
    """Read-only telemetry as of `ts`. Built by the cluster view: the sample logs are shared with it,
    and only the columns before each node's end (`node_end`, a private copy) are read, which the
    cluster view never writes again; every array that changes in place is a private copy."""

    def __init__(
        self,
        ts: float,
        *,
        layout: Layout,
        width: int,
        row_node: np.ndarray,
        row_since: np.ndarray,
        node_times: np.ndarray,
        node_end: np.ndarray,
        node_filled: np.ndarray,
        gpu_logs: dict[str, np.ndarray],
        node_logs: dict[str, np.ndarray],
        gpu_latest: dict[str, np.ndarray],
        comm: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
        max_gap_s: float,
        stale_after_s: float,
        traced: TracedSamples | None = None,
    ):
        self.ts = ts
        self.max_gap_s = max_gap_s
        self.stale_after_s = stale_after_s
        self.width = width
        self._rows = layout.rows
        self._node_index = layout.node_index
        self._keys = layout.keys
        self._live = layout.live
        self._row_node = row_node
        self._row_since = row_since
        self._node_times = node_times
        self._node_end = node_end
        self._node_filled = node_filled
        self._gpu_logs = gpu_logs
        self._node_logs = node_logs
        self._latest = gpu_latest
        self._comm, self.traced = comm, traced or TracedSamples()
        for array in (row_node, row_since, node_end, node_filled, *gpu_latest.values()):
            array.flags.writeable = False

    @classmethod
    def empty(cls, ts: float = 0.0) -> TelemetryView:
        """A view without any GPU. Its arrays are empty and read-only, so one is built once and each
        later call is a copy with its own `ts` (the simulator asks for one on most passes)."""
        template = _EMPTY.get(cls)
        if template is None:
            template = _EMPTY[cls] = _build_empty(cls)
        view = object.__new__(cls)
        view.__dict__.update(template.__dict__, ts=ts)
        return view

    def row(self, node: str, gpu: int) -> int | None:
        return self._rows.get((node, gpu))

    def gpus(self) -> list[tuple[str, int]]:
        return list(self._rows)

    def node_age_s(self, node: str) -> float | None:
        """Seconds since the node's newest sample, or None if it never reported."""
        n = self._node_index.get(node)
        if n is None or self._node_filled[n] == 0:
            return None
        return self.ts - float(self._node_times[n, self._node_end[n] - 1])

    def gpu_latest(self, node: str, gpu: int) -> GpuReading | None:
        row = self.row(node, gpu)
        if row is None:
            return None
        age = self.node_age_s(node)
        return GpuReading(
            int(self._latest["used"][row]), int(self._latest["total"][row]), age if age is not None else float("inf")
        )

    def _latest_values(self, series: str, rows: np.ndarray) -> np.ndarray:
        return self._gpu_logs[series][rows, self._node_end[self._row_node[rows]] - 1]

    def _ordered(self, series: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Values, times (newest first, `width` columns) and sample counts of these GPU rows."""
        if series not in self._gpu_logs:
            raise KeyError(f"unknown GPU series {series!r}; known: {list(self._gpu_logs)}")
        nodes = self._row_node[rows]
        end, filled = self._node_end[nodes], self._node_filled[nodes]
        values = newest_first_from(self._gpu_logs[series][rows], end, filled, self.width)
        times = newest_first_from(self._node_times[nodes], end, filled, self.width, fill=NO_SAMPLE)
        # Newest first, so a row's own samples are a prefix: those not older than its first sample.
        own = (times >= self._row_since[rows][:, None]).sum(axis=1)
        return values, times, np.minimum(filled, own)

    def hot_gpus(
        self,
        series: str,
        above: float,
        for_s: float,
        *,
        clear_below: float | None = None,
        only: list[tuple[str, int]] | None = None,
    ) -> list[HotGpu]:
        """GPUs whose `series` has been above `above` for at least `for_s` seconds (hysteresis: stays
        hot until at or below `clear_below`). `only` limits the question to some GPUs."""
        if series not in self._gpu_logs:
            raise KeyError(f"unknown GPU series {series!r}; known: {list(self._gpu_logs)}")
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
        spells = hot_spells(
            values,
            times,
            counts,
            self.ts,
            above=above,
            for_s=for_s,
            clear_below=clear_below,
            max_gap_s=self.max_gap_s,
            stale_after_s=self.stale_after_s,
        )
        found = []
        for i, picked in enumerate(spells.rows):
            node, gpu = self._keys[int(rows[picked])]
            window = tuple(round(float(v), 4) for v in spells.values[i][::-1])
            found.append(
                HotGpu(
                    node=node,
                    gpu=gpu,
                    series=series,
                    threshold=above,
                    for_s=for_s,
                    since=float(spells.since[i]),
                    latest_ts=float(spells.latest[i]),
                    values=window,
                    spell_len=int(spells.length[i]),
                    traced=self.traced.within(node, float(spells.since[i]), float(spells.latest[i])),
                )
            )
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
        nodes = len(self._node_end)
        if series not in self._node_logs and series not in self._gpu_logs:
            raise KeyError(f"unknown series {series!r}")
        if nodes == 0:
            return {}  # no node has reported (the simulator's view on most passes): nothing to average
        if series in self._node_logs:
            times = newest_first_from(
                self._node_times[:nodes], self._node_end, self._node_filled, self.width, fill=NO_SAMPLE
            )
            values = newest_first_from(self._node_logs[series][:nodes], self._node_end, self._node_filled, self.width)
            means = window_mean(values, times, self._node_filled, self.ts, span_s)
        else:
            live = self._live
            owner = self._row_node[live]
            values, times, counts = self._ordered(series, live)
            per_gpu = window_mean(values, times, counts, self.ts, span_s)
            ok = ~np.isnan(per_gpu)
            total = np.bincount(owner[ok], weights=per_gpu[ok], minlength=nodes)
            count = np.bincount(owner[ok], minlength=nodes)
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        return {name: float(means[n]) for name, n in self._node_index.items() if n < nodes and not np.isnan(means[n])}

    def node_mean(self, series: str, node: str, span_s: float) -> float | None:
        return self.node_means(series, span_s).get(node)

    def comm_latency_jobs(self) -> frozenset[str]:
        """The jobs with any communication latency samples (of any age): the only ones
        `comm_latency` can answer for."""
        return frozenset(job for job, by_node in self._comm.items() if by_node)

    def comm_latency(self, job_id: str, span_s: float) -> dict[str, np.ndarray]:
        """The job's communication latency samples (us) of the last `span_s` seconds, per node."""
        by_node = self._comm.get(job_id)
        if not by_node:
            return {}
        out = {}
        for node, (times, values) in by_node.items():
            recent = values[times >= self.ts - span_s]
            if len(recent):
                out[node] = recent
        return out


def _build_empty(cls: type[TelemetryView]) -> TelemetryView:
    ts = 0.0
    z = np.zeros((0, 1))
    return cls(
        ts,
        layout=Layout.of({}, {}),
        width=1,
        row_node=np.zeros(0, dtype=np.int64),
        row_since=np.zeros(0),
        node_times=z,
        node_end=np.zeros(0, dtype=np.int64),
        node_filled=np.zeros(0, dtype=np.int64),
        gpu_logs={s: np.zeros((0, 1), dtype=np.float32) for s in GPU_SERIES},
        node_logs={s: np.zeros((0, 1), dtype=np.float32) for s in NODE_SERIES},
        gpu_latest={"used": np.zeros(0), "total": np.zeros(0)},
        comm={},
        max_gap_s=3.5,
        stale_after_s=5.0,
    )
