"""Node lifecycle as the executor sees it: registration, loss, return, reconciliation.

A node whose heartbeats stop for `worker.node_timeout` is lost: its jobs go back to the
queue to resume from their last complete checkpoint on shared storage. When it comes back
it is reconciled: any trainer it still runs for an attempt that is no longer current is
cancelled, so nothing is double-booked; and a job the database shows running on a node
whose heartbeats no longer list it is requeued, so no job is shown running that is not.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from services.executor import job_store
from shared.clock import utc
from shared.job_status import JobStatus
from shared.messages import Command, Heartbeat
from worker.trainer.checkpoints import checkpoint_step, latest_complete_checkpoint

if TYPE_CHECKING:
    from services.executor.executor import Executor

log = logging.getLogger(__name__)
S = JobStatus
# Statuses in which a trainer should be running on the job's node.
_EXPECT_TRAINER = (S.STARTING, S.RUNNING)
_PROTOCOL_OWNED = (S.SCHEDULED, S.CHECKPOINTING, S.MIGRATING, S.RESIZING)


class NodeMonitor:
    def __init__(self, executor: "Executor") -> None:
        self.ex = executor
        self.last_beat: dict[str, Heartbeat] = {}
        self.missing_since: dict[tuple[str, int], float] = {}

    async def record(self, beat: Heartbeat) -> None:
        async with self.ex.pool.acquire() as conn:
            new = await job_store.upsert_node(conn, beat.node, [d.model_dump() for d in beat.devices], beat.rack,
                                              utc(beat.started_at), utc(beat.ts), beat.address)
        if new:
            await self.ex.audit(f"{beat.node}:registered:{beat.started_at}", "node.registered", node=beat.node,
                                reason=f"node {beat.node} registered {len(beat.devices)} device(s)",
                                data={"devices": [d.model_dump() for d in beat.devices]})

    async def watch(self, stop: asyncio.Event) -> None:
        """Look for lost nodes and unreported trainers once a second."""
        while not stop.is_set():
            try:
                await self.find_lost()
                await self.reconcile()
            except Exception:  # the next pass tries again
                log.exception("node watch failed")
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def find_lost(self) -> None:
        timeout = self.ex.config.worker.node_timeout
        lost = await self.ex.pool.fetch(
            "UPDATE nodes SET status = 'lost' WHERE status <> 'lost'"
            " AND last_heartbeat < now() - make_interval(secs => $1) RETURNING id, last_heartbeat", timeout)
        for node in lost:
            await self.ex.audit(f"{node['id']}:lost:{node['last_heartbeat'].timestamp()}", "node.lost", node=node["id"],
                                reason=f"no heartbeat from {node['id']} for more than {timeout:.0f}s",
                                evidence={"last_heartbeat": node["last_heartbeat"].isoformat(), "timeout_s": timeout})
            jobs = await self.ex.pool.fetch(
                "SELECT id FROM jobs WHERE status = ANY($1::text[]) AND placement @> $2::jsonb",
                [S.SCHEDULED.value, S.STARTING.value, S.RUNNING.value], [{"node": node["id"]}])
            for job in jobs:
                async with self.ex.job_lock(job["id"]):
                    await self.requeue(job["id"], f"node {node['id']} was lost")

    async def requeue(self, job_id: str, why: str) -> None:
        """Back to the queue, to resume from the newest complete checkpoint on shared storage."""
        job = await self.ex.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
        if job is None or job["status"] not in (S.SCHEDULED, S.STARTING, S.RUNNING):
            return
        if await self.ex.pool.fetchval("SELECT 1 FROM protocols WHERE job_id = $1 AND state = 'running'", job_id):
            return  # the protocol's own timeouts and rollback handle it
        latest = latest_complete_checkpoint(Path(job["job_dir"]) / "output") if job["job_dir"] else None
        resume = str(latest) if latest else job["last_checkpoint"]
        step = checkpoint_step(latest) if latest else job["last_checkpoint_step"]
        await self.ex.move(job_id, S.PENDING, placement=None, resume_from=resume, last_checkpoint=resume,
                           last_checkpoint_step=step,
                           reason=f"{why}; requeued to resume from {resume or 'the start'}"
                                  + (f" (step {step})" if step is not None else ""),
                           audit_data={"lost_progress_from_step": (job["progress"] or {}).get("step"),
                                       "resume_step": step})

    async def reconcile(self) -> None:
        now = self.ex.clock.now()
        grace = self.ex.config.worker.node_timeout
        jobs = await self.ex.pool.fetch(
            "SELECT id, attempt, status, placement, extract(epoch FROM updated_at) AS changed FROM jobs"
            " WHERE status = ANY($1::text[])", [s.value for s in _EXPECT_TRAINER])
        for job in jobs:
            beats = [self.last_beat.get(p["node"]) for p in job["placement"]]
            if any(b is None or b.ts < job["changed"] + 1 for b in beats):
                continue  # no heartbeat sent after the job got here yet
            listed = all(any(t.job_id == job["id"] and t.attempt == job["attempt"] for t in b.running) for b in beats)
            node = ",".join(p["node"] for p in job["placement"])
            key = (job["id"], job["attempt"])
            if listed:
                self.missing_since.pop(key, None)
                continue
            first = self.missing_since.setdefault(key, now)
            if now - first > grace:  # its exit event would have come by now
                self.missing_since.pop(key, None)
                async with self.ex.job_lock(job["id"]):
                    await self.requeue(job["id"], f"node {node} no longer runs its trainer")
        # Trainers of attempts that are no longer current (a node that came back) are stopped.
        # Read the jobs now, after the heartbeats: a trainer's attempt is written before it starts.
        listed = {t.job_id for beat in self.last_beat.values() for t in beat.running}
        if not listed:
            return
        rows = {r["id"]: r for r in await self.ex.pool.fetch(
            "SELECT id, status, attempt, placement FROM jobs WHERE id = ANY($1::text[])", list(listed))}
        for node, beat in list(self.last_beat.items()):
            for t in beat.running:
                job = rows.get(t.job_id)
                if job is not None:
                    here = any(p["node"] == node for p in job["placement"] or [])
                    if job["attempt"] == t.attempt and here:
                        continue
                    if job["status"] in _PROTOCOL_OWNED:
                        continue  # mid-protocol: the protocol owns that trainer
                cmd = Command(command_id=f"{t.job_id}:{t.attempt}:stale", kind="cancel", job_id=t.job_id, attempt=t.attempt)
                result = await self.ex.send(node, cmd, attempts=1)
                await self.ex.audit(f"{t.job_id}:{t.attempt}:{node}:stale", "node.reconciled", node=node, job_id=t.job_id,
                                    reason=f"{node} still ran attempt {t.attempt} of {t.job_id}, which is no longer "
                                           f"current; stopped it", data={"ok": result.ok})
