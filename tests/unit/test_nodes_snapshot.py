"""The cluster view's first read (services/api/nodes_snapshot.py): one encoding per telemetry build
and audience, served as the same bytes to every caller of it, a new build's readings in the next
read, and each audience's holders as the API lets it see them."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from datetime import UTC, datetime

from services.api.auth import Principal
from services.api.cluster import NodeList
from services.api.cluster_frames import OTHER_TEAM, ClusterFrames
from services.api.nodes_snapshot import NODE_ROWS_TTL_S, READINGS_MAX_AGE_S, NodesSnapshots, labels_for, node_items
from shared.contracts.messages import GpuSample, NodeMetrics
from shared.infra.clock import ManualClock

ALPHA = Principal("t1", "alice", "user", "alpha")
ALPHA_2 = Principal("t2", "amir", "user", "alpha")
BETA = Principal("t3", "bo", "user", "beta")
ADMIN = Principal("t4", "root", "admin", "ops")
HOLDERS = {("n1", 0): ("job-alpha", "alpha"), ("n1", 1): ("job-beta", "beta")}


class Feed:
    """The cluster feed's part the frames read: each node's last sample, the holders, a clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.closing = False
        self.latest: dict[str, NodeMetrics] = {}
        self.holders_now = dict(HOLDERS)

    def report(self, node: str, util: float) -> None:
        gpus = [
            GpuSample(index=i, memory_used_bytes=2**30, memory_total_bytes=8 * 2**30, util_pct=util) for i in (0, 1)
        ]
        self.latest[node] = NodeMetrics(node=node, ts=time.time(), cpu_pct=10.0, gpus=gpus)

    def current(self) -> list[NodeMetrics]:
        return [m for _, m in sorted(self.latest.items())]

    async def holders(self) -> dict:
        return self.holders_now


class Pool:
    """`nodes` rows (the devices as the snapshot selects them: text), counting the reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.nodes = ["n1"]

    async def fetch(self, sql: str) -> list[dict]:
        self.reads += 1
        devices = [{"index": i, "kind": "gpu", "memory_total_bytes": 8 * 2**30} for i in (0, 1)]
        now = datetime.now(UTC)
        return [
            {"id": n, "status": "ready", "rack": "r1", "last_heartbeat": now, "devices": json.dumps(devices)}
            for n in self.nodes
        ]


def snapshots(**warm) -> tuple[NodesSnapshots, Feed, Pool, ManualClock]:
    """Not kept warm (built on reads only), unless `warm` says how."""
    clock = ManualClock(start=time.time())
    feed, pool = Feed(clock), Pool()
    feed.report("n1", 10.0)
    warm = {"keep_warm_ticks": 0} | warm
    return NodesSnapshots(pool, ClusterFrames(feed), clock, node_timeout=60.0, **warm), feed, pool, clock


def util_of(body: bytes, node: str = "n1") -> list[float]:
    return [g["util_pct"] for g in {f["node"]: f for f in json.loads(body)["telemetry"]}[node]["gpus"]]


def test_one_encoding_per_build_served_to_every_caller_and_the_next_build_read_after_it():
    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots()
        first = await snaps.body(ALPHA)
        together = await asyncio.gather(*(snaps.body(ALPHA_2) for _ in range(5)))
        assert all(body is first for body in together)  # the same bytes: encoded once for the audience
        assert pool.reads == 1
        assert util_of(first) == [10.0, 10.0]

        feed.report("n1", 70.0)  # a new tick: served once the build it waits for is due
        assert await snaps.body(ALPHA) is first
        clock.advance(READINGS_MAX_AGE_S)
        fresh = await snaps.body(ALPHA)
        assert fresh is not first and util_of(fresh) == [70.0, 70.0]
        assert json.loads(fresh)["frame"] != json.loads(first)["frame"]
        assert pool.reads == 2  # the rows too are re-read at most every NODE_ROWS_TTL_S, and were due

    asyncio.run(scenario())


def test_a_new_frame_build_alone_is_served_at_once():
    """The rows' re-read and the frame's builds fall apart in time: a build that brought only new
    readings makes the next read anew all the same."""

    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots()
        await snaps.rows()
        clock.advance(1.0)
        await snaps.body(ALPHA)  # the frame built a second after the rows were read
        clock.advance(1.0)
        before = await snaps.body(ALPHA)  # the rows re-read; the frame as it was
        assert pool.reads == 2
        feed.report("n1", 70.0)
        clock.advance(1.0)
        after = await snaps.body(ALPHA)  # the frame due, the rows not
        assert pool.reads == 2
        assert util_of(before) == [10.0, 10.0] and util_of(after) == [70.0, 70.0]

    asyncio.run(scenario())


def test_nodes_rows_re_read_for_all_audiences_at_most_every_ttl():
    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots()
        await snaps.body(ALPHA)
        await snaps.body(BETA)
        await snaps.body(ADMIN)
        assert pool.reads == 1
        pool.nodes.append("n2")
        clock.advance(NODE_ROWS_TTL_S)
        assert [n["id"] for n in json.loads(await snaps.body(BETA))["items"]] == ["n1", "n2"]
        assert pool.reads == 2

    asyncio.run(scenario())


def test_each_audience_sees_only_its_own_teams_job_ids():
    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots()
        bodies = {who.name: await snaps.body(who) for who in (ALPHA, BETA, ADMIN)}
        for who, mine, theirs in (("alice", "job-alpha", "job-beta"), ("bo", "job-beta", "job-alpha")):
            listed = json.loads(bodies[who])
            expected = [mine, OTHER_TEAM] if mine == "job-alpha" else [OTHER_TEAM, mine]
            assert [d["job_id"] for d in listed["items"][0]["devices"]] == expected
            assert [g["job_id"] for g in listed["telemetry"][0]["gpus"]] == expected
            assert theirs.encode() not in bodies[who]
        admin = json.loads(bodies["root"])
        assert [d["job_id"] for d in admin["items"][0]["devices"]] == ["job-alpha", "job-beta"]
        assert [g["job_id"] for g in admin["telemetry"][0]["gpus"]] == ["job-alpha", "job-beta"]
        assert admin["items"][0]["free"] == 0

        # Holders change hands: the next build shows it to each audience (the nodes' list too).
        feed.holders_now = {("n1", 0): ("job-beta", "beta")}
        clock.advance(max(READINGS_MAX_AGE_S, NODE_ROWS_TTL_S))
        alpha = json.loads(await snaps.body(ALPHA))
        assert [d["job_id"] for d in alpha["items"][0]["devices"]] == [OTHER_TEAM, None]
        assert [g["job_id"] for g in alpha["telemetry"][0]["gpus"]] == [OTHER_TEAM, None]
        assert alpha["items"][0]["free"] == 1

    asyncio.run(scenario())


def test_the_body_is_the_node_list_the_plain_read_has_with_the_frame_and_gzip_is_the_same_bytes():
    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots()
        body = await snaps.body(BETA)
        listed = NodeList.model_validate_json(body)  # the documented shape
        rows = [r | {"devices": json.loads(r["devices"])} for r in await pool.fetch("")]
        plain = node_items(rows, labels_for(BETA, HOLDERS), clock.now(), 60.0)
        got = json.loads(body)["items"]
        for item in (*got, *plain):
            assert item.pop("last_heartbeat_age_s") < 1.0
        assert got == plain
        assert listed.frame and [f["node"] for f in listed.telemetry] == ["n1"]
        assert gzip.decompress(await snaps.body(BETA, gzipped=True)) == body

    asyncio.run(scenario())


def test_after_a_read_the_next_builds_happen_without_one_then_stop():
    async def scenario() -> None:
        snaps, feed, pool, clock = snapshots(keep_warm_ticks=3, tick_s=0.02)
        first = await snaps.body(ADMIN)
        assert pool.reads == 1
        feed.report("n1", 70.0)
        clock.advance(max(READINGS_MAX_AGE_S, NODE_ROWS_TTL_S))
        await asyncio.sleep(0.1)  # the ticks kept warm: built, with nobody reading
        assert pool.reads == 2
        warm = await snaps.body(ADMIN)  # answered from that build, the new readings in it
        assert warm is not first and util_of(warm) == [70.0, 70.0] and pool.reads == 2
        await asyncio.sleep(0.2)  # the ticks after this read run out
        clock.advance(max(READINGS_MAX_AGE_S, NODE_ROWS_TTL_S))
        await asyncio.sleep(0.2)
        assert pool.reads == 2  # nothing built any more until the next read
        await snaps.close()

    asyncio.run(scenario())
