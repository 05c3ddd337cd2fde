"""Node rows: heartbeats recorded, statuses changed through shared/contracts/node_status.py's table.

Liveness is measured on the injected clock (the heartbeat's time is stored, and "lost" is
decided against `clock.now()`), never Postgres' `now()`, so tests drive timeouts instantly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from shared.contracts.messages import Heartbeat
from shared.contracts.node_status import InvalidNodeTransition, NodeStatus, sources_of
from shared.infra.clock import Clock, utc


@dataclass(frozen=True)
class NodeChange:
    node: str
    old: NodeStatus | None  # None: the node registered
    new: NodeStatus
    last_heartbeat: datetime


class NodeStore:
    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool = pool
        self.clock = clock

    async def record_heartbeat(self, beat: Heartbeat) -> NodeChange | None:
        """Store the node's devices and liveness; the change if it is new or came back from lost."""
        row = await self.pool.fetchrow(
            "WITH before AS (SELECT status FROM nodes WHERE id = $1)"
            " INSERT INTO nodes (id, devices, rack, started_at, last_heartbeat, address) VALUES ($1, $2, $3, $4, $5, $6)"
            " ON CONFLICT (id) DO UPDATE SET devices = EXCLUDED.devices, rack = EXCLUDED.rack,"
            " address = EXCLUDED.address, started_at = EXCLUDED.started_at, last_heartbeat = EXCLUDED.last_heartbeat,"
            " status = CASE WHEN nodes.status = 'lost' THEN 'ready' ELSE nodes.status END"
            " RETURNING status, last_heartbeat, (SELECT status FROM before) AS old",
            beat.node,
            [d.model_dump() for d in beat.devices],
            beat.rack,
            utc(beat.started_at),
            utc(beat.ts),
            beat.address,
        )
        old = NodeStatus(row["old"]) if row["old"] else None
        if old is None or old == NodeStatus.LOST:
            return NodeChange(beat.node, old, NodeStatus(row["status"]), row["last_heartbeat"])
        return None

    async def set_status(self, node: str, new: NodeStatus) -> NodeChange | None:
        """Move a node along the table; None if it is already there. Refused: InvalidNodeTransition."""
        row = await self.pool.fetchrow(
            "UPDATE nodes SET status = $2 FROM (SELECT id, status FROM nodes WHERE id = $1 FOR UPDATE) AS before"
            " WHERE nodes.id = before.id AND before.status = ANY($3::text[])"
            " RETURNING nodes.last_heartbeat, before.status AS old",
            node,
            new.value,
            [s.value for s in sources_of(new)],
        )
        if row is not None:
            return NodeChange(node, NodeStatus(row["old"]), new, row["last_heartbeat"])
        current = await self.pool.fetchval("SELECT status FROM nodes WHERE id = $1", node)
        if current is None:
            raise LookupError(f"no node {node}")
        if NodeStatus(current) == new:
            return None
        raise InvalidNodeTransition(node, NodeStatus(current), new)

    async def mark_lost(self, timeout_s: float, alive: list[str] = ()) -> list[NodeChange]:
        """Every node silent for more than `timeout_s` on the clock becomes lost, except those
        `alive` (heard from lately, though their row could not be written yet)."""
        rows = await self.pool.fetch(
            "WITH gone AS (SELECT id, status FROM nodes WHERE status <> 'lost' AND last_heartbeat < $1"
            " AND id <> ALL($2::text[]) FOR UPDATE)"
            " UPDATE nodes SET status = 'lost' FROM gone WHERE nodes.id = gone.id"
            " RETURNING nodes.id, nodes.last_heartbeat, gone.status AS old",
            utc(self.clock.now() - timeout_s),
            list(alive),
        )
        return [NodeChange(r["id"], NodeStatus(r["old"]), NodeStatus.LOST, r["last_heartbeat"]) for r in rows]

    async def live_ready(self, timeout_s: float) -> dict[str, list[int]]:
        """Devices of each ready node heard from within `timeout_s`."""
        rows = await self.pool.fetch(
            "SELECT id, devices FROM nodes WHERE status = 'ready' AND last_heartbeat > $1",
            utc(self.clock.now() - timeout_s),
        )
        return {r["id"]: [d["index"] for d in r["devices"]] for r in rows}

    async def address(self, node: str) -> str | None:
        return await self.pool.fetchval("SELECT address FROM nodes WHERE id = $1", node)
