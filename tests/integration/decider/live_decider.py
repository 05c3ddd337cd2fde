"""A decider engine on the real NATS and Postgres of an isolated test environment, with
helpers to feed it (heartbeats and metrics over the bus, jobs into Postgres) and to watch
what it says (decisions and audit events, as published)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml

from services.decider.engine import DeciderEngine
from shared.contracts.messages import AuditEvent, Decision, Device, GpuSample, Heartbeat, NodeMetrics
from shared.infra.bus import Bus
from shared.infra.config import load_config
from shared.infra.db import create_pool, service_url
from shared.infra.pending_reasons import read_pending_reason
from tests.waits import until_async


class LiveDecider:
    def __init__(self, env, home: Path, strategies: dict | None = None, leases: dict | None = None, **decider) -> None:
        self.env = env
        self.home = home
        self.rules_dir = home / "rules"
        self.rules_dir.mkdir(exist_ok=True)
        self.config_path = home / "adc_config.yaml"
        self.config_doc = {
            "controller": {"interval": 0.2},
            "bus": {"url": env.nats_url, "prefix": env.prefix, "credentials_dir": str(env.keys.directory)},
            "database": {"url": env.database_url},
            "decider": {"rules_dir": str(self.rules_dir), "reload_interval": 0.1, **decider},
            "strategies": strategies or {},
            "leases": leases or {},
        }
        self.write_config()
        self.audits: list[AuditEvent] = []
        self.decisions: list[Decision] = []

    def write_config(self, text: str | None = None) -> None:
        self.config_path.write_text(text if text is not None else yaml.safe_dump(self.config_doc))

    async def __aenter__(self) -> LiveDecider:
        self.bus = await self.env.bus("decider")
        self.reader = await self.env.bus("api")  # reads pending reasons as the api does
        self._nodes: dict[str, Bus] = {}  # role -> connection: a node's worker and collector
        self.pool = await create_pool(self.env.database_url)  # the test's: puts jobs in as the api would
        self.engine_pool = await create_pool(service_url(self.env.database_url, "decider"))  # the decider's own role
        s = self.bus.subjects
        self._subs = [
            await self.bus.nc.subscribe(s.audit, cb=self._on_audit),
            await self.bus.nc.subscribe(s.decisions, cb=self._on_decision),
        ]
        self.engine = DeciderEngine(
            self.bus, self.engine_pool, load_config(self.config_path, env={}), config_path=self.config_path
        )
        self.stop = asyncio.Event()
        self._beats: list[asyncio.Task] = []
        self.task = asyncio.create_task(self.engine.run(self.stop))
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        for task in self._beats:
            task.cancel()
        for sub in self._subs:
            await sub.unsubscribe()
        await self.engine_pool.close()
        await self.pool.close()
        for bus in [*self._nodes.values(), self.reader, self.bus]:  # the KV buckets go with the env's streams
            await bus.close()

    async def _on_audit(self, msg) -> None:
        self.audits.append(AuditEvent.decode(msg.data))

    async def _on_decision(self, msg) -> None:
        self.decisions.append(Decision.decode(msg.data))

    async def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition"):
        return await until_async(
            predicate, lambda: f"{what}; audit: {[(a.kind, a.reason) for a in self.audits]}", timeout, poll=0.05
        )

    async def wait_for_async(self, predicate, timeout: float = 10.0, what: str = "condition"):
        """As `wait_for`, for a predicate that has to read something (a coroutine function)."""
        return await until_async(predicate, what, timeout, poll=0.05)

    async def pending_reason(self, job_id: str, contains: str, timeout: float = 10.0) -> dict:
        """The decider's pending-reason entry for the job, once it says `contains` (read as the API does)."""
        last = []

        async def says_it():
            last[:] = [await read_pending_reason(self.reader, job_id)]
            return last[0] is not None and contains in last[0].reason and last[0].model_dump()

        return await until_async(
            says_it, lambda: f"a pending reason of {job_id} saying {contains!r}; last: {last}", timeout
        )

    def audited(self, kind: str, contains: str = "") -> list[AuditEvent]:
        return [a for a in self.audits if a.kind == kind and contains in (a.reason or "")]

    async def node(self, name: str, gpus: int = 2, model: str = "H100") -> None:
        """A node that heartbeats every 0.5 s, as a worker does, until the decider stops."""
        devices = [Device(index=i, name=model, memory_total_bytes=80 * 2**30) for i in range(gpus)]
        started = time.time()
        worker = await self._as(f"worker-{name}")

        async def beat() -> None:
            while not self.stop.is_set():
                hb = Heartbeat(node=name, ts=time.time(), started_at=started, devices=devices)
                await worker.nc.publish(worker.subjects.heartbeat(name), hb.encode())
                await asyncio.sleep(0.5)

        self._beats.append(asyncio.create_task(beat()))

    async def metrics(self, name: str, memory: dict[int, float], ts: float | None = None) -> None:
        total = 80 * 2**30
        m = NodeMetrics(
            node=name,
            ts=ts or time.time(),
            gpus=[
                GpuSample(index=i, memory_used_bytes=int(total * f), memory_total_bytes=total)
                for i, f in memory.items()
            ],
        )
        collector = await self._as(f"collector-{name}")
        await collector.nc.publish(collector.subjects.metrics(name), m.encode())

    async def _as(self, role: str) -> Bus:
        if role not in self._nodes:
            self._nodes[role] = await self.env.bus(role)
        return self._nodes[role]

    async def job(
        self,
        job_id: str,
        status: str = "pending",
        gpus: int = 1,
        placement: list | None = None,
        priority: str = "low",
        rank: int = 1,
    ) -> None:
        await self.pool.execute(
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, status,"
            " placement, started_at) VALUES ($1, $1, 'test', 'default', $2, $3, $4, true, $5, $6, $7,"
            " CASE WHEN $6 = 'running' THEN now() END)",
            job_id,
            priority,
            rank,
            gpus,
            {"name": job_id, "gpus": gpus, "train": {}},
            status,
            placement,
        )
        # What the api (a submission) or the executor (a transition) says after writing a job.
        kind = "job.submitted" if status == "pending" else f"job.{status}"
        await self.bus.audit(
            AuditEvent(
                event_id=f"{job_id}:{kind}",
                ts=time.time(),
                source="test",
                kind=kind,
                job_id=job_id,
                reason="set up by the test",
            )
        )
