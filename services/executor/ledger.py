"""The executor's record of each decision it received, so a redelivered one is not acted on twice."""
from __future__ import annotations

from enum import StrEnum

import asyncpg

from shared.clock import Clock, utc
from shared.messages import Decision


class DecisionState(StrEnum):
    RECEIVED = "received"
    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"


class Ledger:
    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool = pool
        self.clock = clock

    async def record(self, decision: Decision) -> DecisionState:
        """Record a received decision; its state (received for a new one)."""
        a = decision.action
        state = await self.pool.fetchval(
            "WITH new AS (INSERT INTO decisions (decision_id, job_id, rule, action, payload, state)"
            " VALUES ($1, $2, $3, $4, $5, 'received') ON CONFLICT (decision_id) DO NOTHING RETURNING state)"
            " SELECT state FROM new UNION ALL SELECT state FROM decisions WHERE decision_id = $1 LIMIT 1",
            decision.decision_id, a.job_id, decision.rule, a.action, decision.model_dump(mode="json"))
        return DecisionState(state)

    async def finish(self, decision_id: str, state: DecisionState, outcome: str) -> None:
        await self.pool.execute(
            "UPDATE decisions SET state = $2, outcome = $3, finished_at = $4 WHERE decision_id = $1",
            decision_id, state.value, outcome, utc(self.clock.now()))
