"""Protocol rows: a typed `Protocol`, its steps moved along shared/contracts/protocol_steps.py's table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg

from shared.contracts.actions import NodeGpus
from shared.contracts.protocol_steps import FIRST_STEP, ProtocolKind, ProtocolState, Step, check_step
from shared.infra.clock import Clock, utc


@dataclass(frozen=True)
class Protocol:
    id: str  # the decision's id
    job_id: str
    kind: ProtocolKind
    step: Step
    state: ProtocolState
    source: tuple[NodeGpus, ...] | None
    target: tuple[NodeGpus, ...] | None
    checkpoint: str | None = None
    ckpt_step: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def from_row(cls, r: asyncpg.Record) -> Protocol:
        def placement(v):
            return tuple(NodeGpus(node=p["node"], gpus=tuple(p["gpus"])) for p in v) if v is not None else None

        return cls(
            id=r["id"],
            job_id=r["job_id"],
            kind=ProtocolKind(r["kind"]),
            step=Step(r["step"]),
            state=ProtocolState(r["state"]),
            source=placement(r["source"]),
            target=placement(r["target"]),
            checkpoint=r["checkpoint"],
            ckpt_step=r["ckpt_step"],
            detail=r["detail"] or {},
            error=r["error"],
        )


def _json(placement: tuple[NodeGpus, ...] | None) -> list[dict] | None:
    return [p.model_dump(mode="json") for p in placement] if placement is not None else None


class ProtocolStore:
    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool = pool
        self.clock = clock

    async def get(self, protocol_id: str) -> Protocol | None:
        row = await self.pool.fetchrow("SELECT * FROM protocols WHERE id = $1", protocol_id)
        return Protocol.from_row(row) if row else None

    async def running(self) -> list[Protocol]:
        return [
            Protocol.from_row(r)
            for r in await self.pool.fetch("SELECT * FROM protocols WHERE state = 'running' ORDER BY started_at")
        ]

    async def running_for(self, job_id: str) -> Protocol | None:
        row = await self.pool.fetchrow("SELECT * FROM protocols WHERE job_id = $1 AND state = 'running'", job_id)
        return Protocol.from_row(row) if row else None

    async def begin(
        self, protocol_id: str, job_id: str, kind: ProtocolKind, source, target, detail: dict, first: Step = FIRST_STEP
    ) -> tuple[str, Protocol]:
        """Record a new protocol at its first step: ("new"|"exists"|"busy", the protocol that holds the job)."""
        if existing := await self.get(protocol_id):
            return "exists", existing
        try:
            row = await self.pool.fetchrow(
                "INSERT INTO protocols (id, job_id, kind, step, source, target, detail, started_at, updated_at)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$8) RETURNING *",
                protocol_id,
                job_id,
                kind.value,
                first.value,
                _json(source),
                _json(target),
                detail,
                utc(self.clock.now()),
            )
            return "new", Protocol.from_row(row)
        except asyncpg.UniqueViolationError:  # another protocol runs for this job
            return "busy", await self.running_for(job_id)

    async def advance(self, proto: Protocol, step: Step, **fields: Any) -> Protocol:
        """To the next step of the table, recording what the step learnt (checkpoint, detail)."""
        check_step(proto.id, proto.step, step)
        return await self._update(proto, {"step": step.value, **fields})

    async def end(self, proto: Protocol, state: ProtocolState, error: str | None = None, **fields: Any) -> Protocol:
        if state == ProtocolState.RUNNING:
            raise ValueError("a protocol ends done, failed or rolled back")
        return await self._update(proto, {"state": state.value, "error": error, **fields}, ended=True)

    async def _update(self, proto: Protocol, fields: dict[str, Any], ended: bool = False) -> Protocol:
        allowed = {"step", "state", "checkpoint", "ckpt_step", "detail", "error"}
        if unknown := set(fields) - allowed:
            raise ValueError(f"not protocol fields: {sorted(unknown)}")
        sets = ["updated_at = $3"] + (["finished_at = $3"] if ended else [])
        args: list[Any] = [proto.id, proto.step.value, utc(self.clock.now())]
        for column, value in fields.items():
            args.append(value)
            sets.append(f"{column} = ${len(args)}")
        row = await self.pool.fetchrow(
            f"UPDATE protocols SET {', '.join(sets)} WHERE id = $1 AND step = $2 AND state = 'running' RETURNING *",
            *args,
        )
        if row is None:
            raise RuntimeError(f"protocol {proto.id} is no longer running at step {proto.step}")
        return Protocol.from_row(row)
