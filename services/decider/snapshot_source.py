"""Builds each pass's snapshot: jobs from the job book (kept from the bus, reconciled against
Postgres), quotas, node states and move requests from Postgres (the executor and api write
them; read again when their audit events say they changed), nodes' devices and telemetry from
the live cluster view.

Devices promised by decisions still in flight count as taken, so a pass never hands out what
the previous one already gave away. Elastic floors are made effective here: an elastic job's
`min_gpus` is never below its priority level's `min_gpus`.
"""

from __future__ import annotations

import asyncpg

from services.decider.admission_order import admission_order
from services.decider.cluster_view import ClusterView
from services.decider.job_book import MISSING_GRACE_S, JobBook
from services.decider.snapshot import JobView, MoveRequest, NodeView, Snapshot
from shared.contracts.actions import NodeGpus
from shared.contracts.trace_context import valid_traceparent
from shared.infra.config import AdcConfig
from shared.specs.quota import Quota

# Move requests of the last hour that no decision has answered yet (the decision names the request).
_OPEN_REQUESTS_SQL = (
    "SELECT r.id, r.job_id, r.target_node, r.actor, r.reason, r.trace_parent FROM move_requests r"
    " WHERE r.requested_at > to_timestamp($1) - interval '1 hour' AND NOT EXISTS (SELECT 1 FROM decisions d"
    " WHERE d.payload->'action'->'evidence'->>'request_id' = r.id) ORDER BY r.requested_at"
)
_CONTROLLER_SQL = (
    "SELECT (SELECT coalesce(max(version), 0) FROM policies) AS version,"
    " c.paused, c.reason, c.updated_by FROM (SELECT 1) one LEFT JOIN controller_state c ON true"
)


def _move_request(row: asyncpg.Record) -> MoveRequest:
    return MoveRequest(
        id=row["id"],
        job_id=row["job_id"],
        target_node=row["target_node"],
        actor=row["actor"],
        reason=row["reason"],
        trace_parent=valid_traceparent(row["trace_parent"]),  # it came with a request: a bad one is dropped
    )


class SnapshotSource:
    """`jobs` comes from the job book (kept from events, reconciled every `reconcile_s`); with
    `full_reads` every pass reconciles, i.e. reads every live job again (as the decider did before)."""

    def __init__(
        self, pool: asyncpg.Pool, view: ClusterView, reconcile_s: float = 30.0, full_reads: bool = False
    ) -> None:
        self.pool = pool
        self.view = view
        self.book = JobBook(pool, reconcile_s, view.checkpoints)
        self.full_reads = full_reads
        self._used: tuple | None = None
        self._previous: tuple[int, Snapshot] | None = None  # the last snapshot, with the book's version then
        self._node_views: dict[str, tuple] = {}  # node -> (beat, status, schedulable, taken, view)
        self._tables: tuple[dict, dict, tuple] = ({}, {}, ())
        self._tables_dirty = True
        self._tables_read_at = float("-inf")
        self._tables_reread_until = float("-inf")
        self._controller: tuple[float, tuple[int, str | None]] | None = None  # (read at, state)
        self._controller_reread_until = float("-inf")

    async def controller_state(self, now: float | None = None) -> tuple[int, str | None]:
        """The newest policy version (0: none) and why the controller is paused (operators pause it
        through the API; None: it is not), read in one round trip: each regular pass asks both."""
        try:
            row = await self.pool.fetchrow(_CONTROLLER_SQL)
        except asyncpg.UndefinedTableError:
            row = None
        state = (0, None)
        if row is not None:
            paused = None
            if row["paused"]:
                by = f" by {row['updated_by']}" if row["updated_by"] else ""
                paused = f"the controller is paused{by}" + (f": {row['reason']}" if row["reason"] else "")
            state = (row["version"], paused)
        if now is not None:
            self._controller = (now, state)
        return state

    def recent_controller_state(self, now: float, max_age_s: float) -> tuple[int, str | None] | None:
        """The last read's answer (the urgent pass's, which asks Postgres nothing it need not), if it is
        younger than `max_age_s` and no audit event has said the policy or the pause changed since
        (for MISSING_GRACE_S after one, as the api audits inside its transaction); else None."""
        if (
            self._controller is None
            or now >= self._controller[0] + max_age_s
            or self._controller[0] < self._controller_reread_until
        ):
            return None
        return self._controller[1]

    def controller_changed(self, now: float) -> None:
        """A policy or the pause changed (an audit event said so): read them again for a while."""
        self._controller = None
        self._controller_reread_until = now + MISSING_GRACE_S

    async def controller_paused(self) -> str | None:
        """Why the controller is paused, or None if it is not."""
        return (await self.controller_state())[1]

    async def latest_policy(self, known_version: int, version: int | None = None) -> tuple[int, dict | None] | None:
        """(version, body) of the newest policy document if it is not `known_version`; version 0: none.
        `version`: the newest version, when the caller has just read it (controller_state)."""
        if version is None:
            version = (await self.controller_state())[0]
        if version == known_version:
            return None
        body = await self.pool.fetchval("SELECT body FROM policies WHERE version = $1", version) if version else None
        return version, body

    async def decision_states(self, decision_ids: list[str]) -> dict[str, str]:
        if not decision_ids:
            return {}
        rows = await self.pool.fetch(
            "SELECT decision_id, state FROM decisions WHERE decision_id = ANY($1::text[])", decision_ids
        )
        return {r["decision_id"]: r["state"] for r in rows}

    async def jobs(self, config: AdcConfig, now: float, whole: bool = True) -> tuple[JobView, ...]:
        """The live jobs; `whole=False` (an urgent pass): only what events named is read again, the
        periodic reconcile is left to the regular pass."""
        levels = {lv.name: lv.min_gpus for lv in config.strategies.priority_scheduling.levels}
        if self.full_reads and whole:
            await self.book.reconcile(now, levels)
        return await self.book.refresh(now, levels, whole)

    def _used_by_jobs(self, jobs: tuple[JobView, ...]) -> dict[str, set[int]]:
        """Devices the book's jobs hold, per node; recomputed only when the book may have moved a job
        (progress and checkpoints change neither status nor placement)."""
        if self._used is None or self._used[0] != self.book.version:
            used: dict[str, set[int]] = {}
            for job in jobs:
                for part in job.placement if job.holds_gpus else ():
                    used.setdefault(part.node, set()).update(part.gpus)
            self._used = (self.book.version, used)
        return self._used[1]

    async def build(
        self,
        now: float,
        config: AdcConfig,
        jobs: tuple[JobView, ...],
        booked: list[NodeGpus],
        schedules: tuple[str, ...] = (),
    ) -> Snapshot:
        await self._read_tables(now)
        node_status, quotas, requests = self._tables
        used = self._used_by_jobs(jobs)
        if booked:  # a copy of the nodes booked, not of every node's
            used = dict(used)
            for part in booked:
                used[part.node] = set(used.get(part.node, ())) | set(part.gpus)
        timeout = config.worker.node_timeout
        nodes, cache = {}, {}
        for name, entry in self.view.nodes.items():
            beat = entry.beat
            if beat is None:
                continue  # telemetry without a heartbeat: no worker there to run anything
            status = node_status.get(name, "ready")
            taken = used.get(name, ())
            schedulable = now - entry.beat_at <= timeout and status == "ready"
            cached = self._node_views.get(name)
            if (
                cached is None
                or cached[0] is not beat
                or cached[1] != status
                or cached[2] != schedulable
                or cached[3] != taken
            ):
                devices = tuple(d.index for d in beat.devices)
                view = NodeView(
                    id=name,
                    devices=devices,
                    rack=beat.rack,
                    last_seen=entry.beat_at,
                    free=tuple(i for i in devices if i not in taken),
                    schedulable=schedulable,
                    gpus=entry.gpus,
                    status=status,
                )
                cached = (beat, status, schedulable, taken, view)
            elif cached[4].last_seen != entry.beat_at:
                # A routine heartbeat (same devices) only moves last_seen: a copy, not a rebuild.
                cached = cached[:4] + (cached[4].seen_at(entry.beat_at),)
            cache[name] = cached
            nodes[name] = cached[4]
        self._node_views = cache  # node views are reused while nothing about the node changed
        snap = Snapshot(
            ts=now,
            nodes=nodes,
            jobs=jobs,
            telemetry=self.view.freeze(now),
            quotas=quotas,
            schedules=schedules,
            move_requests=requests,
            order=admission_order(config, jobs),
        )
        previous = self._previous
        if previous is not None and previous[0] == self.book.version:
            snap.carry_over(previous[1])  # no job moved since: who holds what is as the last pass worked it out
        self._previous = (self.book.version, snap)
        return snap

    def tables_changed(self, now: float) -> None:
        """The api or the executor audited a change of quotas, node states or move requests. The api
        audits inside its transaction, so the change may not be visible yet: read them each pass
        for a while."""
        self._tables_dirty = True
        self._tables_reread_until = now + MISSING_GRACE_S

    async def _read_tables(self, now: float) -> None:
        """Quotas, node states and open move requests: read again when an audit event says they
        changed (and for MISSING_GRACE_S after), while a move request is open (a decision answers
        it), and at each reconcile."""
        if not (
            self._tables_dirty
            or self._tables[2]
            or now < self._tables_reread_until
            or now - self._tables_read_at >= self.book.reconcile_s
        ):
            return
        self._tables_dirty = False
        async with self.pool.acquire() as conn:
            quota_rows = await conn.fetch("SELECT * FROM quotas")
            node_rows = await conn.fetch("SELECT id, status FROM nodes")
            request_rows = await conn.fetch(_OPEN_REQUESTS_SQL, now)
        requests = tuple(_move_request(r) for r in request_rows)
        self._tables = (
            {r["id"]: r["status"] for r in node_rows},
            {r["team"]: Quota.from_row(r) for r in quota_rows},
            requests,
        )
        self._tables_read_at = now
