"""`adc top` and `adc metrics JOB -f`: live terminal views over the api's event streams."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from shared.contracts.messages import GpuSample, JobEvent, NodeMetrics
from tests.conftest import REPO_ROOT
from tests.waits import until


def test_adc_top_shows_nodes_gpus_and_their_jobs(api):
    job = api.submit("user", name="topped")
    api.server.sql(
        "INSERT INTO nodes (id, devices) VALUES ('top-node', $1)",
        [{"index": i, "kind": "gpu", "memory_total_bytes": 8 * 2**30} for i in range(2)],
    )
    api.server.sql(
        "UPDATE jobs SET status = 'running', placement = $2, progress = $3 WHERE id = $1",
        job["id"],
        [{"node": "top-node", "gpus": [0]}],
        {"step": 3, "max_steps": 10, "loss": 2.25},
    )
    sample = NodeMetrics(
        node="top-node",
        ts=time.time(),
        cpu_pct=12.0,
        gpus=[
            GpuSample(
                index=i, memory_used_bytes=(6 - 5 * i) * 2**30, memory_total_bytes=8 * 2**30, util_pct=50.0 * (1 - i)
            )
            for i in range(2)
        ],
    )
    collector = api.server.as_role("collector-top-node")
    api.server.run(collector.nc.publish(collector.subjects.metrics("top-node"), sample.encode()))

    def sample_taken_in() -> bool:
        with api.client("user") as http:
            listed = http.get("/v1/nodes", params={"telemetry": "true"}).json()
        return any(frame["node"] == "top-node" for frame in listed["telemetry"])

    until(sample_taken_in, "top-node's sample in the api's telemetry", timeout=30)

    seen = api.cli("top", "--once", token="user")
    assert seen.returncode == 0, seen.stderr
    out = seen.stdout
    assert "top-node  ready  cpu 12%" in out
    assert "gpu 0  mem ████████·· " in out and "75%  util █████····· " in out and job["id"] in out
    assert "gpu 1  mem █·········  12%" in out
    assert "topped" in out and "3/10" in out and "2.25" in out
    api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job["id"])


def test_adc_metrics_follow_draws_each_new_point_until_the_job_ends(api):
    job = api.submit("user", name="followed")
    env = os.environ | {"ADC_API_URL": api.url, "ADC_TOKEN": api.tokens.user, "ADC_HOME": "/nonexistent"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "metrics", job["id"], "-f"],
        env=env,
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    api.server.sql(
        "UPDATE jobs SET attempt = 1, placement = $2, status = 'running' WHERE id = $1",
        job["id"],
        [{"node": "n1", "gpus": [0]}],
    )
    bus = api.server.as_role("worker-n1")
    subject = bus.subjects.job_events(job["id"], "n1")
    published: list[int] = []

    def drawn_three() -> bool:
        """One more step published as a worker does; true once the follower has drawn three of them."""
        if sum(line.startswith("step ") for line in lines) >= 3:
            return True
        published.append(len(published) + 1)
        step = published[-1]
        event = JobEvent(
            job_id=job["id"],
            kind="progress",
            ts=time.time(),
            attempt=1,
            node="n1",
            data={"step": step, "max_steps": 50, "loss": 3.0 / step, "tokens_per_s": 100.0},
        )
        api.server.run(bus.publish_js(subject, event, event.event_id))
        return False

    try:
        until(drawn_three, lambda: f"three steps drawn by the follower: {lines}", timeout=30, poll=0.3)
        api.server.sql("UPDATE jobs SET status = 'succeeded' WHERE id = $1", job["id"])
        done = JobEvent(
            job_id=job["id"], kind="exited", ts=time.time(), attempt=1, node="n1", data={"outcome": "succeeded"}
        )
        api.server.run(bus.publish_js(subject, done, done.event_id))
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(5)
    drawn = [line for line in lines if line.startswith("step ")]
    assert len(drawn) >= 3, lines
    assert any(f"/50  loss {round(3.0 / n, 4)}" in line for line in drawn for n in published)
    assert lines[-1].startswith(f"{job['id']} succeeded; loss "), lines
