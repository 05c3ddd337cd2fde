"""The values telemetry answers are made of: a hot GPU's spell with its evidence, a GPU's latest
reading, and the layout of the frozen windows' rows (which GPU of which node each row holds)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

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
    spell_len: int  # how many of the newest values belong to the spell
    traced: tuple[float, str] | None = None  # (ts, traceparent) of the spell's newest sample that carried one

    @property
    def duration_s(self) -> float:
        return self.latest_ts - self.since

    @property
    def satisfied_at(self) -> float:
        """When the window was first satisfied: the spell's start plus the asked duration."""
        return self.since + self.for_s

    def evidence(self) -> dict[str, Any]:
        recent = [v for v in self.values if not np.isnan(v)]
        in_spell = recent[-self.spell_len :]
        return {
            "gpu": f"{self.node}:{self.gpu}",
            "series": self.series,
            "threshold": self.threshold,
            "for_s": self.for_s,
            "above_since": round(self.since, 3),
            "window_satisfied_at": round(self.satisfied_at, 3),
            "duration_s": round(self.duration_s, 3),
            "latest": recent[-1] if recent else None,
            "peak": max(in_spell) if in_spell else None,
            "mean": round(sum(in_spell) / len(in_spell), 4) if in_spell else None,
            "window": recent[-EVIDENCE_POINTS:],
            "latest_ts": round(self.latest_ts, 3),  # the newest sample's time: with `gpu`, the message it came in
        } | ({"traced_sample": sample_reference(self.node, *self.traced)} if self.traced else {})


def sample_reference(node: str, ts: float, traceparent: str) -> dict[str, Any]:
    """A sample named in evidence by its collector's publish span: the decision links that span."""
    return {"node": node, "ts": round(ts, 3), "traceparent": traceparent}


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


@dataclass(frozen=True)
class Layout:
    """Which row holds which GPU, and which index each node has: shared by every view until a node
    or a GPU is added."""

    rows: Mapping[tuple[str, int], int]
    node_index: Mapping[str, int]
    keys: Mapping[int, tuple[str, int]]
    live: np.ndarray  # rows of GPUs that exist now (a node whose inventory changed left its old rows behind)

    @classmethod
    def of(cls, rows: Mapping[tuple[str, int], int], node_index: Mapping[str, int]) -> Layout:
        keys = {row: key for key, row in rows.items()}
        live = np.array(sorted(keys), dtype=np.int64)
        live.flags.writeable = False
        return cls(MappingProxyType(dict(rows)), MappingProxyType(dict(node_index)), MappingProxyType(keys), live)


class TracedSamples(dict[str, tuple[float, str]]):
    """Per node, (ts, traceparent) of its newest sample that named its collector's publish span."""

    def within(self, node: str, since: float, until: float) -> tuple[float, str] | None:
        traced = self.get(node)
        return traced if traced is not None and since <= traced[0] <= until else None
