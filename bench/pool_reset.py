"""What a pool call costs with and without asyncpg's reset query, side by side in one run.

asyncpg's pool runs `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` on every
connection it takes back: a round trip per pool call. ADC's pool (shared/infra/db.create_pool) hands
connections back without it, since nothing in ADC leaves session state on a pooled connection.
Two pools of one connection each on the same database, one with asyncpg's default connection class
(the reset) and one from create_pool (none), take turns: each round both arms run `--calls` calls of
each shape the services make, in an order that alternates round by round:
- read: `pool.fetchrow` of one node's row (a read by key, as the executor's and the api's are);
- write: a transaction of one UPDATE (a heartbeat's write, as the executor records it).
Per round and arm: wall time per call, and CPU per call of this process plus the arm's Postgres
backend (the scheduler's counts, /proc/<pid>/task/*/schedstat). Printed: each arm's medians over the
rounds and the median of the paired ratios ADC's / asyncpg's with a distribution-free interval
(bench/paired.py).
Usage: .venv/bin/python bench/pool_reset.py [--rounds 30] [--calls 200]
Needs Postgres at 127.0.0.1:5432 (as the tests do); works in a throwaway database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import asyncpg  # noqa: E402

from bench.api import create_database, drop_database  # noqa: E402
from bench.paired import cpu_seconds, interval, spent  # noqa: E402
from shared.infra.db import MIGRATIONS_DIR, create_pool  # noqa: E402

NODES = [f"node-{i}" for i in range(50)]


async def read(pool: asyncpg.Pool, node: str) -> None:
    await pool.fetchrow("SELECT id, status, devices, last_heartbeat FROM nodes WHERE id = $1", node)


async def write(pool: asyncpg.Pool, node: str) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE nodes SET last_heartbeat = now() WHERE id = $1", node)


CALLS = {"read": read, "write": write}
SHAPES = tuple(CALLS)


async def one_arm(pool: asyncpg.Pool, backend: int, shape: str, calls: int) -> tuple[float, float]:
    """Wall and CPU seconds per call over `calls` calls of `shape`."""
    cpu_before = cpu_seconds([os.getpid(), backend])
    start = time.perf_counter()
    for i in range(calls):
        await CALLS[shape](pool, NODES[i % len(NODES)])
    wall = time.perf_counter() - start
    return wall / calls, spent(cpu_before, cpu_seconds([os.getpid(), backend])) / calls


async def main(args: argparse.Namespace) -> None:
    name = f"adc_bench_pool_{secrets.token_hex(4)}"
    url = await create_database(name, MIGRATIONS_DIR)
    try:
        admin = await asyncpg.connect(url)
        await admin.executemany("INSERT INTO nodes (id, devices) VALUES ($1, '[]')", [(n,) for n in NODES])
        await admin.close()
        arms = {
            "asyncpg's reset": await asyncpg.create_pool(url, min_size=1, max_size=1),
            "ADC's pool": await create_pool(url, min_size=1, max_size=1),
        }
        backends = {label: await pool.fetchval("SELECT pg_backend_pid()") for label, pool in arms.items()}
        for label, pool in arms.items():  # warm: statements prepared, caches filled
            for shape in SHAPES:
                await one_arm(pool, backends[label], shape, 20)
        figures = {(label, shape): [] for label in arms for shape in SHAPES}
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for shape in SHAPES:
                for label in order:
                    figures[label, shape].append(await one_arm(arms[label], backends[label], shape, args.calls))
        for pool in arms.values():
            await pool.close()
    finally:
        await drop_database(name)

    print(f"pool calls: {args.rounds} rounds of {args.calls} calls per shape and arm, one connection per pool")
    for shape in SHAPES:
        old, new = figures["asyncpg's reset", shape], figures["ADC's pool", shape]
        for i, what in enumerate(("wall", "CPU")):
            print(
                f"  {shape:<5} {what:<4} per call: asyncpg's reset {statistics.median(f[i] for f in old) * 1e6:7.1f} us,"
                f" ADC's pool {statistics.median(f[i] for f in new) * 1e6:7.1f} us;"
                f" ADC's / asyncpg's {interval([n[i] / o[i] for n, o in zip(new, old)])}"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="paired rounds (default 30)")
    parser.add_argument("--calls", type=int, default=200, help="calls per shape, arm and round (default 200)")
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
