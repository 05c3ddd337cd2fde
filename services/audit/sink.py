"""The audit sink: ADC_AUDIT -> audit_events, idempotent, acked only after commit."""

from __future__ import annotations

import asyncio
import json
import logging

import asyncpg
from nats.aio.msg import Msg

from shared.contracts.messages import AuditEvent, CommandRefusal
from shared.infra.audit_chain import GENESIS, row_hash
from shared.infra.bus import Bus, consume
from shared.infra.clock import utc
from shared.infra.job_reads.one_job import team_of_sql
from shared.infra.rejections import rejected
from shared.infra.storable import storable_json

log = logging.getLogger(__name__)
_CHAIN_LOCK = 7_420_002  # advisory lock: one writer extends the chain at a time

_INSERT = (
    "INSERT INTO audit_events (event_id, ts, source, kind, actor, job_id, node, decision_id, rule, action,"
    " reason, evidence, data, prev_hash, hash, team)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,"
    f" COALESCE({team_of_sql('$6')}, $16))"  # the row's team: its job's (row_team), in this one statement
)


def row_team(event: AuditEvent) -> str | None:
    """Who besides operators may read the row (migration 026): the team of its job, which never changes
    once the job is stored, looked up by the INSERT itself. The api publishes job.submitted inside the
    transaction that stores the job, so that event may come before the job's commit: then it is the
    team the api's event names, given here. No job: no team (only operators and admins see the row)."""
    named = event.data.get("team")
    if event.job_id and event.source == "api" and event.kind == "job.submitted" and isinstance(named, str):
        return named[:64]
    return None


def _jsonable(value: dict) -> dict:
    # What Postgres jsonb gives back, so the hash verifies against the stored row.
    return json.loads(json.dumps(value, default=str))


async def write_event(pool: asyncpg.Pool, event: AuditEvent, chain_key: bytes | None = None) -> bool:
    """Append one event; False if it was already there (a redelivery)."""
    row = storable_json(event.model_dump())
    row["ts"] = utc(event.ts)
    row["evidence"] = _jsonable(row["evidence"])
    row["data"] = _jsonable(row["data"])
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _CHAIN_LOCK)
        if await conn.fetchval("SELECT 1 FROM audit_events WHERE event_id = $1", row["event_id"]):
            return False
        prev = await conn.fetchval("SELECT hash FROM audit_events ORDER BY id DESC LIMIT 1") or GENESIS
        await conn.execute(
            _INSERT,
            row["event_id"],
            row["ts"],
            row["source"],
            row["kind"],
            row["actor"],
            row["job_id"],
            row["node"],
            row["decision_id"],
            row["rule"],
            row["action"],
            row["reason"],
            row["evidence"],
            row["data"],
            prev,
            row_hash(prev, row, chain_key),
            row_team(event),
        )
    return True


async def run_sink(bus: Bus, pool: asyncpg.Pool, stop: asyncio.Event, chain_key: bytes | None = None) -> None:
    async def handle(msg: Msg) -> None:
        try:
            event = AuditEvent.decode(msg.data)
        except ValueError as err:
            rejected("audit", err, msg.data, "audit sink")
            await msg.term()
            return
        await write_event(pool, event, chain_key)
        await msg.ack()

    async def handle_refusal(msg: Msg) -> None:
        try:
            event = refusal_event(msg.subject, CommandRefusal.decode(msg.data))
        except ValueError as err:
            rejected("command_refusals", err, msg.data, "audit sink")
            await msg.term()
            return
        await write_event(pool, event, chain_key)
        await msg.ack()

    s = bus.subjects
    await asyncio.gather(
        consume(bus, s.audit_stream, s.audit, s.consumer("audit-sink"), handle, stop),
        consume(bus, s.refusals_stream, s.command_refusals("*"), s.consumer("audit-refusals"), handle_refusal, stop),
    )


def refusal_event(subject: str, refusal: CommandRefusal) -> AuditEvent:
    """A worker's refusal report as an audit event. The node is the subject's (only that node's worker
    may publish there), never the payload's; the id is namespaced by it, so a report cannot take the
    id of another event and so suppress it."""
    node = subject.split(".")[2]
    return AuditEvent(
        event_id=f"command.refused:{node}:{refusal.refusal_id[:64]}",
        ts=refusal.ts,
        source=f"worker-{node}",
        kind="command.refused",
        node=node,
        action=refusal.claimed.get("kind"),
        reason=f"worker on {node} refused a command: {refusal.reason}",
        data={"claimed": refusal.claimed},
    )
