"""The decider at scale: 1,000 nodes x 8 GPUs at 1 Hz, heartbeats and trainers' progress through
the real NATS, 4,000 jobs in the real Postgres, for 10 minutes (by default).

The decider runs as in production (`python -m services.decider`, its own process, pinned to one
core where the machine allows). A publisher process plays 1,000 collectors (metrics each second,
spread over the second), 1,000 workers (heartbeats every 2 s) and the trainers of the running
jobs (a progress event every `--progress-every` s each). Every `--hot-every` s one more GPU's
memory goes over the OOM threshold for a while. Prints:
- reaction: from the sample that satisfied the GPU's window (the first at least `for_s` after
  its spell began) arriving on the bus, to the decision arriving on the subject the executor
  consumes; p50, p99 and max; split at the decision's `ts` (when the pass that made it began, on
  the decider's clock: the same machine's) into the wait for the pass and the pass itself;
- the decider's CPU (share of one core) and RSS, sampled every 30 s: at the start, at the end and
  the largest, so a leak shows as growth;
- how many decisions were missing (a hot GPU that got none).

Usage: .venv/bin/python bench/scale.py [--minutes 10] [--nodes 1000] [--for-s 5] (or --seconds N)
Needs NATS (JetStream) at 127.0.0.1:4222 and Postgres at 127.0.0.1:5432 (as the tests do).
The run's rate limit on disruptions is raised (`decider.max_disruptions_per_minute`), since every
hot GPU is a migration: the bench measures reaction, not the limiter.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import asyncpg  # noqa: E402

from bench.telemetry_load import (  # noqa: E402
    GPUS,
    IDLE_NODES,
    NATS_URL,
    PG_ADMIN_URL,
    insert_running_jobs,
    job_id,
    new_database,
    publish,
    satisfying_sample,
)
from shared.contracts.messages import AuditEvent, Decision  # noqa: E402
from shared.infra.bus import Bus  # noqa: E402
from shared.infra.bus_auth import CredentialStore  # noqa: E402
from shared.infra.db import create_pool  # noqa: E402
from shared.infra.pending_reasons import bucket_name  # noqa: E402

PENDING_JOBS = 80  # 16-GPU single-node jobs: they wait, and admission looks at them every pass
WARMUP_S = 15.0
RSS_EVERY_S = 30.0


def hot_plan(nodes: int, seconds: float, every: float, for_s: float) -> list[tuple[int, int, float, float]]:
    """(node, gpu, hot from, hot until) offsets from the start: a different job each time."""
    busy = list(range(IDLE_NODES, nodes))
    plan, k, at = [], 0, WARMUP_S - for_s + 2.0
    while at + for_s < WARMUP_S + seconds - 2:
        node = busy[(k * 37) % len(busy)]
        plan.append((node, 2 * ((k // len(busy)) % 4), at, at + for_s + 4.0))
        k += 1
        at += every + 0.37 * (k % 3)  # the windows end at different phases of the pass interval
    return plan


async def setup(nodes: int) -> tuple[str, str, str]:
    db, prefix, url = await new_database("scale")
    pool = await create_pool(url)
    await insert_running_jobs(pool, nodes, {"train": {"max_steps": 100_000}})
    await pool.executemany(
        "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec)"
        " VALUES ($1, $1, 'bench', 'default', 'low', 1, 16, true, '{}')",
        [(f"wait{i:03d}",) for i in range(PENDING_JOBS)],
    )
    await pool.close()
    return db, prefix, url


async def teardown(db: str, prefix: str) -> None:
    bus = await Bus.connect(NATS_URL, prefix, "scale-cleanup")
    for name in bus.subjects.streams():
        try:
            await bus.js.delete_stream(name)
        except Exception:
            pass
    for bucket in (bucket_name(bus), bus.subjects.leader_bucket):
        try:
            await bus.js.delete_key_value(bucket)
        except Exception:
            pass
    await bus.close()
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await admin.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def publish_apart(decider_core: int, *args) -> None:
    """The publisher plays 1,000 other machines: its own session (autogroup), off the decider's core where there are others."""
    os.setsid()
    others = set(range(os.cpu_count() or 1)) - {decider_core}
    if others and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, others)
    publish(*args)


async def run(args) -> None:
    db, prefix, url = await setup(args.nodes)
    home = Path(tempfile.mkdtemp(prefix="adc-scale-"))
    config = home / "adc_config.yaml"
    keys = CredentialStore(home / "nats")
    keys.ensure(["decider"])  # every service authenticates (on this open bench server the key is not checked)
    config.write_text(
        yaml.safe_dump(
            {
                "controller": {"interval": args.interval},
                "bus": {"url": NATS_URL, "prefix": prefix, "credentials_dir": str(keys.directory)},
                "database": {"url": url},
                "decider": {"max_disruptions_per_minute": 1000},
                "strategies": {"oom_protection": {"for_s": args.for_s}},
                "bandit": {"mode": args.bandit},
            }
        )
    )
    bus = await Bus.connect(NATS_URL, prefix, "scale-observer")
    await bus.ensure_streams()  # as `adc up` does before it starts the services
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL", "ADC_BUS_PREFIX")}
    log = open(home / "decider.log", "w")
    # Its own session, as a deployed service has its own cgroup: with the kernel's autogroup scheduling
    # (on here) a process shares CPU with its session as one group, so in the bench's session the
    # decider would share one group's share with the 1,000 simulated machines.
    decider = subprocess.Popen(
        [sys.executable, "-m", "services.decider", "--config", str(config), "--log-level", "WARNING"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proc = psutil.Process(decider.pid)
    try:
        proc.cpu_affinity([args.core])
        pinned = f"pinned to core {args.core}"
    except (AttributeError, ValueError, psutil.Error):
        pinned = "not pinned"
    received: dict[str, tuple[float, Decision]] = {}

    async def on_decision(msg) -> None:
        d = Decision.decode(msg.data)
        received.setdefault(d.action.job_id, (time.time(), d))

    sub = await bus.nc.subscribe(bus.subjects.decisions, cb=on_decision)
    # What the bandit chose, from its audit events: by decision point, and how many it acted on
    # another arm than the rules' (exploring or confident), so a run shows the bandit was in the loop.
    chosen: dict[str, list[int]] = {}

    async def on_audit(msg) -> None:
        event = AuditEvent.decode(msg.data)
        if event.kind == "bandit.decision":
            counts = chosen.setdefault(event.data.get("point", "?"), [0, 0])
            counts[0] += 1
            counts[1] += bool(event.data.get("acted") and event.data.get("taken"))

    audit_sub = await bus.nc.subscribe(bus.subjects.audit, cb=on_audit)
    plan = hot_plan(args.nodes, args.seconds, args.hot_every, args.for_s)
    manager = multiprocessing.Manager()
    hot_samples = manager.dict()
    t0 = time.time() + 2.0
    pub = multiprocessing.Process(
        target=publish_apart,
        args=(args.core, prefix, args.nodes, WARMUP_S + args.seconds, plan, t0, hot_samples, args.progress_every),
    )
    pub.start()
    try:
        await asyncio.sleep(t0 + WARMUP_S - time.time())
        if decider.poll() is not None or not pub.is_alive():
            raise SystemExit(
                f"the decider ({decider.returncode}) or the publisher ({pub.exitcode}) exited; "
                f"see {home / 'decider.log'}"
            )
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.time()
        rss = [(0.0, proc.memory_info().rss)]
        while time.time() < t0 + WARMUP_S + args.seconds:
            await asyncio.sleep(min(RSS_EVERY_S, t0 + WARMUP_S + args.seconds - time.time()))
            rss.append((time.time() - wall0, proc.memory_info().rss))
        cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, time.time() - wall0
        await asyncio.sleep(2.0)  # the last decisions
        pub.join(timeout=60)
        if pub.exitcode != 0:
            raise SystemExit(f"the publisher failed (exit {pub.exitcode}); nothing measured")
        samples = dict(hot_samples)
    finally:
        await sub.unsubscribe()
        await audit_sub.unsubscribe()
        await bus.close()
        decider.send_signal(signal.SIGTERM)
        try:
            decider.wait(timeout=20)
        except subprocess.TimeoutExpired:
            decider.kill()
        if pub.is_alive():
            pub.terminate()
        manager.shutdown()
        await teardown(db, prefix)

    reactions, waits, passes, missing = [], [], [], 0
    for n, g, begin, _ in plan:
        got = received.get(job_id(n, g // 2))
        if got is None:
            missing += 1
            continue
        at, decision = got
        spells = decision.action.evidence.get("hot_gpus") or [{}]
        satisfied = satisfying_sample(samples.get((n, g), []), spells[0].get("above_since", t0 + begin), args.for_s)
        if satisfied is not None:
            reactions.append(1000 * (at - satisfied))
            waits.append(1000 * (decision.ts - satisfied))  # the decision's ts: when its pass began
            passes.append(1000 * (at - decision.ts))
    mib = 2**20
    print(
        f"scale: {args.nodes:,} nodes x {GPUS} GPUs at 1 Hz, heartbeats every 2 s, "
        f"{(args.nodes - IDLE_NODES) * GPUS // 2 + PENDING_JOBS:,} jobs ({PENDING_JOBS} waiting), progress every "
        f"{args.progress_every:g} s per running job; {wall:.0f} s measured after {WARMUP_S:g} s warm-up; "
        f"decider {pinned}, pass every {args.interval:g} s and on events; bandit {args.bandit}"
    )
    if reactions:
        print(
            f"  reaction, window satisfied -> decision at the executor: p50 {percentile(reactions, 0.5):.0f} ms, "
            f"p99 {percentile(reactions, 0.99):.0f} ms, max {max(reactions):.0f} ms, "
            f"mean {statistics.mean(reactions):.0f} ms over {len(reactions)} hot GPUs; missing decisions: {missing}"
        )
        for what, part in (
            ("sample sent -> its urgent pass begins (bus, ingest, wake)", waits),
            ("pass begins -> decision at the executor (pass, audit, publish)", passes),
        ):
            print(
                f"    {what}: p50 {percentile(part, 0.5):.0f} ms, p99 {percentile(part, 0.99):.0f} ms, "
                f"max {max(part):.0f} ms"
            )
    else:
        print(f"  no reactions measured; missing decisions: {missing}; see {home / 'decider.log'}")
    if args.bandit != "off":
        points = ", ".join(
            f"{point} {n:,} ({other:,} on another arm than the rules')" for point, (n, other) in sorted(chosen.items())
        )
        print(f"  bandit decisions by point: {points or 'none'}")
    print(f"  decider CPU: {100 * cpu / wall:.0f} % of one core")
    print(
        f"  decider RSS: start {rss[0][1] / mib:.0f} MiB, end {rss[-1][1] / mib:.0f} MiB, "
        f"max {max(r for _, r in rss) / mib:.0f} MiB; every {RSS_EVERY_S:g} s: "
        + ", ".join(f"{r / mib:.0f}" for _, r in rss)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10, help="measured minutes (the issue's figure: 10)")
    parser.add_argument("--seconds", type=float, help="measured seconds, instead of --minutes")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--for-s", type=float, default=5.0, help="OOM window (the seed's is 30 s)")
    parser.add_argument("--interval", type=float, default=5.0, help="controller.interval (the seed's is 5 s)")
    parser.add_argument("--hot-every", type=float, default=4.0, help="seconds between GPUs going over the threshold")
    parser.add_argument(
        "--progress-every", type=float, default=10.0, help="seconds between a trainer's progress events"
    )
    parser.add_argument("--core", type=int, default=0, help="the core the decider is pinned to")
    parser.add_argument(
        "--bandit", choices=["off", "shadow", "active"], default="off", help="the decider's bandit.mode (default off)"
    )
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 60 * args.minutes
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
