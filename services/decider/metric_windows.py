"""Telemetry history in arrays: one ring of samples per GPU and per node, and the window
predicates rules ask about ("memory above 0.92 for 30 s"), computed for all GPUs at once.

1,000 nodes x 8 GPUs at 1 Hz is 8,000 values a second: they go into preallocated numpy rings
(rows = GPUs, columns = the last `width` samples), never into per-sample Python objects. The
GPUs of one node share the node's sample times, so a node's rows are written in lockstep.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def newest_first(ring: np.ndarray, cursor: np.ndarray) -> np.ndarray:
    """Rows of `ring` reordered so column 0 is the newest sample; `cursor` is each row's next slot."""
    width = ring.shape[1]
    order = (cursor[:, None] - 1 - np.arange(width)[None, :]) % width
    return np.take_along_axis(ring, order, axis=1)


@dataclass(frozen=True)
class Spells:
    """Rows whose Schmitt-trigger state is hot: vectors, one entry per row that qualified."""

    rows: np.ndarray
    since: np.ndarray        # time of the sample that turned each row hot
    latest: np.ndarray       # time of each row's newest sample
    length: np.ndarray       # samples in each spell
    values: np.ndarray       # [rows, width] newest first, NaN where no sample


def hot_spells(values: np.ndarray, times: np.ndarray, counts: np.ndarray, now: float, *, above: float,
               for_s: float, clear_below: float | None, max_gap_s: float, stale_after_s: float) -> Spells:
    """Rows that have been above `above` for at least `for_s` seconds, with hysteresis.

    `values`/`times` are newest first ([rows, width]); `counts` says how many columns hold samples.
    A row turns hot on a sample above `above` and cools only on one at or below `clear_below`
    (default: `above`), so noise around the threshold neither starts nor resets a spell. A gap in
    the samples longer than `max_gap_s`, or no sample for `stale_after_s`, ends a spell: a window
    says what was measured, not what was guessed.
    """
    rows, width = values.shape
    if rows == 0:
        empty = np.empty(0)
        return Spells(np.empty(0, dtype=np.int64), empty, empty, np.empty(0, dtype=np.int64), np.empty((0, width)))
    thr = values.dtype.type(above)  # compare in the stored precision: 0.92 is not "above" 0.92
    clear = values.dtype.type(above if clear_below is None else min(clear_below, above))
    column = np.arange(width)[None, :]
    valid = column < counts[:, None]
    hot = (values > thr) & valid
    breaker = (values <= clear) | ~valid
    breaker[:, 1:] |= (times[:, :-1] - times[:, 1:]) > max_gap_s
    first_break = np.where(breaker.any(axis=1), breaker.argmax(axis=1), width)
    hot_in_run = hot & (column < first_break[:, None])
    any_hot = hot_in_run.any(axis=1)
    oldest_hot = width - 1 - hot_in_run[:, ::-1].argmax(axis=1)
    index = np.arange(rows)
    since = times[index, oldest_hot]
    latest = times[:, 0]
    ok = any_hot & valid[:, 0] & (now - latest <= stale_after_s) & (latest - since >= for_s)
    picked = np.nonzero(ok)[0]
    shown = np.where(valid[picked], values[picked].astype(np.float64), np.nan)
    return Spells(picked, since[picked], latest[picked], oldest_hot[picked] + 1, shown)


def window_mean(values: np.ndarray, times: np.ndarray, counts: np.ndarray, now: float, span_s: float) -> np.ndarray:
    """Per row, the mean of samples taken in the last `span_s` seconds (NaN with none).

    Order does not matter, so raw rings work too: a ring is written from column 0, so its first
    `counts` columns hold samples whether or not it has wrapped."""
    width = values.shape[1]
    mask = (np.arange(width)[None, :] < counts[:, None]) & (times >= now - span_s)
    total = np.where(mask, values, 0).sum(axis=1, dtype=np.float64)
    n = mask.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


class RingStore:
    """Growable rings: `series` GPU-level series ([gpu rows, width]) and node-level ones ([nodes, width]).

    Each node owns a contiguous block of GPU rows. Writing a node's sample is a handful of
    vectorized assignments; nothing here allocates per sample.
    """

    def __init__(self, width: int, gpu_series: tuple[str, ...], node_series: tuple[str, ...],
                 gpu_latest: tuple[str, ...] = (), nodes: int = 64, gpu_rows: int = 512) -> None:
        self.width = width
        self.gpu_series = gpu_series
        self.node_series = node_series
        self.node_count = 0
        self.row_count = 0
        self.node_times = np.zeros((nodes, width))
        self.node_cursor = np.zeros(nodes, dtype=np.int64)
        self.node_filled = np.zeros(nodes, dtype=np.int64)
        self.node_values = {name: np.zeros((nodes, width), dtype=np.float32) for name in node_series}
        self.gpu_values = {name: np.zeros((gpu_rows, width), dtype=np.float32) for name in gpu_series}
        self.gpu_latest = {name: np.zeros(gpu_rows) for name in gpu_latest}  # newest value only
        self.row_node = np.zeros(gpu_rows, dtype=np.int64)
        self.row_gpu = np.zeros(gpu_rows, dtype=np.int64)
        self.row_since = np.full(gpu_rows, np.inf)  # first sample of each row: older node samples are not its

    def add_node(self) -> int:
        if self.node_count == len(self.node_cursor):
            grow = len(self.node_cursor)
            self.node_times = np.concatenate([self.node_times, np.zeros((grow, self.width))])
            self.node_cursor = np.concatenate([self.node_cursor, np.zeros(grow, dtype=np.int64)])
            self.node_filled = np.concatenate([self.node_filled, np.zeros(grow, dtype=np.int64)])
            for name, ring in self.node_values.items():
                self.node_values[name] = np.concatenate([ring, np.zeros_like(ring)])
        self.node_count += 1
        return self.node_count - 1

    def add_rows(self, node: int, gpu_indexes: range) -> int:
        """A block of rows for a node's GPUs; returns the first row. History starts empty."""
        need = self.row_count + len(gpu_indexes)
        if need > len(self.row_node):
            size = max(need, 2 * len(self.row_node))
            pad = size - len(self.row_node)
            self.row_node = np.concatenate([self.row_node, np.zeros(pad, dtype=np.int64)])
            self.row_gpu = np.concatenate([self.row_gpu, np.zeros(pad, dtype=np.int64)])
            self.row_since = np.concatenate([self.row_since, np.full(pad, np.inf)])
            for name, ring in self.gpu_values.items():
                self.gpu_values[name] = np.concatenate([ring, np.zeros((pad, self.width), dtype=np.float32)])
            for name, latest in self.gpu_latest.items():
                self.gpu_latest[name] = np.concatenate([latest, np.zeros(pad)])
        start = self.row_count
        self.row_node[start:need] = node
        self.row_gpu[start:need] = np.asarray(gpu_indexes)
        for ring in self.gpu_values.values():
            ring[start:need] = 0.0
        self.row_since[start:need] = np.inf
        self.row_count = need
        return start

    def write(self, node: int, ts: float, node_values: dict[str, float], rows: np.ndarray | None,
              gpu_values: dict[str, np.ndarray], gpu_latest: dict[str, np.ndarray] | None = None) -> int:
        """One sample of a node: its node-level values and, for `rows`, its GPUs' values. Returns the slot."""
        slot = int(self.node_cursor[node])
        self.node_times[node, slot] = ts
        for name, value in node_values.items():
            self.node_values[name][node, slot] = value
        if rows is not None:
            self.row_since[rows] = np.minimum(self.row_since[rows], ts)
            for name, value in gpu_values.items():
                self.gpu_values[name][rows, slot] = value
            for name, value in (gpu_latest or {}).items():
                self.gpu_latest[name][rows] = value
        self.node_cursor[node] = (slot + 1) % self.width
        self.node_filled[node] = min(self.node_filled[node] + 1, self.width)
        return slot

    def clear_slot(self, rows: np.ndarray, slot: int) -> None:
        """GPUs missing from a node's sample read as 0 there, not as a stale value."""
        for ring in self.gpu_values.values():
            ring[rows, slot] = 0.0
