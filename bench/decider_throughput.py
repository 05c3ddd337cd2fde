"""Decider throughput at 1,000 nodes x 8 GPUs reporting at 1 Hz.

Prints:
0. passes: the pass alone, in-process on the real Postgres (NATS for its output), alternating
   between every live job re-read from Postgres (as before the job view was kept from the bus)
   and the kept view, with one second of telemetry ingested between passes, untimed: the two
   pass times side by side without the noise of concurrent ingest on a shared machine;
1. ingest: NodeMetrics decoded and written into the metric windows per second, in-process
   (decode + ring writes + watch checks), and what 1,000 nodes at 1 Hz cost of one core;
2. live, on the real NATS and Postgres: a separate publisher process plays 1,000 collectors
   (8 GPUs each, 1 Hz) and 1,000 workers' heartbeats; the decider runs as in production
   (4,000 running jobs in Postgres, seed interval), in alternating blocks with every pass
   re-reading every live job from Postgres (as it did before the job view was kept from the bus)
   and with the kept view, on the same load in the same run. It prints both pass times side by
   side, snapshots ingested per second, the decider's CPU share, and for GPUs pushed over the OOM
   threshold in each mode the latency from the sample that satisfied the window to the decision.

With `--profile N` the kept view's passes run under cProfile and the N costliest functions are
printed (cumulative; the rules run in their own thread, timed per rule in "rules (last pass)").

Usage: .venv/bin/python bench/decider_throughput.py [--nodes 1000] [--seconds 20] [--for-s 5] [--profile 30]
Needs NATS (JetStream) at 127.0.0.1:4222 and Postgres at 127.0.0.1:5432 (as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import logging
import math
import multiprocessing
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg  # noqa: E402

from bench.telemetry_load import (  # noqa: E402
    GPUS,
    IDLE_NODES,
    NATS_URL,
    PG_ADMIN_URL,
    TOTAL,
    insert_running_jobs,
    job_id,
    metrics,
    new_database,
    node_name,
    publish,
    satisfying_sample,
)
from services.decider.cluster_view import ClusterView, Watch  # noqa: E402
from services.decider.engine import DeciderEngine  # noqa: E402
from shared.contracts.messages import Decision, Device, Heartbeat, NodeMetrics  # noqa: E402
from shared.infra.bus import Bus  # noqa: E402
from shared.infra.config import parse_config  # noqa: E402
from shared.infra.db import create_pool  # noqa: E402
from shared.infra.pending_reasons import bucket_name  # noqa: E402

BLOCK_S = 6.0  # live: the two ways of reading jobs alternate in blocks this long


# --- 1. in-process ingest ------------------------------------------------------------------


def bench_ingest(nodes: int, rounds: int) -> float:
    view = ClusterView(window_s=120)
    view.set_watches([Watch("gpu_memory", 0.92, 30, 0.90, label="oom_protection")])
    payloads = [metrics(i, 0.0, set()).encode() for i in range(nodes)]
    start = time.process_time()
    for r in range(rounds):
        for data in payloads:
            m = NodeMetrics.decode(data)
            m.ts = 1000.0 + r
            view.ingest(m)
    cpu = time.process_time() - start
    rate = nodes * rounds / cpu
    view.freeze(1000.0 + rounds)  # the first builds the row layout, which later ones share
    freeze = time.perf_counter()
    view.freeze(1000.0 + rounds)
    freeze_ms = (time.perf_counter() - freeze) * 1000
    print(
        f"ingest (in-process): {rate:,.0f} node snapshots/s ({1e6 / rate:.1f} us each: decode + windows + watch);"
        f" {nodes:,} nodes x {GPUS} GPUs at 1 Hz = {100 * nodes / rate:.1f} % of one core;"
        f" freezing the windows for a pass: {freeze_ms:.1f} ms"
    )
    return rate


# --- 2. live -------------------------------------------------------------------------------


class TimedEngine(DeciderEngine):
    """The decider as in production; each pass timed and labelled with how its jobs were read."""

    def __init__(self, *args, profile: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timed: list[tuple[str, float]] = []
        self.profiler = cProfile.Profile() if profile else None
        self.measuring = False

    async def tick(self, only=None):
        mode = "full" if self.source.full_reads else "incremental"
        if only is not None:  # the rules watching a window just satisfied, at once (reported apart)
            mode += " urgent"
        profiled = self.profiler is not None and self.measuring and mode == "incremental"
        started = time.perf_counter()
        if profiled:
            self.profiler.enable()
        try:
            return await super().tick(only)
        finally:
            if profiled:
                self.profiler.disable()
            self.timed.append((mode, (time.perf_counter() - started) * 1000))


def reaction_ms(received: dict, hot_samples: dict, hot: list[tuple[int, int, float]], for_s: float) -> list[float]:
    """Per hot GPU: from the sample that satisfied the window (the first at least for_s after the
    spell began) arriving on the bus to the decision arriving where the executor reads it."""
    out = []
    for n, g, _, _ in hot:
        job = job_id(n, g // 2)
        if job not in received:
            print(f"  {node_name(n)}:{g}: no decision")
            continue
        at, decision = received[job]
        since = decision.action.evidence["hot_gpus"][0]["above_since"]
        satisfied = satisfying_sample(hot_samples.get((n, g), []), since, for_s)
        if satisfied is not None:
            out.append(1000 * (at - satisfied))
    return out


def _stats(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(values):.1f} ms, p90 {p90:.1f} ms, max {max(values):.1f} ms ({len(values)})"


async def bench_passes(nodes: int, passes: int, window_s: float = 120.0) -> None:
    """The pass alone, side by side: one engine on the real Postgres and NATS, its view filled with
    `window_s` of 1 Hz samples of every node, then passes alternating between every live job re-read
    from Postgres and the view kept from the bus; between two passes one second of samples and
    heartbeats is ingested (not timed), as the live decider would between passes."""
    db, prefix, url = await new_database("passes")
    pool = await create_pool(url)
    bus = await Bus.connect(NATS_URL, prefix, "bench-passes")
    await bus.ensure_streams()
    try:
        jobs = await insert_running_jobs(pool, nodes)
        config = parse_config(
            {"bus": {"url": NATS_URL, "prefix": prefix}, "database": {"url": url}, "leases": {"enabled": False}}, env={}
        )
        engine = DeciderEngine(bus, pool, config, config_path=Path("/nonexistent/adc_config.yaml"))
        await engine.reload()
        payloads = [metrics(i, 0.0, set()).encode() for i in range(nodes)]
        beats = [
            Heartbeat(
                node=node_name(i),
                ts=0.0,
                started_at=0.0,
                rack=f"rack-{i // 40}",
                devices=[Device(index=g, name="H100", memory_total_bytes=TOTAL) for g in range(GPUS)],
            )
            for i in range(nodes)
        ]
        t = time.time() - window_s

        def second(ts: float) -> None:  # one second of the cluster: every node's sample, half the heartbeats
            for i, data in enumerate(payloads):
                m = NodeMetrics.decode(data)
                m.ts = ts
                engine.view.ingest(m)
                if (i + int(ts)) % 2 == 0:
                    beats[i].ts = ts
                    engine.view.heartbeat(beats[i], ts)

        for k in range(int(window_s)):
            second(t + k)
        now = t + window_s
        engine.clock.now = lambda: now
        for _ in range(2):
            await engine.tick()
        gc.collect()
        gc.freeze()  # as the live decider does after its first pass
        timed: dict[str, list[float]] = {"full": [], "incremental": []}
        for k in range(2 * passes):
            now += 1.0
            second(now)
            mode = "full" if k % 2 == 0 else "incremental"
            engine.source.full_reads = mode == "full"
            started = time.perf_counter()
            await engine.tick()
            timed[mode].append((time.perf_counter() - started) * 1000)
        full, incr = statistics.median(timed["full"]), statistics.median(timed["incremental"])
        print(
            f"passes (in-process, alternating, {passes} each): {nodes:,} nodes x {GPUS} GPUs, {jobs:,} running jobs,"
            f" {window_s:g} s of windows; ingest between passes not timed"
        )
        print(f"  every live job re-read (before): {_stats(timed['full'])}")
        print(f"  job view kept from the bus (now): {_stats(timed['incremental'])}")
        print(f"  pass time median: {full:.1f} ms -> {incr:.1f} ms, {full / incr:.1f}x faster")
        print(f"  rules (last pass, ms): {engine.last_pass.timings_ms if engine.last_pass else {}}")
    finally:
        await _clean_up(bus, pool, db)


async def bench_live(nodes: int, seconds: float, for_s: float, interval: float, profile: int = 0) -> None:
    db, prefix, url = await new_database("bench")
    pool = await create_pool(url)
    bus = await Bus.connect(NATS_URL, prefix, "bench-decider")  # an open NATS (scripts/services.sh): no keys
    await bus.ensure_streams()
    try:
        jobs = await insert_running_jobs(pool, nodes)  # 4 running 2-GPU jobs on every busy node
        config = parse_config(
            {
                "controller": {"interval": interval},
                "bus": {"url": NATS_URL, "prefix": prefix},
                "database": {"url": url},
                # every hot GPU is a migration: the bench measures reaction, not the limiter
                "decider": {"max_disruptions_per_minute": 1000},
                "strategies": {"oom_protection": {"for_s": for_s}},
            },
            env={},
        )
        engine = TimedEngine(bus, pool, config, config_path=Path("/nonexistent/adc_config.yaml"), profile=profile > 0)
        received: dict[str, tuple[float, Decision]] = {}

        async def on_decision(msg) -> None:
            d = Decision.decode(msg.data)
            received.setdefault(d.action.job_id, (time.time(), d))

        sub = await bus.nc.subscribe(bus.subjects.decisions, cb=on_decision)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        warmup = 8.0
        t0 = time.time() + 1.0
        # Blocks of BLOCK_S alternate the two ways of reading jobs, so both see the same load (and the
        # same neighbours on a shared machine). In each block one GPU's OOM window is satisfied, at a
        # different phase of the pass interval.
        blocks = 2 * max(1, math.ceil(seconds / BLOCK_S))
        modes = ["full" if b % 2 == 0 else "incremental" for b in range(blocks)]
        hot = [
            (IDLE_NODES + 7 * b, 2 * (b % 4), warmup + b * BLOCK_S + 1.5 + 0.37 * (b % 5) - for_s, math.inf)
            for b in range(blocks)
        ]
        manager = multiprocessing.Manager()
        hot_samples = manager.dict()
        proc = multiprocessing.Process(
            target=publish, args=(prefix, nodes, warmup + blocks * BLOCK_S + 1, hot, t0, hot_samples)
        )
        proc.start()
        await asyncio.sleep(t0 + warmup - time.time())
        ingested0, cpu0, wall0 = engine.view.samples_ingested, time.process_time(), time.time()
        measured = len(engine.timed)  # the warm-up's passes (nodes registering, the first read) are not counted
        engine.measuring = True
        for mode in modes:
            engine.source.full_reads = mode == "full"
            await asyncio.sleep(BLOCK_S)
        ingested, cpu, wall = engine.view.samples_ingested - ingested0, time.process_time() - cpu0, time.time() - wall0
        proc.join(timeout=60)
        stop.set()
        await task
        await sub.unsubscribe()
        samples = dict(hot_samples)
        manager.shutdown()

        print(
            f"live: {nodes:,} nodes x {GPUS} GPUs at 1 Hz, {jobs:,} running jobs, pass every {interval:g} s "
            f"and on events; {blocks // 2} blocks of {BLOCK_S:g} s with full reads, alternating with as many with "
            f"the view kept from the bus"
        )
        print(
            f"  node snapshots ingested: {ingested / wall:,.0f}/s over {wall:.0f} s "
            f"(offered: {nodes:,}/s); decider CPU: {100 * cpu / wall:.0f} % of one core (ingest + passes)"
        )
        full = [ms for mode, ms in engine.timed[measured:] if mode == "full"]
        incr = [ms for mode, ms in engine.timed[measured:] if mode == "incremental"]
        print(f"  pass, every live job re-read from Postgres (before): {_stats(full)}")
        print(f"  pass, job view kept from the bus (now):            {_stats(incr)}")
        for mode in ("full urgent", "incremental urgent"):
            urgent = [ms for m, ms in engine.timed[measured:] if m == mode]
            print(f"  pass of only the rules watching a satisfied window ({mode.split()[0]} reads): {_stats(urgent)}")
        if full and incr:
            print(
                f"  pass time median: {statistics.median(full):.1f} ms -> {statistics.median(incr):.1f} ms, "
                f"{statistics.median(full) / statistics.median(incr):.1f}x faster; "
                f"rows re-read by id: {engine.source.book.reads}, reconciles: {engine.source.book.reconciles}"
            )
        print(f"  rules (last pass, ms): {engine.last_pass.timings_ms if engine.last_pass else {}}")
        by_mode = {m: [h for h, mode in zip(hot, modes) if mode == m] for m in ("full", "incremental")}
        print(f"  window satisfied -> migrate decision at the executor (for_s={for_s:g}):")
        print(f"    full reads: {_stats(reaction_ms(received, samples, by_mode['full'], for_s))}")
        print(f"    kept view:  {_stats(reaction_ms(received, samples, by_mode['incremental'], for_s))}")
        if engine.profiler is not None:
            out = io.StringIO()
            pstats.Stats(engine.profiler, stream=out).sort_stats("cumulative").print_stats(profile)
            print(f"  cProfile of the kept view's passes (event-loop thread), top {profile} by cumulative time:")
            print(out.getvalue())
    finally:
        for bucket in (bucket_name(bus), bus.subjects.leader_bucket):
            try:
                await bus.js.delete_key_value(bucket)
            except Exception:
                pass
        await _clean_up(bus, pool, db)


async def _clean_up(bus, pool, db: str) -> None:
    """What a bench made: its streams, its connections, its database."""
    for name in bus.subjects.streams():
        try:
            await bus.js.delete_stream(name)
        except Exception:  # noqa: BLE001 - already gone
            pass
    await bus.close()
    await pool.close()
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--seconds",
        type=float,
        default=20,
        help="live seconds measured in each mode (full reads, then the kept view), after an 8 s warm-up",
    )
    parser.add_argument("--for-s", type=float, default=5.0, help="OOM window (the seed's is 30 s)")
    parser.add_argument("--interval", type=float, default=5.0, help="controller.interval (the seed's is 5 s)")
    parser.add_argument("--passes", type=int, default=15, help="in-process passes timed in each mode (0: none)")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile the kept view's passes and print the N costliest functions",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    bench_ingest(args.nodes, rounds=10)
    if args.passes:
        asyncio.run(bench_passes(args.nodes, args.passes))
    if not args.skip_live:
        asyncio.run(bench_live(args.nodes, args.seconds, args.for_s, args.interval, args.profile))


if __name__ == "__main__":
    main()
