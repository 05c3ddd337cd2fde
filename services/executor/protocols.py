"""Protocols that change a running job: checkpoint-stop first, then hold it or start it elsewhere.

Every protocol is recorded in `protocols` with its current step before that step acts, so an
executor killed at any point resumes it where it was and nothing is done twice:

  stopping        running -> checkpointing; the worker checkpoints at the next step boundary
                  and exits; on failure the trainer is killed and the last periodic checkpoint
                  on shared storage is used instead (escalation, audited).
  hold            preempt: -> preempted -> pending (requeued, resume_from set)
                  pause:   -> paused (until resumed)
  placing         migrate/tune: -> migrating; scale: -> resizing; new attempt, new placement
  starting_target start on the target with resume_from; ok -> starting.
  rollback        the target failed: restart on the source if its devices are still free,
                  otherwise requeue.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from services.executor import job_store
from services.executor.targets import pick_target
from shared.actions import Migrate, NodeGpus, Preempt
from shared.job_status import JobStatus
from shared.messages import Command, Decision
from worker.trainer.checkpoints import checkpoint_step, latest_complete_checkpoint

if TYPE_CHECKING:
    from services.executor.executor import Executor

log = logging.getLogger(__name__)
S = JobStatus
MOVES = {"migrate": S.MIGRATING, "tune": S.MIGRATING, "scale": S.RESIZING}
HOLDS = {"preempt", "pause"}
KINDS = set(MOVES) | HOLDS


class ProtocolRunner:
    def __init__(self, executor: "Executor") -> None:
        self.ex = executor

    @property
    def pool(self) -> asyncpg.Pool:
        return self.ex.pool

    async def _job(self, job_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)

    async def _set(self, proto_id: str, **fields: Any) -> asyncpg.Record:
        async with self.pool.acquire() as conn:
            return await job_store.set_protocol(conn, proto_id, **fields)

    async def _audit(self, proto: asyncpg.Record, suffix: str, kind: str, reason: str, **data: Any) -> None:
        await self.ex.audit(f"{proto['id']}:{suffix}", kind, job_id=proto["job_id"], decision_id=proto["id"],
                            action=proto["kind"], reason=reason, data=data)

    # --- entry -----------------------------------------------------------------------

    async def begin(self, decision: Decision, msg=None) -> None:
        """Check the decision against the job and record the protocol, then run it."""
        a = decision.action
        kind = a.action
        job = await self._job(a.job_id)
        if job is None:
            return await self.ex.refuse(decision, "no such job")
        async with self.pool.acquire() as conn:
            existing = await conn.fetchrow("SELECT * FROM protocols WHERE id = $1", decision.decision_id)
        if existing is not None:  # a redelivered decision: resume or acknowledge, never redo
            if existing["state"] == "running":
                return await self.run(existing, msg)
            return await self.ex.finish_decision(decision.decision_id, "done", f"protocol already {existing['state']}")
        if job["status"] != S.RUNNING:
            return await self.ex.refuse(decision, f"job is {job['status']}; only a running job can be {kind}d")
        source = job["placement"]
        target: list[dict] | None = None
        if kind in ("migrate", "scale"):
            wanted = list(a.placement)
            if kind == "migrate" and (not wanted or not wanted[0].gpus):
                wanted = await self._choose_target(job, only_node=wanted[0].node if wanted else None)
                if wanted is None:
                    return await self.ex.refuse(decision, "no other live, ready node has room for the job")
            problem = await self._unavailable(job, wanted)
            if problem:
                return await self.ex.refuse(decision, problem)
            target = [p.model_dump(mode="json") for p in wanted]
        elif kind == "tune":
            target = source
        detail = {"env": getattr(a, "env", {}), "actor": decision.actor, "rule": decision.rule}
        async with self.pool.acquire() as conn:
            state, proto = await job_store.begin_protocol(conn, decision.decision_id, job["id"], kind, "stopping",
                                                          source, target, detail)
        if state == "busy":
            return await self.ex.refuse(decision, f"job is mid-{proto['kind']} (protocol {proto['id']})")
        await self._audit(proto, "protocol.started", "protocol.started",
                          f"{kind} of job {job['id']} started" + (f" by {decision.actor}" if decision.actor else ""),
                          source=source, target=target)
        await self.run(proto, msg)

    async def _choose_target(self, job: asyncpg.Record, only_node: str | None = None) -> list[NodeGpus] | None:
        current = {p["node"] for p in job["placement"] or []}
        async with self.pool.acquire() as conn:
            free = await job_store.free_devices(conn, self.ex.config.worker.node_timeout, exclude_job=job["id"])
        needed = sum(len(p["gpus"]) for p in job["placement"] or []) or job["gpus"]
        if only_node is not None:
            free = {only_node: free.get(only_node, [])}
        return pick_target(free, needed, exclude=current if only_node is None else set())

    async def _unavailable(self, job: asyncpg.Record, target: list[NodeGpus]) -> str | None:
        async with self.pool.acquire() as conn:
            free = await job_store.free_devices(conn, self.ex.config.worker.node_timeout, exclude_job=job["id"])
        for part in target:
            if part.node not in free:
                return f"node {part.node} is not a live, ready node"
            if busy := [g for g in part.gpus if g not in free[part.node]]:
                return f"devices {busy} of node {part.node} are not free"
        return None

    # --- the steps -------------------------------------------------------------------

    async def run(self, proto: asyncpg.Record, msg=None) -> None:
        """Carry the protocol on from its recorded step until it ends."""
        while proto["state"] == "running":
            if msg is not None:
                await msg.in_progress()
            step = proto["step"]
            if step == "stopping":
                proto = await self._stopping(proto)
            elif step == "hold":
                proto = await self._hold(proto)
            elif step == "placing":
                proto = await self._placing(proto)
            elif step == "starting_target":
                proto = await self._starting_target(proto)
            elif step == "rollback":
                proto = await self._rollback(proto)
            else:
                proto = await self._set(proto["id"], state="failed", error=f"unknown step {step}")
        await self.ex.finish_decision(proto["id"], "done" if proto["state"] == "done" else "failed",
                                      proto["error"] or proto["state"])
        await self._audit(proto, f"protocol.{proto['state']}", f"protocol.{proto['state']}",
                          f"{proto['kind']} {proto['state'].replace('_', ' ')}" + (f": {proto['error']}" if proto["error"] else ""),
                          checkpoint=proto["checkpoint"], step=proto["ckpt_step"], target=proto["target"])

    async def _stopping(self, proto: asyncpg.Record) -> asyncpg.Record:
        job = await self._job(proto["job_id"])
        if job["status"] == S.RUNNING:
            job = await self.ex.move(job["id"], S.CHECKPOINTING, proto["id"],
                                     reason=f"checkpoint-stop for {proto['kind']}")
        elif job["status"] != S.CHECKPOINTING:  # ended meanwhile (finished, cancelled, node lost)
            return await self._set(proto["id"], state="failed", error=f"job became {job['status']} before it stopped")
        node = job["placement"][0]["node"]
        result = await self.ex.stop_trainers(job, f"{proto['id']}:stop", proto["id"])
        await self.ex.audit(f"{proto['id']}:command.stop", "command.stop", job_id=job["id"], node=node,
                            decision_id=proto["id"], action="stop",
                            reason=(f"trainer checkpointed at step {result.step} and stopped" if result.ok
                                    else f"checkpoint-stop failed: {result.error}: {result.message}"),
                            data={"ok": result.ok, "checkpoint": result.checkpoint, "step": result.step,
                                  "outcome": result.outcome})
        if result.outcome == "succeeded":  # it finished first: its exit event completes the job
            return await self._set(proto["id"], state="failed", error="the job finished before it could be stopped")
        checkpoint, step = result.checkpoint, result.step
        if not (result.ok and checkpoint):
            checkpoint, step = await self._escalate(proto, job, node, f"{result.error}: {result.message}")
        next_step = "hold" if proto["kind"] in HOLDS else "placing"
        return await self._set(proto["id"], step=next_step, checkpoint=checkpoint, ckpt_step=step)

    async def _escalate(self, proto: asyncpg.Record, job: asyncpg.Record, node: str, why: str) -> tuple[str | None, int | None]:
        for part in job["placement"] or [{"node": node}]:
            kill = Command(command_id=f"{proto['id']}:kill:{part['node']}", decision_id=proto["id"], kind="cancel",
                           job_id=job["id"], attempt=job["attempt"])
            await self.ex.send(part["node"], kill, attempts=1)
        latest = latest_complete_checkpoint(Path(job["job_dir"]) / "output") if job["job_dir"] else None
        checkpoint = str(latest) if latest else job["last_checkpoint"]
        step = checkpoint_step(latest) if latest else job["last_checkpoint_step"]
        await self._audit(proto, "protocol.escalated", "protocol.escalated",
                          f"checkpoint-stop failed ({why}); trainer killed; resuming from the last periodic "
                          f"checkpoint {checkpoint or '(none: from the start)'}", checkpoint=checkpoint, step=step)
        return checkpoint, step

    async def _hold(self, proto: asyncpg.Record) -> asyncpg.Record:
        job = await self._job(proto["job_id"])
        ckpt, step = proto["checkpoint"], proto["ckpt_step"]
        common = dict(placement=None, resume_from=ckpt, last_checkpoint=ckpt or job["last_checkpoint"],
                      last_checkpoint_step=step if ckpt else job["last_checkpoint_step"])
        where = f"checkpoint {ckpt} (step {step})" if ckpt else "the start"
        if proto["kind"] == "pause":
            if job["status"] == S.CHECKPOINTING:
                await self.ex.move(job["id"], S.PAUSED, proto["id"], reason=f"paused; resumes from {where}", **common)
        else:
            if job["status"] == S.CHECKPOINTING:
                job = await self.ex.move(job["id"], S.PREEMPTED, proto["id"], reason=f"preempted at {where}", **common)
            if job["status"] == S.PREEMPTED:
                await self.ex.move(job["id"], S.PENDING, proto["id"], reason=f"requeued after preemption; resumes from {where}")
        return await self._set(proto["id"], state="done")

    async def _placing(self, proto: asyncpg.Record) -> asyncpg.Record:
        job = await self._job(proto["job_id"])
        ckpt = proto["checkpoint"]
        if job["status"] == S.CHECKPOINTING:
            where = ",".join(f"{p['node']}:{p['gpus']}" for p in proto["target"])
            tuned = (proto["detail"] or {}).get("env") or {}
            await self.ex.move(job["id"], MOVES[proto["kind"]], proto["id"], placement=proto["target"],
                               attempt=job["attempt"] + 1, resume_from=ckpt, last_checkpoint=ckpt or job["last_checkpoint"],
                               env=(job["env"] or {}) | tuned,
                               last_checkpoint_step=proto["ckpt_step"] if ckpt else job["last_checkpoint_step"],
                               reason=f"{proto['kind']} to {where} from checkpoint step {proto['ckpt_step']}")
        return await self._set(proto["id"], step="starting_target")

    async def _starting_target(self, proto: asyncpg.Record) -> asyncpg.Record:
        job = await self._job(proto["job_id"])
        if job["status"] not in (S.MIGRATING, S.RESIZING):
            return await self._set(proto["id"], state="done" if job["status"] in (S.STARTING, S.RUNNING) else "failed",
                                   error=None if job["status"] in (S.STARTING, S.RUNNING) else f"job is {job['status']}")
        placement = [NodeGpus(node=p["node"], gpus=tuple(p["gpus"])) for p in job["placement"]]
        node = placement[0].node
        result = await self.ex.start_trainers(job, placement, f"{proto['id']}:start:{job['attempt']}", proto["id"])
        if result.ok:
            await self.ex.move(job["id"], S.STARTING, proto["id"], job_dir=result.job_dir,
                               reason=f"resumed from {job['resume_from']} as process {result.pid} on {node}")
            return await self._set(proto["id"], state="done" if not (proto["detail"] or {}).get("rolled_back") else "rolled_back",
                                   error=(proto["detail"] or {}).get("rollback_reason"))
        detail = dict(proto["detail"] or {}, failure=f"{result.error}: {result.message}")
        return await self._set(proto["id"], step="rollback", detail=detail)

    async def _rollback(self, proto: asyncpg.Record) -> asyncpg.Record:
        job = await self._job(proto["job_id"])
        detail = dict(proto["detail"] or {})
        why = f"start on the target failed ({detail.get('failure')})"
        source = [NodeGpus(node=p["node"], gpus=tuple(p["gpus"])) for p in proto["source"] or []]
        if not detail.get("rolled_back") and source and not await self._unavailable(job, source):
            async with self.pool.acquire() as conn:
                await job_store.update_job(conn, job["id"], placement=proto["source"], attempt=job["attempt"] + 1)
            detail |= {"rolled_back": True, "rollback_reason": f"{why}; restarted on the source"}
            await self._audit(proto, "protocol.rollback", "protocol.rollback", f"{why}; restarting on the source",
                              source=proto["source"])
            return await self._set(proto["id"], step="starting_target", detail=detail)
        await self.ex.move(job["id"], S.PENDING, proto["id"], placement=None,
                           reason=f"{why}; requeued to resume from {job['resume_from']}")
        return await self._set(proto["id"], state="rolled_back", error=f"{why}; requeued")

    # --- node protocols ----------------------------------------------------------------

    async def drain(self, decision: Decision, node: str) -> None:
        """Move every job off the node without losing a step; the node ends cordoned."""
        await self.ex.set_node_status(node, "draining", decision, f"drain of {node} started")
        deadline = self.ex.clock.now() + 20 * self.ex.config.controller.timeout
        while self.ex.clock.now() < deadline:
            jobs = await self.pool.fetch(
                "SELECT * FROM jobs WHERE status = ANY($1::text[]) AND placement @> $2::jsonb",
                [s.value for s in (S.SCHEDULED, S.STARTING, S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESIZING)],
                [{"node": node}],
            )
            if not jobs:
                break
            for job in jobs:
                if job["status"] != S.RUNNING:
                    continue  # mid-start or mid-protocol: look again once it settles
                target = await self._choose_target(job)
                reason = f"drain of node {node}"
                action = (Migrate(job_id=job["id"], placement=target, reason=f"{reason}: moved to {target[0].node}")
                          if target else Preempt(job_id=job["id"], reason=f"{reason}: no room elsewhere, requeued"))
                sub = Decision(decision_id=f"{decision.decision_id}:{job['id']}", ts=self.ex.clock.now(),
                               rule=decision.rule, action=action, snapshot_ts=self.ex.clock.now(), actor=decision.actor)
                async with self.ex.job_lock(job["id"]):
                    await self.ex.record(sub)
                    await self.begin(sub)
            await asyncio.sleep(0.5)
        left = await self.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE status = ANY($1::text[]) AND placement @> $2::jsonb",
            [s.value for s in (S.SCHEDULED, S.STARTING, S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESIZING)],
            [{"node": node}])
        await self.ex.set_node_status(node, "cordoned", decision,
                                      f"drain of {node} done: node empty, cordoned" if not left
                                      else f"drain of {node} timed out with {left} job(s) left; cordoned")
        await self.ex.finish_decision(decision.decision_id, "done" if not left else "failed", f"{left} job(s) left")
