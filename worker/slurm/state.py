"""What Slurm says of a job and of a node, read from `squeue --json` and `sinfo --json` (Slurm 22.05's
openapi v0.0.38 shapes). Only the fields ADC acts on are kept; anything unexpected reads as unknown."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Job states after which nothing of the job runs any more (squeue's job_state).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# Node states in which Slurm starts nothing new there.
CLOSED_NODE_STATES = frozenset({"down", "drain", "drained", "draining", "fail", "failing", "maint", "future"})
_IDX = re.compile(r"\(IDX:([0-9,\-]+)\)")
ADC_GRES_TYPE = re.compile(r"^i(\d+)$")  # ADC's naming of one GPU a gres type: i0, i1, ... (deploy/slurm/README.md)


def indices(text: str) -> list[int]:
    """`0-2,5` -> [0, 1, 2, 5]."""
    found: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


def gres_indices(entries: list[str] | str) -> list[int]:
    """The GPU indices named in gres details such as `gpu:i1:1(IDX:1),gpu:i3:1(IDX:3)`."""
    text = ",".join(entries) if isinstance(entries, list) else entries
    return sorted({i for m in _IDX.finditer(text) for i in indices(m.group(1))})


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str  # RUNNING, PENDING, COMPLETED, CANCELLED, ...
    nodes: str
    gpus: tuple[int, ...]
    exit_code: int | None  # the batch script's exit code, once it ended (None: killed by a signal)
    reason: str
    restarts: int
    comment: str

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @classmethod
    def of(cls, doc: dict[str, Any]) -> SlurmJob:
        status = int(doc.get("exit_code") or 0)  # a wait status: code << 8 | signal
        return cls(
            job_id=int(doc["job_id"]),
            name=str(doc.get("name") or ""),
            state=str(doc.get("job_state") or "UNKNOWN").upper(),
            nodes=str(doc.get("nodes") or ""),
            gpus=tuple(gres_indices(doc.get("gres_detail") or [])),
            exit_code=None if status & 0x7F else status >> 8,
            reason=str(doc.get("state_reason") or ""),
            restarts=int(doc.get("restart_cnt") or 0),
            comment=str(doc.get("comment") or ""),
        )


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # idle, mixed, allocated, down, drained, ...
    flags: tuple[str, ...]
    gpus: tuple[int, ...]  # the GPUs Slurm knows there, by ADC's index
    gpus_used: tuple[int, ...]  # allocated by Slurm to any job
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def closed(self) -> bool:
        """Drained, draining, down: Slurm starts nothing new there, so ADC places nothing there."""
        words = {self.state.lower(), *(f.lower() for f in self.flags)}
        return bool(words & CLOSED_NODE_STATES)

    @classmethod
    def of(cls, doc: dict[str, Any]) -> SlurmNode:
        return cls(
            name=str(doc["name"]),
            state=str(doc.get("state") or "unknown"),
            flags=tuple(str(f) for f in doc.get("state_flags") or ()),
            gpus=tuple(gpu_indices(str(doc.get("gres") or ""))),
            gpus_used=tuple(gres_indices(str(doc.get("gres_used") or ""))),
            reason=str(doc.get("reason") or ""),
        )


def gpu_indices(gres: str) -> list[int]:
    """The GPUs of a node's `gres` (`gpu:i0:1,gpu:i1:1`): each of ADC's per-GPU types names its index."""
    found = []
    for entry in filter(None, gres.split(",")):
        parts = entry.split("(")[0].split(":")
        if len(parts) >= 2 and parts[0] == "gpu" and (m := ADC_GRES_TYPE.match(parts[1])):
            found.append(int(m.group(1)))
    return sorted(found)
