"""The cluster view's data: GET /v1/nodes with each node's latest readings, and the live stream
that sends, after that frame, only the nodes whose readings changed."""

from __future__ import annotations

import json
import time

from shared.contracts.messages import GpuSample, NodeMetrics
from tests.waits import until

NODES = ("view-a", "view-b")


def sample(node: str, util: float) -> NodeMetrics:
    gpus = [GpuSample(index=0, memory_used_bytes=2**30, memory_total_bytes=8 * 2**30, util_pct=util)]
    return NodeMetrics(node=node, ts=time.time(), cpu_pct=10.0, gpus=gpus)


def report(api, node: str, util: float) -> None:
    collector = api.server.as_role(f"collector-{node}")
    api.server.run(collector.nc.publish(collector.subjects.metrics(node), sample(node, util).encode()))


def frames(api, token: str, query: str, count: int, between=None) -> list[list[dict]]:
    """The first `count` `nodes` frames of the stream; `between(i)` runs after frame i."""
    got: list[list[dict]] = []
    with api.client(token) as http, http.stream("GET", f"/v1/nodes/stream{query}", timeout=30) as r:
        assert r.status_code == 200, r.read()
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "nodes":
                got.append(json.loads(line[6:]))
                if len(got) == count:
                    break
                if between:
                    between(len(got) - 1)
    return got


def test_nodes_with_telemetry_then_only_what_changed(api):
    api.server.sql(
        "INSERT INTO nodes (id, devices) SELECT n, $2 FROM unnest($1::text[]) n ON CONFLICT DO NOTHING",
        list(NODES),
        [{"index": 0, "kind": "gpu", "memory_total_bytes": 8 * 2**30}],
    )
    for node in NODES:
        report(api, node, 10.0)

    def listed_with_both() -> dict | None:
        with api.client("user") as http:
            listed = http.get("/v1/nodes", params={"telemetry": "true"}).json()
        return listed if set(NODES) <= {f["node"] for f in listed["telemetry"]} else None

    listed = until(listed_with_both, "both nodes' readings in the api's telemetry", timeout=30)
    with api.client("user") as http:
        plain = http.get("/v1/nodes").json()
    assert "telemetry" not in plain and {n["id"] for n in plain["items"]} >= set(NODES)
    telemetry = {f["node"]: f for f in listed["telemetry"]}
    assert set(NODES) <= telemetry.keys() and telemetry["view-a"]["gpus"][0]["util_pct"] == 10.0
    assert listed["frame"]

    # After the frame the page holds: only view-a, whose readings moved; view-b's held still.
    changed = frames(
        api,
        "user",
        f"?delta=true&since={listed['frame']}",
        3,
        between=lambda i: [report(api, node, 10.0 + (node == "view-a") * (i + 1) * 20) for node in NODES],
    )
    seen = [{f["node"]: f["gpus"][0]["util_pct"] for f in frame if f["node"] in NODES} for frame in changed]
    assert {"view-a": 30.0} in seen and {"view-a": 50.0} in seen, seen
    assert not any("view-b" in s for s in seen), seen

    # Without `since`, the first frame has every node; without `delta`, every frame has.
    first = frames(api, "user", "?delta=true", 1)[0]
    assert set(NODES) <= {f["node"] for f in first}
    full = frames(api, "user", "", 2, between=lambda i: report(api, "view-a", 90.0))
    assert all(set(NODES) <= {f["node"] for f in frame} for frame in full), full
    # A token of another process (or a made-up one) starts from everything too.
    forged = frames(api, "user", "?delta=true&since=0000.99", 1)[0]
    assert set(NODES) <= {f["node"] for f in forged}


def test_a_user_sees_another_teams_device_only_as_taken(api):
    mine, theirs = api.submit("user", name="mine"), api.submit("other_user", name="theirs")
    api.server.sql(
        "INSERT INTO nodes (id, devices) VALUES ('view-c', $1) ON CONFLICT DO NOTHING",
        [{"index": i, "kind": "gpu", "memory_total_bytes": 8 * 2**30} for i in range(2)],
    )
    for job, gpu in ((mine, 0), (theirs, 1)):
        api.server.sql(
            "UPDATE jobs SET status = 'running', placement = $2 WHERE id = $1",
            job["id"],
            [{"node": "view-c", "gpus": [gpu]}],
        )
    collector = api.server.as_role("collector-view-c")
    two = NodeMetrics(
        node="view-c",
        ts=time.time(),
        gpus=[GpuSample(index=i, memory_used_bytes=0, memory_total_bytes=8 * 2**30, util_pct=5.0) for i in range(2)],
    )
    api.server.run(collector.nc.publish(collector.subjects.metrics("view-c"), two.encode()))
    seen: dict = {}

    def holders_as_the_user_sees_them() -> bool:  # the api re-reads the holders every couple of seconds
        with api.client("user") as http:
            seen.update(http.get("/v1/nodes", params={"telemetry": "true"}).json())
        view = {f["node"]: f for f in seen["telemetry"]}.get("view-c")
        return view is not None and [g["job_id"] for g in view["gpus"]] == [mine["id"], "(another team)"]

    try:
        until(
            holders_as_the_user_sees_them,
            lambda: f"view-c held by {mine['id']} and another team: {seen}",
            timeout=30,
            poll=0.5,
        )
        with api.client("admin") as http:
            admin = {f["node"]: f for f in http.get("/v1/nodes", params={"telemetry": "true"}).json()["telemetry"]}
        assert [g["job_id"] for g in admin["view-c"]["gpus"]] == [mine["id"], theirs["id"]]
        assert theirs["id"] not in json.dumps(seen)
    finally:
        api.server.sql(
            "UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = ANY($1)", [mine["id"], theirs["id"]]
        )
