"""The decider's live view of the cluster, fed from the bus: nodes and their GPUs with topology
(from heartbeats), telemetry windows (from NodeMetrics), per-job communication latency,
checkpoint times (from job events), and watches that wake the engine the moment a window
predicate is satisfied instead of at the next tick.

It is the only mutable state the rules depend on; `freeze` hands them an immutable copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from services.decider.metric_windows import SampleLog
from services.decider.snapshot import GpuInfo
from services.decider.telemetry import GPU_SERIES, NODE_SERIES, TelemetryView
from services.decider.telemetry_types import Layout, TracedSamples
from shared.contracts.messages import Heartbeat, NodeMetrics

COMM_RING = 256  # latency samples kept per job and node


@dataclass(frozen=True)
class Watch:
    """Wake the engine when `series` on some GPU has been above `above` for `for_s` seconds."""

    series: str
    above: float
    for_s: float
    clear_below: float | None = None
    label: str = ""


@dataclass
class NodeEntry:
    index: int
    first_row: int
    row_of_gpu: np.ndarray  # gpu index -> row: every index below its length has one (rows come in whole blocks)
    beat: Heartbeat | None = None
    beat_at: float = 0.0
    gpus: tuple[GpuInfo, ...] = ()
    last_metrics_ts: float = -math.inf


class _SampleRing:
    """Latency samples of one job on one node: times and values, newest overwriting oldest."""

    def __init__(self) -> None:
        self.times = np.zeros(COMM_RING)
        self.values = np.zeros(COMM_RING)
        self.cursor = 0
        self.filled = 0
        self.updated = 0.0

    def extend(self, ts: float, samples: list[float]) -> None:
        for value in samples[-COMM_RING:]:
            self.times[self.cursor] = ts
            self.values[self.cursor] = value
            self.cursor = (self.cursor + 1) % COMM_RING
        self.filled = min(COMM_RING, self.filled + len(samples))
        self.updated = ts

    def copy(self) -> tuple[np.ndarray, np.ndarray]:
        return self.times[: self.filled].copy(), self.values[: self.filled].copy()


class _WatchState:
    def __init__(self, watch: Watch, rows: int) -> None:
        self.watch = watch
        self.since = np.full(rows, np.nan)
        self.fired = np.zeros(rows, dtype=bool)

    def grow(self, rows: int) -> None:
        if rows > len(self.since):
            pad = rows - len(self.since)
            self.since = np.concatenate([self.since, np.full(pad, np.nan)])
            self.fired = np.concatenate([self.fired, np.zeros(pad, dtype=bool)])


class ClusterView:
    def __init__(
        self,
        window_s: float = 120.0,
        sample_interval_s: float = 1.0,
        max_gap_s: float = 3.5,
        stale_after_s: float = 5.0,
        on_wake: Callable[[str], None] | None = None,
    ) -> None:
        self.width = int(math.ceil(window_s / sample_interval_s)) + 2
        self.max_gap_s = max_gap_s
        self.stale_after_s = stale_after_s
        self.on_wake = on_wake or (lambda reason: None)
        self.store = SampleLog(self.width, GPU_SERIES, NODE_SERIES, gpu_latest=("used", "total"))
        self.nodes: dict[str, NodeEntry] = {}
        self.rows: dict[tuple[str, int], int] = {}
        self.comm: dict[str, dict[str, _SampleRing]] = {}
        self.checkpoints: dict[str, float] = {}
        self.traced = TracedSamples()
        self._watches: list[_WatchState] = []
        self._fired: set[Watch] = set()  # watches satisfied since the engine last asked (take_fired)
        self.samples_ingested = 0
        self._layout: Layout | None = None  # which row is which GPU: rebuilt only when nodes or GPUs are added

    # --- nodes -----------------------------------------------------------------------

    def _entry(self, node: str, gpu_indexes: list[int]) -> NodeEntry:
        entry = self.nodes.get(node)
        if entry is None:
            entry = NodeEntry(index=self.store.add_node(), first_row=0, row_of_gpu=np.full(0, -1, dtype=np.int64))
            self.nodes[node] = entry
            self._layout = None
        if gpu_indexes and max(gpu_indexes) >= len(entry.row_of_gpu):
            self._allocate_rows(node, entry, max(max(gpu_indexes) + 1, len(entry.row_of_gpu)))
        return entry

    def _allocate_rows(self, node: str, entry: NodeEntry, count: int) -> None:
        # A node whose GPU set grew gets a fresh block; its GPU history starts over (rare: a new inventory).
        entry.first_row = self.store.add_rows(entry.index, range(count))
        entry.row_of_gpu = np.arange(entry.first_row, entry.first_row + count, dtype=np.int64)
        for gpu in range(count):
            self.rows[(node, gpu)] = entry.first_row + gpu
        self._layout = None
        for state in self._watches:
            state.grow(self.store.row_count)

    def heartbeat(self, beat: Heartbeat, received_at: float) -> bool:
        """Record a heartbeat; True when the node is new or its devices changed."""
        entry = self._entry(beat.node, [d.index for d in beat.devices if d.kind == "gpu"])
        changed = entry.beat is None or entry.beat.devices != beat.devices or entry.beat.rack != beat.rack
        entry.beat_at = received_at
        if changed:  # else the beat it has says the same: this one dies young (no garbage for full collections)
            entry.beat = beat
            entry.gpus = tuple(
                GpuInfo(
                    index=d.index,
                    model=d.name,
                    memory_total_bytes=d.memory_total_bytes,
                    nvlink_domain=d.nvlink_domain,
                    numa_node=d.numa_node,
                )
                for d in beat.devices
            )
        return changed

    # --- metrics ---------------------------------------------------------------------

    def ingest(self, m: NodeMetrics) -> None:
        indexes = [g.index for g in m.gpus]
        entry = self._entry(m.node, indexes)
        rows = None
        memory = util = used = total = None
        if indexes:
            rows = entry.row_of_gpu[indexes]
            # One array of the three readings per GPU, then its columns: one conversion, not three.
            readings = np.array(
                [(g.memory_used_bytes, g.memory_total_bytes, g.util_pct) for g in m.gpus], dtype=np.float64
            )
            used, total = readings[:, 0], readings[:, 1]
            memory = np.divide(used, total, out=np.zeros_like(used), where=total > 0)
            util = readings[:, 2] / 100.0
        gap = m.ts - entry.last_metrics_ts > self.max_gap_s
        entry.last_metrics_ts = m.ts
        slot = self.store.write(
            entry.index,
            m.ts,
            {"cpu": m.cpu_pct / 100.0},
            rows,
            {"gpu_memory": memory, "gpu_util": util} if rows is not None else {},
            {"used": used, "total": total} if rows is not None else None,
        )
        if len(indexes) < len(entry.row_of_gpu):
            missing = np.setdiff1d(entry.row_of_gpu, rows if rows is not None else [])
            self.store.clear_slot(missing, slot)
        if m.trace_parent is not None:  # checked by the message model
            self.traced[m.node] = (m.ts, m.trace_parent)
        for job_id, samples in m.comm_latency_us.items():
            if samples:
                self.comm.setdefault(job_id, {}).setdefault(m.node, _SampleRing()).extend(m.ts, samples)
        if rows is not None and self._watches:
            self._check_watches(m.node, m.ts, rows, {"gpu_memory": memory, "gpu_util": util}, gap)
        self.samples_ingested += 1

    def job_comm_latency(self, job_id: str, ts: float, by_node: dict[str, list[float]]) -> None:
        """Latency samples a trainer measured itself (its per-step all-reduce), per node."""
        for node, samples in by_node.items():
            if samples:
                self.comm.setdefault(job_id, {}).setdefault(node, _SampleRing()).extend(ts, samples)

    def job_checkpointed(self, job_id: str, ts: float) -> None:
        self.checkpoints[job_id] = max(ts, self.checkpoints.get(job_id, 0.0))

    # --- watches ---------------------------------------------------------------------

    def set_watches(self, watches: list[Watch]) -> None:
        """Replace the watched predicates; an unchanged one keeps its state."""
        kept = {state.watch: state for state in self._watches}
        self._watches = [kept.get(w) or _WatchState(w, self.store.row_count) for w in dict.fromkeys(watches)]

    def _check_watches(self, node: str, ts: float, rows: np.ndarray, values: dict[str, np.ndarray], gap: bool) -> None:
        for state in self._watches:
            w = state.watch
            vals = values[w.series].astype(np.float32)
            clear = np.float32(w.above if w.clear_below is None else min(w.clear_below, w.above))
            if (vals <= clear).all():  # the usual sample: every GPU of the node is cool, no spell goes on
                state.since[rows] = np.nan
                state.fired[rows] = False
                continue
            since = state.since[rows]
            if gap:
                since[:] = np.nan
            since = np.where(vals <= clear, np.nan, since)
            since = np.where(np.isnan(since) & (vals > np.float32(w.above)), ts, since)
            state.since[rows] = since
            satisfied = (ts - since) >= w.for_s  # False where no spell (NaN)
            newly = satisfied & ~state.fired[rows]
            state.fired[rows] = satisfied
            if newly.any():
                self._fired.add(w)
                gpu = int(np.argmax(newly))
                self.on_wake(f"{w.label or w.series} window satisfied on {node}:{int(self.store.row_gpu[rows[gpu]])}")

    def take_fired(self) -> set[Watch]:
        """The watches satisfied on some GPU since the last call."""
        fired, self._fired = self._fired, set()
        return fired

    def fire_again(self, watches: set[Watch]) -> None:
        """Hand these back to the next `take_fired` (their rules could not run just now)."""
        self._fired |= watches & {state.watch for state in self._watches}

    # --- snapshot --------------------------------------------------------------------

    def prune(self, now: float, keep_s: float) -> None:
        """Forget latency samples of jobs not reported for `keep_s` (they ended or moved)."""
        for job_id in list(self.comm):
            nodes = self.comm[job_id]
            for node in [n for n, ring in nodes.items() if now - ring.updated > keep_s]:
                del nodes[node]
            if not nodes:
                del self.comm[job_id]

    def freeze(self, now: float) -> TelemetryView:
        """The telemetry as of now, for one pass. The sample logs are shared, not copied: the view reads
        only columns before each node's end as of now, which ingest never writes again (SampleLog).
        What changes in place (ends, counts, first samples, newest values) is copied: a few small arrays."""
        s = self.store
        n, r = s.node_count, s.row_count
        if self._layout is None:
            self._layout = Layout.of(self.rows, {name: e.index for name, e in self.nodes.items()})
        return TelemetryView(
            now,
            layout=self._layout,
            width=s.width,
            row_node=s.row_node[:r].copy(),
            row_since=s.row_since[:r].copy(),
            node_times=s.node_times,
            node_end=s.node_end[:n].copy(),
            node_filled=s.node_filled[:n].copy(),
            gpu_logs=dict(s.gpu_values),
            node_logs=dict(s.node_values),
            gpu_latest={name: latest[:r].copy() for name, latest in s.gpu_latest.items()},
            comm={job: {node: ring.copy() for node, ring in nodes.items()} for job, nodes in self.comm.items()},
            max_gap_s=self.max_gap_s,
            stale_after_s=self.stale_after_s,
            traced=TracedSamples(self.traced),
        )
