"""The trainer's event stream: JSON lines appended to the file the worker opened for it.

Under a worker the file is a descriptor the trainer inherits (ADC_EVENTS_FD, opened by the worker in
its own attempt folder, which the trainer cannot write: it has no path to swap for a symlink); run by
hand, the file named by ADC_EVENTS_FILE.

Rank 0 writes the lifecycle and progress events. Any rank may write a terminal failure
(`failed`, `oom`) so that a crash on rank 3 is not lost while rank 0 waits in a collective;
those lines carry "rank". Each line is written with a single `write` on an O_APPEND file
descriptor and flushed at once, so a reader tailing the file sees whole lines only.

Importable without torch.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from worker.trainer.peak_rss import peak_rss_bytes

EVENTS_FILE_ENV = "ADC_EVENTS_FILE"
EVENTS_FD_ENV = "ADC_EVENTS_FD"


def _json_safe(value: Any) -> Any:
    # NaN/inf are not JSON; a diverged loss must still produce a readable line.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


TERMINAL_EVENTS = frozenset({"succeeded", "stopped", "failed", "oom"})


class EventWriter:
    """Appends one JSON object per event. With no path (ADC_EVENTS_FILE unset) events go to
    stderr, so a trainer run by hand still shows what happened."""

    def __init__(self, path: str | os.PathLike | None, rank: int = 0, fd: int | None = None) -> None:
        self.path = Path(path) if path else None
        self.rank = rank
        self._fd: int | None = fd
        if self.path is not None and fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_environment(cls, rank: int) -> EventWriter:
        fd = inherited_events_fd()
        if fd is not None:
            return cls("<inherited>", rank=rank, fd=fd)
        return cls(os.environ.get(EVENTS_FILE_ENV) or None, rank=rank)

    def emit(self, event: str, **fields: Any) -> dict:
        """Write an event from rank 0; other ranks do nothing."""
        if self.rank != 0:
            return {}
        return self._write(event, fields)

    def emit_from_any_rank(self, event: str, **fields: Any) -> dict:
        """Write a terminal event whatever the rank (failures must never be swallowed)."""
        if self.rank != 0:
            fields = {**fields, "rank": self.rank}
        return self._write(event, fields)

    def _write(self, event: str, fields: dict) -> dict:
        if event in TERMINAL_EVENTS:  # how much memory the run took, for people and the bench
            fields = {**fields, "peak_rss_bytes": peak_rss_bytes()}
        record = {"event": event, **{k: _json_safe(v) for k, v in fields.items()}, "ts": time.time()}
        line = (json.dumps(record, default=str) + "\n").encode()
        if self.path is None:
            sys.stderr.write("ADC_EVENT " + line.decode())
            sys.stderr.flush()
            return record
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, line)
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def inherited_events_fd() -> int | None:
    """The events descriptor the worker passed (ADC_EVENTS_FD), if it is an open file."""
    value = os.environ.get(EVENTS_FD_ENV, "")
    if not value.isdigit():
        return None
    try:
        os.fstat(int(value))
    except OSError:
        return None
    return int(value)


def read_events(path: str | os.PathLike) -> list[dict]:
    """All complete events in a file (a torn last line, if any, is left out)."""
    events = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
