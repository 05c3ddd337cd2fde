"""The load the decider benches play through the real NATS: 1,000 collectors (a NodeMetrics each
second per node, 8 GPUs, spread over the second as independent collectors would be), 1,000
workers' heartbeats every 2 s, and optionally the trainers of the running jobs (a progress event
every `progress_every` s each). Planned GPUs go over the OOM threshold for a while; the time of
every such sample is reported back, so a bench can tell which sample satisfied a window.

One publisher for bench/decider_throughput.py and bench/scale.py; subjects from shared.contracts.subjects.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time

import asyncpg

from shared.contracts.messages import Device, GpuSample, Heartbeat, JobEvent, NodeMetrics
from shared.contracts.subjects import Subjects
from shared.infra.db import migrate

NATS_URL = os.environ.get("ADC_TEST_NATS_URL", "nats://127.0.0.1:4222")
PG_ADMIN_URL = os.environ.get("ADC_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
GPUS = 8
TOTAL = 80 * 2**30
IDLE_NODES = 20  # left free as migration targets

# (node, gpu, hot from, hot until): seconds after the publisher's t0
HotPlan = list[tuple[int, int, float, float]]


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def job_id(node: int, k: int) -> str:
    """The k-th 2-GPU job of a busy node (devices 2k and 2k+1)."""
    return f"j{node:04d}{k}"


def running_jobs(nodes: int) -> list[tuple[int, int]]:
    return [(i, k) for i in range(IDLE_NODES, nodes) for k in range(GPUS // 2)]


def metrics(i: int, ts: float, hot: set[int]) -> NodeMetrics:
    busy = i >= IDLE_NODES
    gpus = [
        GpuSample(
            index=g,
            memory_total_bytes=TOTAL,
            util_pct=80.0 if busy else 0.0,
            memory_used_bytes=int(TOTAL * (0.95 if g in hot else 0.5 if busy else 0.01)),
        )
        for g in range(GPUS)
    ]
    return NodeMetrics(node=node_name(i), ts=ts, gpus=gpus, cpu_pct=40.0, mem_used_bytes=10**11, mem_total_bytes=10**12)


def publish(
    prefix: str, nodes: int, total_s: float, plan: HotPlan, t0: float, hot_samples, progress_every: float | None = None
) -> None:
    """Run in a process of its own: play the load from `t0` for `total_s` seconds; then put the
    send time of every hot sample into `hot_samples` ((node, gpu) -> [ts])."""
    import nats

    subjects = Subjects(prefix)

    async def main() -> None:
        nc = await nats.connect(NATS_URL, pending_size=256 * 2**20)
        started = time.time()
        beats = {
            i: Heartbeat(
                node=node_name(i),
                ts=0.0,
                started_at=started,
                rack=f"rack-{i // 40}",
                devices=[Device(index=g, name="H100", memory_total_bytes=TOTAL, nvlink_domain=0) for g in range(GPUS)],
            )
            for i in range(nodes)
        }
        hot_by_node: dict[int, list[tuple[int, float, float]]] = {}
        for n, g, begin, end in plan:
            hot_by_node.setdefault(n, []).append((g, begin, end))
        running = running_jobs(nodes)
        sent: dict[tuple[int, int], list[float]] = {}
        second = 0
        while time.time() < t0 + total_s:
            tick = t0 + second
            await asyncio.sleep(max(0.0, tick - time.time()))
            for batch in range(10):  # spread over the second, as independent collectors would be
                for i in range(batch, nodes, 10):
                    now = time.time()
                    hot = {g for g, begin, end in hot_by_node.get(i, ()) if t0 + begin <= now < t0 + end}
                    for g in hot:
                        sent.setdefault((i, g), []).append(now)
                    await nc.publish(subjects.metrics(node_name(i)), metrics(i, now, hot).encode())
                    if second % 2 == 0:
                        beats[i].ts = now
                        await nc.publish(subjects.heartbeat(node_name(i)), beats[i].encode())
                if progress_every:  # each running job's trainer reports every `progress_every` s, spread out too
                    share = len(running) / (10 * progress_every)
                    first = int(((second * 10 + batch) * share) % len(running))
                    for n, k in running[first : first + int(share)]:
                        e = JobEvent(
                            job_id=job_id(n, k),
                            kind="progress",
                            ts=time.time(),
                            attempt=1,
                            node=node_name(n),
                            data={
                                "step": second,
                                "max_steps": 100_000,
                                "step_time_s": 0.9,
                                "peak_memory_bytes": TOTAL // 2,
                            },
                        )
                        await nc.publish(subjects.job_events(e.job_id, e.node), e.encode())
                await asyncio.sleep(max(0.0, tick + (batch + 1) / 10 - time.time()))
            second += 1
        await nc.flush()
        await nc.close()
        hot_samples.update(sent)

    asyncio.run(main())


def satisfying_sample(sent: list[float], above_since: float, for_s: float) -> float | None:
    """The sample that satisfied the window, as the decider judges it: the spell began with the sent
    sample the evidence names (rounded there to the millisecond), and the window is satisfied by the
    first sample at least for_s after it, in the same float arithmetic."""
    began = [t for t in sent if abs(t - above_since) < 2e-3]
    if not began:
        return None
    return next((t for t in sent if t - began[0] >= for_s), None)


async def new_database(name: str) -> tuple[str, str, str]:
    """A fresh migrated database and bus prefix for one bench run: (database, prefix, url)."""
    tag = secrets.token_hex(4)
    db, prefix = f"adc_{name}_{tag}", f"{name}{tag}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{db}"')
    await admin.close()
    url = PG_ADMIN_URL.rpartition("/")[0] + f"/{db}"
    await migrate(url)
    return db, prefix, url


async def insert_running_jobs(pool, nodes: int, spec: dict | None = None) -> int:
    """4 running 2-GPU jobs on every busy node, as `job_id` names them; returns how many."""
    rows = [
        (job_id(i, k), f"job-{i}-{k}", [{"node": node_name(i), "gpus": [2 * k, 2 * k + 1]}], spec or {})
        for i, k in running_jobs(nodes)
    ]
    await pool.executemany(
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, status,"
        " placement, started_at, attempt) VALUES ($1, $2, 'bench', 'default', 'low', 1, 2, true, $4, 'running',"
        " $3, now(), 1)",
        rows,
    )
    return len(rows)
