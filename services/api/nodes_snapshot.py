"""GET /v1/nodes?telemetry=true, the cluster view's first read: encoded once per telemetry build
and audience, and served as the same bytes to every caller of that audience until the next build.

A body is the node list (the `nodes` rows, re-read at most every NODE_ROWS_TTL_S for every
audience, each device with its holder as the audience may see it) and the audience's live frame
(services/api/cluster_frames.py), whose nodes' parts are spliced in as they are already encoded.
It is encoded again only when one of them moved: a new frame build (new readings or holders) or a
re-read of the rows. The node list is encoded again only on a re-read or a change of holders, so a
build that only brought new readings costs a join of the frame's parts. After a read, the audience's
body is kept built each second for KEEP_WARM_TICKS seconds, so the next read finds it ready.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from services.api.auth import Principal
from services.api.cluster_frames import MIN_GAP_S, ClusterFrames, audience, holder_label
from shared.infra.clock import Clock

log = logging.getLogger(__name__)
KEEP_WARM_TICKS = 30  # ticks (of MIN_GAP_S) an audience's body is kept built after its last read
NODE_ROWS_TTL_S = 2.0  # as the holders (cluster_feed.HOLDERS_TTL_S): status and devices change rarely
READINGS_MAX_AGE_S = 2.0  # readings come once a second: a frame build this recent serves a read as it is


def node_items(rows: list, labels: dict[str, dict[int, str]], now: float, timeout: float) -> list[dict[str, Any]]:
    """The `nodes` rows as GET /v1/nodes lists them; `labels`: node -> device -> its holder as shown."""
    items = []
    for n in rows:
        age = now - n["last_heartbeat"].timestamp()
        taken = labels.get(n["id"], {})
        items.append(
            {
                "id": n["id"],
                "status": n["status"] if age <= timeout else "unreachable",
                "rack": n["rack"],
                "last_heartbeat_age_s": round(age, 1),
                "devices": [d | {"job_id": taken.get(d["index"])} for d in n["devices"]],
                "free": sum(1 for d in n["devices"] if d["index"] not in taken),
            }
        )
    return items


def labels_for(who: Principal, holders: dict[tuple[str, int], tuple[str, str]]) -> dict[str, dict[int, str]]:
    """node -> device -> what the caller may know of the job holding it."""
    labels: dict[str, dict[int, str]] = {}
    for (node, gpu), (job_id, team) in holders.items():
        labels.setdefault(node, {})[gpu] = holder_label(who, job_id, team)
    return labels


def _device_part(devices_text: str, taken: dict[int, str]) -> str:
    """A node's devices with their holders and its free count: the part of its item that changes
    only when its devices or their holders do (the status and heartbeat age change on their own)."""
    devices = json.loads(devices_text)
    listed = [d | {"job_id": taken.get(d["index"])} for d in devices]
    free = sum(1 for d in devices if d["index"] not in taken)
    return f',"devices":{json.dumps(listed, separators=(",", ":"))},"free":{free}}}'


@dataclass
class AudienceSnapshot:
    """One audience's encoded body (and its gzip), and the node list it was made with."""

    key: tuple = ()  # (frame token, rows version) of `body`
    body: bytes = b""
    gzipped: bytes | None = None  # `body` compressed, once the first caller that accepts it asks
    items: str = "[]"
    items_of: tuple = ()  # (rows version, holders) of `items`
    devices: dict[str, tuple[str, dict[int, str], str]] = field(default_factory=dict)  # node -> (text, taken, part)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def encode_items(self, rows: list, labels: dict[str, dict[int, str]], now: float, timeout: float) -> str:
        """The node list as node_items has it, each node's devices part encoded again only if it moved."""
        parts, devices = [], {}
        for n in rows:
            taken = labels.get(n["id"], {})
            known = self.devices.get(n["id"])
            if known is None or known[0] != n["devices"] or known[1] != taken:
                known = (n["devices"], taken, _device_part(n["devices"], taken))
            devices[n["id"]] = known
            age = now - n["last_heartbeat"].timestamp()
            status = n["status"] if age <= timeout else "unreachable"
            parts.append(
                f'{{"id":{json.dumps(n["id"])},"status":{json.dumps(status)},"rack":{json.dumps(n["rack"])},'
                f'"last_heartbeat_age_s":{round(age, 1)!r}{known[2]}'
            )
        self.devices = devices  # a node gone from the table is forgotten
        return "[" + ",".join(parts) + "]"


class NodesSnapshots:
    def __init__(
        self,
        pool: asyncpg.Pool,
        frames: ClusterFrames,
        clock: Clock,
        node_timeout: float,
        keep_warm_ticks: int = KEEP_WARM_TICKS,
        tick_s: float = MIN_GAP_S,
    ) -> None:
        self.pool = pool
        self.frames = frames
        self.clock = clock
        self.node_timeout = node_timeout
        self.keep_warm_ticks = keep_warm_ticks
        self.tick_s = tick_s
        self._warming: dict[str, tuple[asyncio.Task, list[int]]] = {}  # audience -> (its task, ticks left)
        self._rows: list = []
        self._rows_at = float("-inf")
        self._rows_version = 0
        self._rows_lock = asyncio.Lock()
        self._audiences: dict[str, AudienceSnapshot] = {}

    async def rows(self) -> tuple[int, list]:
        """The `nodes` rows (re-read at most every NODE_ROWS_TTL_S, once for all callers) and which read."""
        async with self._rows_lock:
            if self.clock.monotonic() - self._rows_at >= NODE_ROWS_TTL_S:
                # The devices as text: compared and decoded only where they changed (encode_items).
                self._rows = await self.pool.fetch(
                    "SELECT id, status, rack, last_heartbeat, devices::text AS devices FROM nodes ORDER BY id"
                )
                self._rows_at = self.clock.monotonic()
                self._rows_version += 1
            return self._rows_version, self._rows

    async def body(self, who: Principal, gzipped: bool = False) -> bytes:
        """The encoded answer for the caller's audience (gzip-compressed if asked), built first if the
        frame or the rows moved; kept built a while after (`keep_warm`)."""
        self._keep_warm(who)
        return await self._body(who, gzipped)

    def _keep_warm(self, who: Principal) -> None:
        """A read is often followed by another of its audience (a reload, the next tab, a colleague):
        for keep_warm_ticks ticks after the last read, the body is built each tick in the background,
        so that read is answered at once with readings as fresh, not after a build of every node."""
        if self.keep_warm_ticks <= 0:
            return
        known = self._warming.get(audience(who))
        if known is not None and not known[0].done():
            known[1][0] = self.keep_warm_ticks
            return
        left = [self.keep_warm_ticks]
        self._warming[audience(who)] = (asyncio.create_task(self._warm(who, left)), left)

    async def _warm(self, who: Principal, left: list[int]) -> None:
        while left[0] > 0 and not self.frames.feed.closing:
            await asyncio.sleep(self.tick_s)
            left[0] -= 1
            try:
                await self._body(who, gzipped=True)
            except (asyncpg.PostgresError, OSError) as err:  # Postgres away a while: the next read builds
                log.debug("nodes snapshot not kept warm: %s", err)

    async def close(self) -> None:
        tasks = [task for task, _ in self._warming.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _body(self, who: Principal, gzipped: bool) -> bytes:
        frames = await self.frames.latest(who, max_age_s=READINGS_MAX_AGE_S)
        version, rows = await self.rows()
        snap = self._audiences.setdefault(audience(who), AudienceSnapshot())
        async with snap.lock:
            # Nothing below awaits: the frame's token, holders and parts are of one build.
            key = (frames.token, version)
            if snap.key != key:
                holders = frames.holders or {}
                if snap.items_of != (version, holders):
                    snap.items = snap.encode_items(rows, labels_for(who, holders), self.clock.now(), self.node_timeout)
                    snap.items_of = (version, holders)
                snap.body = (
                    f'{{"items":{snap.items},"frame":{json.dumps(frames.token)},'
                    f'"telemetry":[{",".join(frames.since(0))}]}}'
                ).encode()
                snap.key = key
                snap.gzipped = None
            if not gzipped:
                return snap.body
            if snap.gzipped is None:  # level 1: a twentieth of the bytes for a few ms, once per build
                snap.gzipped = gzip.compress(snap.body, compresslevel=1, mtime=0)
            return snap.gzipped
