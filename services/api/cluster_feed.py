"""The latest telemetry of every node, for the dashboard's live cluster view and /v1/metrics, and
the last hour of it (services.api.telemetry_history) for the history charts.

One core NATS subscription per api process to `adc.metrics.*` keeps each node's last sample;
live views wake on `changed()` (like the audit feed) instead of each client polling. Which job
holds each GPU comes from Postgres (the executor's placements), read at most every
HOLDERS_TTL_S however many clients ask.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
from nats.aio.msg import Msg

from services.api.telemetry_history import TelemetryHistory
from shared.contracts.messages import NodeMetrics
from shared.infra.bus import Bus
from shared.infra.clock import Clock, SystemClock
from shared.infra.job_reads import cluster_jobs

log = logging.getLogger(__name__)
HOLDERS_TTL_S = 2.0
CLUSTER_TICK_S = HOLDERS_TTL_S  # how often the cluster's allocated/busy point is taken
STALE_S = 30.0  # a node silent this long is left out of live views


async def gpu_holders(pool: asyncpg.Pool) -> dict[tuple[str, int], tuple[str, str]]:
    """(node, device index) -> (job id, team) for every job holding devices now."""
    return {
        (part["node"], gpu): (job.id, job.team)
        for job in await cluster_jobs.placed_jobs(pool)
        for part in job.placement
        for gpu in part["gpus"]
    }


class ClusterFeed:
    def __init__(self, bus: Bus, pool: asyncpg.Pool, clock: Clock | None = None) -> None:
        self.bus = bus
        self.pool = pool
        self.clock = clock or SystemClock()  # the history's time: when the api received each sample
        self.latest: dict[str, NodeMetrics] = {}
        self._changed = asyncio.Event()
        self._holders: dict[tuple[str, int], tuple[str, str]] = {}
        self._holders_at = float("-inf")
        self._holders_lock = asyncio.Lock()
        self._sub = None
        self._ticking: asyncio.Task | None = None
        self.history = TelemetryHistory()
        self.closing = False

    async def start(self) -> None:
        self._sub = await self.bus.nc.subscribe(self.bus.subjects.metrics("*"), cb=self._on_metrics)
        self._ticking = asyncio.create_task(self._cluster_ticks())

    async def close(self) -> None:
        self.closing = True
        if self._ticking is not None:
            self._ticking.cancel()
            await asyncio.gather(self._ticking, return_exceptions=True)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection is closing anyway
                pass
        self._wake()

    def changed(self) -> asyncio.Event:
        """An event set at the next sample. Take it before reading, so no sample is missed."""
        return self._changed

    def _wake(self) -> None:
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()

    async def _on_metrics(self, msg: Msg) -> None:
        try:
            sample = NodeMetrics.decode(msg.data)
        except ValueError as err:
            log.debug("metrics dropped: %s", err)
            return
        if sample.node != self.bus.subjects.node_of(msg.subject):  # one node's collector speaking for another
            return
        self.latest[sample.node] = sample
        self.history.add(sample, self.clock.now())
        self._wake()

    async def _cluster_ticks(self) -> None:
        while not self.closing:
            try:
                allocated = len(await self.holders())
                self.history.cluster_tick(self.clock.now(), self.current(), allocated)
            except (asyncpg.PostgresError, OSError) as err:  # Postgres away a while: a gap in the chart
                log.debug("cluster history point skipped: %s", err)
            await asyncio.sleep(CLUSTER_TICK_S)

    def current(self) -> list[NodeMetrics]:
        """Each node's last sample, unless it has gone quiet."""
        now = time.time()
        return [m for _, m in sorted(self.latest.items()) if now - m.ts <= STALE_S]

    async def holders(self) -> dict[tuple[str, int], tuple[str, str]]:
        async with self._holders_lock:
            if time.monotonic() - self._holders_at >= HOLDERS_TTL_S:
                self._holders = await gpu_holders(self.pool)
                self._holders_at = time.monotonic()
            return self._holders
