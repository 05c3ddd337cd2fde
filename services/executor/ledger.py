"""The executor's record of each decision it received, so a redelivered one is not acted on twice,
and the fences of leadership (migration 017): a decision from a decider that no longer leads
(an older lease token than one already seen) is refused as it is recorded, and an executor that
finds a newer executor's token there has been replaced."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import StrEnum

import asyncpg

from shared.contracts.messages import Decision
from shared.infra.clock import Clock, utc

log = logging.getLogger(__name__)


class DecisionState(StrEnum):
    RECEIVED = "received"
    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"


_SEEN_SQL = "SELECT state, job_id, action FROM decisions WHERE decision_id = $1"


def _as_recorded(seen, decision: Decision) -> DecisionState:
    """A decision id recorded before: its state when this is the same decision again (a redelivery);
    refused when the id now names another job or action, which is not carried out (the recorded one
    stays as it is)."""
    a = decision.action
    if (seen["job_id"], seen["action"]) != (a.job_id, a.action):
        log.warning(
            "decision %s was recorded for %s %s; the same id for %s %s is not carried out",
            decision.decision_id,
            seen["action"],
            seen["job_id"],
            a.action,
            a.job_id,
        )
        return DecisionState.REFUSED
    return DecisionState(seen["state"])


class StaleDecision(Exception):
    """Decided by a decider that had been replaced: recorded as refused, never carried out."""


class Deposed(ConnectionError):
    """This executor no longer leads (its lease lapsed, or a newer executor's token is recorded).
    To a consumer it is an outage: the message is kept for the executor that leads."""


class Fence:
    """This executor's leadership as the parts that act see it: the ledger, every job transition
    (Mover) and every command (transport) check it first, so an executor that lost its lease, even
    one frozen mid-protocol and woken later, acts no more. Without leases (None) it always leads."""

    def __init__(self, lease=None) -> None:
        self.lease = lease
        self.token: int | None = None  # the lease's token while leading

    @property
    def leading(self) -> bool:
        return self.lease is None or (self.token is not None and self.lease.is_leader)

    def check(self) -> None:
        if not self.leading:
            raise Deposed("this executor no longer leads")


_RAISE_FENCE = (
    "WITH up AS (INSERT INTO leader_fences (role, token) VALUES ($1, $2) ON CONFLICT (role) DO UPDATE"
    " SET token = EXCLUDED.token, updated_at = now() WHERE leader_fences.token < EXCLUDED.token RETURNING token)"
    " SELECT COALESCE((SELECT token FROM up), (SELECT token FROM leader_fences WHERE role = $1))"
)


class Ledger:
    def __init__(self, pool: asyncpg.Pool, clock: Clock, fence: Fence | None = None) -> None:
        self.pool = pool
        self.clock = clock
        self.fence = fence or Fence()

    async def claim(self, token: int) -> None:
        """Make `token` the executor's newest; Deposed if a newer executor already wrote one."""
        newest = await self.pool.fetchval(_RAISE_FENCE, "executor", token)
        if newest > token:
            raise Deposed(f"executor token {token} is older than {newest}")

    async def record(self, decision: Decision) -> DecisionState:
        """Record a received decision; its state (received for a new one). A new decision with an
        older decider token than seen is recorded refused and raises StaleDecision."""
        async with self.recording(decision) as (state, _):
            return state

    @asynccontextmanager
    async def recording(self, decision: Decision) -> AsyncIterator[tuple[DecisionState, asyncpg.Connection]]:
        """Record a received decision in a transaction the caller's first effect joins: yields its state
        (as `record` returns it) and the transaction's connection, so a new decision and what the
        caller writes for it while it is received commit together, or neither does. A stale one is
        recorded refused and raises StaleDecision once that is committed."""
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                state, why = await self._record(conn, decision)
                yield state, conn
            if why:
                raise StaleDecision(why)

    async def _record(self, conn: asyncpg.Connection, decision: Decision) -> tuple[DecisionState, str | None]:
        """The decision's state, and why it is refused when it is new and stale."""
        a = decision.action
        self.fence.check()
        if (mine := self.fence.token) is not None:
            newest = await conn.fetchval("SELECT token FROM leader_fences WHERE role = 'executor'")
            if newest is not None and newest > mine:
                raise Deposed(f"executor token {mine} is older than {newest}")
        why = None
        if decision.fence is not None:
            newest = await conn.fetchval(_RAISE_FENCE, "decider", decision.fence)
            if newest > decision.fence:
                why = (
                    f"decided by a decider that no longer leads (lease token {decision.fence}; the newest is {newest})"
                )
        # New decisions are the common case: inserted at once, the one seen before read only on conflict.
        inserted = await conn.fetchval(
            "INSERT INTO decisions (decision_id, job_id, rule, action, payload, state, outcome, finished_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (decision_id) DO NOTHING RETURNING state",
            decision.decision_id,
            a.job_id,
            decision.rule,
            a.action,
            decision.model_dump(mode="json"),
            DecisionState.REFUSED.value if why else DecisionState.RECEIVED.value,
            why,
            utc(self.clock.now()) if why else None,
        )
        if inserted is None:  # recorded before (a redelivery): as it was
            return _as_recorded(await conn.fetchrow(_SEEN_SQL, decision.decision_id), decision), None
        return DecisionState(inserted), why

    async def unfinished(self) -> list[Decision]:
        """Decisions received and not finished: those a replaced executor was carrying out."""
        rows = await self.pool.fetch("SELECT payload FROM decisions WHERE state = 'received' ORDER BY received_at")
        return [Decision.model_validate(r["payload"]) for r in rows]

    async def finish(self, decision_id: str, state: DecisionState, outcome: str) -> None:
        await self.pool.execute(
            "UPDATE decisions SET state = $2, outcome = $3, finished_at = $4 WHERE decision_id = $1",
            decision_id,
            state.value,
            outcome,
            utc(self.clock.now()),
        )
