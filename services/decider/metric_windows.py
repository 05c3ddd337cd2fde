"""Telemetry history in arrays: a log of samples per GPU and per node, and the window
predicates rules ask about ("memory above 0.92 for 30 s"), computed for all GPUs at once.

1,000 nodes x 8 GPUs at 1 Hz is 8,000 values a second: they go into preallocated numpy logs
(rows = GPUs, columns = samples, the last `width` of them the window), never into per-sample
Python objects. The GPUs of one node share the node's sample times, so a node's rows are written
in lockstep. A written column is never written again, so a pass's frozen view shares the logs
instead of copying them (see SampleLog).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

_UNHELD = 3  # references to a spare log held by no frozen view: the spare dict, a local, getrefcount's own


@dataclass(frozen=True)
class Spells:
    """Rows whose Schmitt-trigger state is hot: vectors, one entry per row that qualified."""

    rows: np.ndarray
    since: np.ndarray  # time of the sample that turned each row hot
    latest: np.ndarray  # time of each row's newest sample
    length: np.ndarray  # samples in each spell
    values: np.ndarray  # [rows, width] newest first, NaN where no sample


def hot_spells(
    values: np.ndarray,
    times: np.ndarray,
    counts: np.ndarray,
    now: float,
    *,
    above: float,
    for_s: float,
    clear_below: float | None,
    max_gap_s: float,
    stale_after_s: float,
) -> Spells:
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
    """Per row, the mean of samples taken in the last `span_s` seconds (NaN with none); the first
    `counts` columns of each row hold its samples (e.g. newest first)."""
    width = values.shape[1]
    mask = (np.arange(width)[None, :] < counts[:, None]) & (times >= now - span_s)
    total = np.where(mask, values, 0).sum(axis=1, dtype=np.float64)
    n = mask.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def newest_first_from(
    log: np.ndarray, end: np.ndarray, filled: np.ndarray, width: int, fill: float = 0.0
) -> np.ndarray:
    """Per row of `log`, its last `filled` samples before column `end`, newest first in `width`
    columns; `fill` after them (where the row has no sample)."""
    column = np.arange(width)[None, :]
    index = end[:, None] - 1 - column
    ordered = np.take_along_axis(log, np.maximum(index, 0), axis=1)
    return np.where(column < filled[:, None], ordered, ordered.dtype.type(fill))


class SampleLog:
    """Growable sample logs: `gpu_series` ([gpu rows, columns]) and node-level series ([nodes, columns]).

    Each node owns a contiguous block of GPU rows and appends its samples at its own column
    (`node_end`); of those, the last `width` (`node_filled`) are the window. A column once
    written is never written again: when a node reaches the last column, every log is copied,
    compacted, into new arrays (about once per `width` samples). So a frozen view may keep the
    arrays themselves, with the ends as of its freeze, and stay exact while ingest goes on: it
    copies only the small per-row arrays that change in place. Nothing here allocates per sample.
    """

    def __init__(
        self,
        width: int,
        gpu_series: tuple[str, ...],
        node_series: tuple[str, ...],
        gpu_latest: tuple[str, ...] = (),
        nodes: int = 64,
        gpu_rows: int = 512,
    ) -> None:
        self.width = width
        self.columns = 2 * width
        self.gpu_series = gpu_series
        self.node_series = node_series
        self.node_count = 0
        self.row_count = 0
        self.compactions = 0
        self._spare: dict[str, np.ndarray] = {}  # the logs before the last compaction, to write again once free
        self.node_times = np.zeros((nodes, self.columns))
        self.node_end = np.zeros(nodes, dtype=np.int64)
        self.node_filled = np.zeros(nodes, dtype=np.int64)
        self.node_values = {name: np.zeros((nodes, self.columns), dtype=np.float32) for name in node_series}
        self.gpu_values = {name: np.zeros((gpu_rows, self.columns), dtype=np.float32) for name in gpu_series}
        self.gpu_latest = {name: np.zeros(gpu_rows) for name in gpu_latest}  # newest value only
        self.row_node = np.zeros(gpu_rows, dtype=np.int64)
        self.row_gpu = np.zeros(gpu_rows, dtype=np.int64)
        self.row_since = np.full(gpu_rows, np.inf)  # first sample of each row: older node samples are not its

    def add_node(self) -> int:
        if self.node_count == len(self.node_end):
            grow = len(self.node_end)
            self.node_times = np.concatenate([self.node_times, np.zeros((grow, self.columns))])
            self.node_end = np.concatenate([self.node_end, np.zeros(grow, dtype=np.int64)])
            self.node_filled = np.concatenate([self.node_filled, np.zeros(grow, dtype=np.int64)])
            for name, log in self.node_values.items():
                self.node_values[name] = np.concatenate([log, np.zeros_like(log)])
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
            for name, log in self.gpu_values.items():
                self.gpu_values[name] = np.concatenate([log, np.zeros((pad, self.columns), dtype=np.float32)])
            for name, latest in self.gpu_latest.items():
                self.gpu_latest[name] = np.concatenate([latest, np.zeros(pad)])
        start = self.row_count  # rows past row_count: in no frozen view yet, so written in place
        self.row_node[start:need] = node
        self.row_gpu[start:need] = np.asarray(gpu_indexes)
        for log in self.gpu_values.values():
            log[start:need] = 0.0
        self.row_since[start:need] = np.inf
        self.row_count = need
        return start

    def write(
        self,
        node: int,
        ts: float,
        node_values: dict[str, float],
        rows: np.ndarray | None,
        gpu_values: dict[str, np.ndarray],
        gpu_latest: dict[str, np.ndarray] | None = None,
    ) -> int:
        """One sample of a node: its node-level values and, for `rows`, its GPUs' values. Returns the column."""
        if self.node_end[node] == self.columns:
            self._compact()
        column = int(self.node_end[node])
        self.node_times[node, column] = ts
        for name, value in node_values.items():
            self.node_values[name][node, column] = value
        if rows is not None:
            self.row_since[rows] = np.minimum(self.row_since[rows], ts)
            for name, value in gpu_values.items():
                self.gpu_values[name][rows, column] = value
            for name, value in (gpu_latest or {}).items():
                self.gpu_latest[name][rows] = value
        self.node_end[node] = column + 1
        self.node_filled[node] = min(self.node_filled[node] + 1, self.width)
        return column

    def clear_slot(self, rows: np.ndarray, column: int) -> None:
        """GPUs missing from a node's sample read as 0 there, not as a stale value (the column was
        written by this very sample: no frozen view has it yet)."""
        for log in self.gpu_values.values():
            log[rows, column] = 0.0

    def _compact(self) -> None:
        """Every node's window moved to the first columns of other arrays; the old ones stay, unchanged,
        with whichever frozen views hold them, and are written again only once none does (so memory
        stays flat: two sets of logs, not a new one each time)."""
        self.compactions += 1
        w, nodes, rows = self.width, self.node_end, self.row_node
        spare, self._spare = self._spare, {}

        def moved(key: str, log: np.ndarray, owner: np.ndarray) -> np.ndarray:
            new = spare.get(key)
            # Free when only `spare` and this frame hold it (CPython's count): no frozen view has it.
            if new is None or new.shape != log.shape or sys.getrefcount(new) > _UNHELD:
                new = np.zeros_like(log)
            # Each row's window, columns [start, start + w) (the last column repeated past the end), copied
            # as slices of the rows sharing a start: nodes report in step, so there are a few such groups,
            # and a slice copy of the 8,000 rows costs a few milliseconds where a gather costs a hundred.
            starts = nodes[owner] - self.node_filled[owner]
            groups = np.unique(starts)
            for start in groups.tolist():
                rows_of = slice(None) if len(groups) == 1 else np.nonzero(starts == start)[0]
                n = max(0, min(w, self.columns - start))
                if n:
                    new[rows_of, :n] = log[rows_of, start : start + n]
                if n < w:
                    new[rows_of, n:w] = log[rows_of, self.columns - 1 :]
            self._spare[key] = log
            return new

        every = np.arange(len(nodes))
        self.node_times = moved("times", self.node_times, every)
        self.node_values = {name: moved(f"node:{name}", log, every) for name, log in self.node_values.items()}
        self.gpu_values = {name: moved(f"gpu:{name}", log, rows) for name, log in self.gpu_values.items()}
        self.node_end = self.node_filled.copy()
