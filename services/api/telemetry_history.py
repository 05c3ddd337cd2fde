"""The last hour of every node's and GPU's telemetry, and of the cluster's allocated and busy GPUs,
kept in the api for the dashboard's history charts.

Bounded by construction: each node has one ring of SLOTS buckets of STEP_S seconds (the mean of
the samples that fell in each), so memory is fixed per node (about 35 KB for 8 GPUs) whatever the
sample rate, and a bucket is reused once it is an hour old. The cluster feed writes a node's
samples as they arrive; `cluster_tick` writes one cluster point per bucket. Reading costs a copy
of one node's ring. Nothing is persisted: a restarted api starts with an empty hour (Prometheus
keeps the long history).

Routes are authorized like the cluster view: any signed-in caller sees every node's telemetry,
and these series carry no job ids.
"""

from __future__ import annotations

import math

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Path, Request, status
from pydantic import BaseModel

from services.api.auth import Principal, authenticate
from services.api.errors import AUTHENTICATED, NOT_FOUND
from shared.contracts.messages import NodeMetrics

STEP_S = 10.0
SLOTS = 360  # an hour of STEP_S buckets
BUSY_UTIL_PCT = 5.0  # a GPU at least this utilized counts as busy in the cluster chart
GPU_FIELDS = ("memory_pct", "util_pct", "temperature_c")
NODE_FIELDS = ("cpu_pct", "mem_pct")

router = APIRouter(tags=["cluster"])


def _slot(ts: float) -> int:
    return int(ts // STEP_S)


class Ring:
    """SLOTS buckets of the mean of `width` values; NaN (an absent value) counts in no mean."""

    def __init__(self, width: int) -> None:
        self.slot = np.full(SLOTS, -1, dtype=np.int64)  # which bucket each row holds now
        self.sums = np.zeros((SLOTS, width), dtype=np.float64)
        self.counts = np.zeros((SLOTS, width), dtype=np.int32)

    @property
    def width(self) -> int:
        return self.sums.shape[1]

    def add(self, ts: float, values: np.ndarray) -> None:
        slot = _slot(ts)
        row = slot % SLOTS
        if self.slot[row] != slot:
            if self.slot[row] > slot:  # older than the hour this row holds now
                return
            self.slot[row] = slot
            self.sums[row] = 0.0
            self.counts[row] = 0
        present = values == values  # not NaN; whole-row adds, as 1,000 nodes' samples come each second
        self.sums[row] += np.where(present, values, 0.0)
        self.counts[row] += present

    def read(self, now: float) -> tuple[list[float], np.ndarray]:
        """The buckets of the last hour that hold samples, oldest first: (bucket start times, means)."""
        last = _slot(now)
        wanted = np.arange(last - SLOTS + 1, last + 1)
        rows = wanted % SLOTS
        held = self.slot[rows] == wanted
        rows, wanted = rows[held], wanted[held]
        counts = self.counts[rows]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, self.sums[rows] / np.maximum(counts, 1), np.nan)
        return [float(s * STEP_S) for s in wanted], means


def _series(column: np.ndarray, digits: int = 1) -> list[float | None]:
    return [None if math.isnan(v) else round(float(v), digits) for v in column]


class NodeHistory:
    """One node's ring: host CPU and memory, then each GPU's memory %, utilization and temperature."""

    def __init__(self, gpus: list[int]) -> None:
        self.gpus = gpus
        self.ring = Ring(len(NODE_FIELDS) + len(GPU_FIELDS) * len(gpus))

    def add(self, sample: NodeMetrics, ts: float) -> None:
        values = [
            sample.cpu_pct,
            100.0 * sample.mem_used_bytes / sample.mem_total_bytes if sample.mem_total_bytes else math.nan,
        ]
        by_index = {g.index: g for g in sample.gpus}
        for index in self.gpus:
            g = by_index.get(index)
            if g is None:
                values += [math.nan] * len(GPU_FIELDS)
                continue
            values += [
                100.0 * g.memory_used_bytes / g.memory_total_bytes if g.memory_total_bytes else math.nan,
                g.util_pct if g.util_pct is not None else math.nan,
                g.temperature_c if g.temperature_c is not None else math.nan,
            ]  # None: simulated, no sensor
        self.ring.add(ts, np.asarray(values, dtype=np.float64))

    def view(self, now: float) -> dict:
        ts, means = self.ring.read(now)
        out = {"ts": ts, **{f: _series(means[:, i]) for i, f in enumerate(NODE_FIELDS)}, "gpus": []}
        for k, index in enumerate(self.gpus):
            base = len(NODE_FIELDS) + k * len(GPU_FIELDS)
            out["gpus"].append({"index": index, **{f: _series(means[:, base + i]) for i, f in enumerate(GPU_FIELDS)}})
        return out


class TelemetryHistory:
    """Every node's NodeHistory and the cluster's allocated/busy ring."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeHistory] = {}
        self.cluster = Ring(3)  # GPUs reporting, allocated to jobs, busy

    def add(self, sample: NodeMetrics, ts: float) -> None:
        """`ts`: when the api received it (a collector's clock could place it in a bucket of the future)."""
        gpus = sorted(g.index for g in sample.gpus)
        history = self.nodes.get(sample.node)
        if history is None or history.gpus != gpus:  # new node, or its devices changed: start its hour again
            history = self.nodes[sample.node] = NodeHistory(gpus)
        history.add(sample, ts)

    def cluster_tick(self, ts: float, latest: list[NodeMetrics], allocated: int) -> None:
        gpus = [g for m in latest for g in m.gpus]
        busy = sum(1 for g in gpus if (g.util_pct or 0.0) >= BUSY_UTIL_PCT)
        self.cluster.add(ts, np.asarray([len(gpus), allocated, busy], dtype=np.float64))

    def cluster_view(self, now: float) -> dict:
        ts, means = self.cluster.read(now)
        return {"ts": ts, "gpus": _series(means[:, 0]), "allocated": _series(means[:, 1]), "busy": _series(means[:, 2])}


class GpuSeries(BaseModel):
    index: int
    memory_pct: list[float | None]
    util_pct: list[float | None]
    temperature_c: list[float | None]


class NodeHistoryOut(BaseModel):
    node: str
    step_s: float
    ts: list[float]
    cpu_pct: list[float | None]
    mem_pct: list[float | None]
    gpus: list[GpuSeries]


class ClusterHistoryOut(BaseModel):
    step_s: float
    ts: list[float]
    gpus: list[float | None]
    allocated: list[float | None]
    busy: list[float | None]


@router.get(
    "/v1/nodes/{node}/history",
    response_model=NodeHistoryOut,
    responses=AUTHENTICATED | NOT_FOUND,
    summary=f"A node's last hour: host CPU and memory, each GPU's memory, utilization and temperature "
    f"(means of {STEP_S:g} s buckets; temperature null where the device has no sensor)",
)
async def node_history(
    request: Request, node: str = Path(max_length=128, description="a node id"), who: Principal = Depends(authenticate)
):
    history = request.app.state.cluster_feed.history.nodes.get(node)
    if history is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no telemetry from node {node!r} in the last hour")
    return {"node": node, "step_s": STEP_S, **history.view(request.app.state.clock.now())}


@router.get(
    "/v1/cluster/history",
    response_model=ClusterHistoryOut,
    responses=AUTHENTICATED,
    summary=f"The cluster's last hour: GPUs reporting, allocated to jobs, and busy (at least "
    f"{BUSY_UTIL_PCT:g} % utilized), as means of {STEP_S:g} s buckets",
)
async def cluster_history(request: Request, who: Principal = Depends(authenticate)):
    return {"step_s": STEP_S, **request.app.state.cluster_feed.history.cluster_view(request.app.state.clock.now())}
