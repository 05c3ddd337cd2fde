"""The bandit's learning state in Postgres (`bandit_state`, migration 022): the model's bytes, its
version (updates learned) and running figures, one row per decision point.

Writes are fenced like decisions: each carries the writer's lease token, and a row holding a newer
token than the write's is left as it is (the write reports it was refused), so a decider that
lost the lease cannot overwrite what the new leader learned. A reset is asked for by the api
(`reset_requested_at`); the writer sees the request in the answer to its next write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

POINT = "placement"

SAVE = (
    "INSERT INTO bandit_state (point, version, model, fence, stats, writer) VALUES ($1, $2, $3, $4, $5, $6)"
    " ON CONFLICT (point) DO UPDATE SET version = EXCLUDED.version, model = EXCLUDED.model,"
    " fence = EXCLUDED.fence, stats = EXCLUDED.stats, writer = EXCLUDED.writer, updated_at = now()"
    " WHERE bandit_state.fence <= EXCLUDED.fence"
    " RETURNING reset_requested_at, reset_requested_by"
)
RESET = (
    "UPDATE bandit_state SET version = 0, model = $2, fence = $3, stats = $4, writer = $5, updated_at = now(),"
    " reset_requested_at = NULL, reset_requested_by = NULL WHERE point = $1 AND fence <= $3 RETURNING point"
)


@dataclass(frozen=True)
class Stored:
    model: bytes
    version: int
    stats: dict[str, Any]
    fence: int


@dataclass(frozen=True)
class Saved:
    written: bool  # False: a newer leader's token holds the row
    reset_by: str | None = None  # someone asked for a reset (None: nobody)


class BanditStore:
    def __init__(self, pool: asyncpg.Pool, point: str = POINT) -> None:
        self.pool = pool
        self.point = point

    async def load(self) -> Stored | None:
        row = await self.pool.fetchrow(
            "SELECT model, version, stats, fence FROM bandit_state WHERE point = $1", self.point
        )
        if row is None:
            return None
        return Stored(bytes(row["model"]), row["version"], dict(row["stats"] or {}), row["fence"])

    async def save(self, model: bytes, version: int, stats: dict[str, Any], fence: int, writer: str) -> Saved:
        row = await self.pool.fetchrow(SAVE, self.point, version, model, fence, stats, writer)
        if row is None:
            return Saved(False)
        if row["reset_requested_at"] is not None:
            return Saved(True, row["reset_requested_by"] or "someone")
        return Saved(True)

    async def reset(self, model: bytes, fence: int, stats: dict[str, Any], writer: str) -> bool:
        return await self.pool.fetchval(RESET, self.point, model, fence, stats, writer) is not None
