"""One protocol or event at a time per job (node actions are keyed node:<id>)."""

from __future__ import annotations

import asyncio
from collections import defaultdict


class JobLocks:
    def __init__(self) -> None:
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def __call__(self, job_id: str) -> asyncio.Lock:
        return self._locks[job_id]
