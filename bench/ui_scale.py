"""The dashboard at scale: headless Chromium against a real api fed as bench/scale.py feeds the
decider (1,000 nodes x 8 GPUs reporting at 1 Hz through the real NATS, 4,000 jobs in the real
Postgres), by default.

A publisher process plays the collectors and workers (bench/telemetry_load.py); the bench plays
the executor's part the api reads: each node's row in `nodes`, its heartbeat kept fresh, the
running jobs' placements. Debian's Chromium (/usr/bin/chromium), driven by Playwright, signs in
and measures:
- render: from opening the cluster page (a new tab: loading the page, its script and signing in
  from the session cookie) to every node drawn, and to the first live frame applied; the same for
  the queue page (every pending job listed); and the view's own time, measured in the page, from
  the view opening to drawn (the api's answer included);
- keeping up: for --seconds on each page, the live frames applied per second (the api sends at
  most one a second), the share of the time the page's main thread was busy, and the JS heap
  (after a forced GC) at the start and the end, so growth shows a leak.
Wall times include waiting for a shared host's cores; the main-thread figures (Chromium's own
TaskDuration, and ThreadTime: the CPU time its main thread got) separate the page's own work.

Usage: .venv/bin/python bench/ui_scale.py [--nodes 1000] [--jobs 4000] [--seconds 60] [--decider]
  smallest: --nodes 20 --jobs 50 --seconds 5 (well under a minute)
Needs NATS (JetStream) at 127.0.0.1:4222 and Postgres at 127.0.0.1:5432 (as bench/scale.py), and
/usr/bin/chromium. --decider also runs the decider, so the queue shows its pending reasons.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scale import teardown  # noqa: E402
from bench.telemetry_load import (  # noqa: E402
    GPUS,
    IDLE_NODES,
    NATS_URL,
    TOTAL,
    insert_running_jobs,
    new_database,
    node_name,
    publish,
    running_jobs,
)
from cli.local_services import api_ready, free_port  # noqa: E402
from services.api.auth import create_token  # noqa: E402
from shared.bus import Bus  # noqa: E402
from shared.bus_auth import CredentialStore  # noqa: E402
from shared.db import create_pool  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MIB = 2**20


async def setup(nodes: int, jobs: int) -> tuple[str, str, str, str, int, int]:
    """A fresh database with the nodes, the running jobs and the pending ones; an admin token."""
    db, prefix, url = await new_database("uiscale")
    pool = await create_pool(url)
    try:
        devices = [
            {"index": g, "kind": "gpu", "name": "H100", "memory_total_bytes": TOTAL, "nvlink_domain": 0}
            for g in range(GPUS)
        ]
        await pool.executemany(
            "INSERT INTO nodes (id, devices, rack) VALUES ($1, $2, $3)",
            [(node_name(i), devices, f"rack-{i // 40}") for i in range(nodes)],
        )
        running = min(jobs, len(running_jobs(nodes)))
        if running == len(running_jobs(nodes)):
            await insert_running_jobs(pool, nodes, {"train": {"max_steps": 100_000}})
        else:
            running = 0
        pending = jobs - running
        # Waiting jobs of both levels: the 16-GPU ones can never fit an 8-GPU node.
        await pool.executemany(
            "INSERT INTO jobs (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, submitted_at)"
            " VALUES ($1, $1, 'bench', 'default', $2, $3, $4, true, '{}', now() - make_interval(secs => $5))",
            [
                (
                    f"wait{i:05d}",
                    "high" if i % 3 == 0 else "low",
                    0 if i % 3 == 0 else 1,
                    16 if i % 2 else 8,
                    float(pending - i),
                )
                for i in range(pending)
            ],
        )
        async with pool.acquire() as conn:
            token = (await create_token(conn, "bench-admin", "admin", "default"))[1]
    finally:
        await pool.close()
    return db, prefix, url, token, running, pending


async def keep_heartbeats(url: str, stop: asyncio.Event) -> None:
    """The executor's part: every node's heartbeat fresh in Postgres (the publisher's go to NATS)."""
    pool = await create_pool(url)
    try:
        while not stop.is_set():
            await pool.execute("UPDATE nodes SET last_heartbeat = now()")
            try:
                await asyncio.wait_for(stop.wait(), timeout=5)
            except TimeoutError:
                pass
    finally:
        await pool.close()


def start_service(module: str, config: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL", "ADC_BUS_PREFIX")}
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(config), *extra],
        cwd=REPO,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def attr(page, selector: str, name: str) -> int:
    value = page.locator(selector).get_attribute(name)
    return int(value) if value else 0


def page_metrics(cdp) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def heap_mib(cdp) -> float:
    cdp.send("HeapProfiler.collectGarbage")
    return page_metrics(cdp)["JSHeapUsedSize"] / MIB


def busy(before: dict[str, float], after: dict[str, float]) -> str:
    """The page's main-thread time between two readings: the work itself, whatever else the
    machine's cores were doing meanwhile (wall time on a shared host is mostly waiting)."""
    d = {
        k: 1000 * (after.get(k, 0.0) - before.get(k, 0.0))
        for k in ("TaskDuration", "ThreadTime", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")
    }
    return (
        f"main thread busy {d['TaskDuration']:.0f} ms, {d['ThreadTime']:.0f} ms of it on a CPU (script "
        f"{d['ScriptDuration']:.0f}, layout {d['LayoutDuration']:.0f}, style {d['RecalcStyleDuration']:.0f})"
    )


def wait_attr(page, selector: str, name: str, above: int, timeout_s: float) -> float:
    """Seconds until `selector`'s attribute `name` exceeds `above` (polled every 20 ms)."""
    started = time.perf_counter()
    while attr(page, selector, name) <= above:
        if time.perf_counter() - started > timeout_s:
            raise SystemExit(f"{selector}[{name}] stayed at {attr(page, selector, name)} for {timeout_s:g} s")
        page.wait_for_timeout(20)
    return time.perf_counter() - started


def api_times(url: str, token: str) -> str:
    """What the pages wait for from the api alone: the best of three reads of each."""
    import httpx

    best = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        for path in ("/v1/nodes", "/v1/queue", "/v1/cluster/history"):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                r = http.get(path)
                times.append(time.perf_counter() - started)
                if r.status_code != 200:
                    raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
            best[path] = min(times)
    return "ui_scale: api alone (best of 3): " + ", ".join(f"GET {p} {t * 1000:.0f} ms" for p, t in best.items())


def open_page(context, hash_: str, ready: str):
    """A new tab on `hash_`, timed from the request for the page to `ready` being in the DOM."""
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    before = page_metrics(cdp)
    started = time.perf_counter()
    page.goto(f"/ui{hash_}")
    page.wait_for_selector(ready, state="attached", timeout=120_000)
    drawn = time.perf_counter() - started
    return page, cdp, drawn, busy(before, page_metrics(cdp))


def measure(url: str, token: str, nodes: int, pending: int, seconds: float) -> list[str]:
    from playwright.sync_api import sync_playwright

    lines = [api_times(url, token)]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            context = browser.new_context(base_url=url, viewport={"width": 1400, "height": 900})
            login = context.new_page()
            login.goto("/ui#/audit")
            login.fill("#login-token", token)
            login.click("#login-submit")
            login.wait_for_selector("#nav:not([hidden])")
            login.close()  # the session cookie stays with the context: each page below opens signed in

            # The cluster page, in a tab of its own (the time includes loading the page and its script).
            page, cdp, drawn, work = open_page(context, "#/cluster", "#nodes[data-loaded]")
            started = time.perf_counter() - drawn
            in_page = attr(page, "#nodes", "data-drawn-ms")
            fetched = page.evaluate("""() => {
                const e = performance.getEntriesByType("resource").filter((r) => r.name.endsWith("/v1/nodes")).pop();
                return e ? e.responseEnd - e.startTime : null;
            }""")
            rows = page.locator("#nodes .node").count()
            cells = page.locator("#nodes .gpu").count()
            wait_attr(page, "#nodes", "data-frames", 0, 60)
            live = time.perf_counter() - started
            lines.append(
                f"ui_scale: cluster page: {rows:,} nodes, {cells:,} GPU cells drawn in {drawn * 1000:.0f} ms; "
                f"first live frame applied at {live * 1000:.0f} ms"
            )
            lines.append(
                f"ui_scale:   cluster view, timed in the page: drawn {in_page} ms after it opened"
                + (f", of which GET /v1/nodes {fetched:.0f} ms" if fetched else "")
                + f"; {work}"
            )
            lines.append(keep_up(page, cdp, "cluster", "#nodes", "data-frames", seconds))
            page.close()

            # The queue page.
            page, cdp, drawn, work = open_page(context, "#/queue", "#queue-table[data-loaded]")
            listed = page.locator("#queue-table tbody tr").count()
            never = page.locator('#queue-table tr[data-never-fits="true"]').count()
            lines.append(
                f"ui_scale: queue page: {listed:,} of {pending:,} pending jobs listed ({never:,} flagged "
                f"'can never fit') in {drawn * 1000:.0f} ms"
            )
            lines.append(
                f"ui_scale:   queue view, timed in the page: drawn {attr(page, '#queue-table', 'data-drawn-ms')} "
                f"ms after it opened; {work}"
            )
            lines.append(keep_up(page, cdp, "queue", "#queue-table", "data-loaded", seconds, renders=True))
            context.close()
        finally:
            browser.close()
    return lines


def keep_up(page, cdp, name: str, selector: str, counter: str, seconds: float, renders: bool = False) -> str:
    """Stay on the page `seconds`: updates applied per second and the JS heap before and after."""
    heap0 = heap_mib(cdp)
    before = page_metrics(cdp)
    changes, last, t0 = 0, attr(page, selector, counter), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        page.wait_for_timeout(100)
        now = attr(page, selector, counter)
        if now != last:
            changes += 1 if renders else now - last
            last = now
    elapsed = time.perf_counter() - t0
    work = page_metrics(cdp)
    heap1 = heap_mib(cdp)
    what = "refreshes" if renders else "live frames"
    return (
        f"ui_scale: {name} page kept {seconds:g} s: {changes / elapsed:.2f} {what}/s applied; JS heap "
        f"{heap0:.1f} MiB -> {heap1:.1f} MiB after GC ({heap1 - heap0:+.1f} MiB); main thread busy "
        f"{100 * (work['TaskDuration'] - before['TaskDuration']) / elapsed:.0f} % of the time, on a CPU "
        f"{100 * (work.get('ThreadTime', 0.0) - before.get('ThreadTime', 0.0)) / elapsed:.0f} %"
    )


async def prepare_run(args, home: Path) -> dict:
    db, prefix, url, token, running, pending = await setup(args.nodes, args.jobs)
    keys = CredentialStore(home / "nats")
    keys.ensure(["api", "decider"])  # the open bench server does not check them, but services present one
    port = free_port()
    config = home / "adc_config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "bus": {"url": NATS_URL, "prefix": prefix, "credentials_dir": str(keys.directory)},
                "database": {"url": url, "pool_max": 10},
                "storage": {"root": str(home / "data")},
                "api": {"host": "127.0.0.1", "port": port},
                "controller": {"interval": 5},
            }
        )
    )
    bus = await Bus.connect(NATS_URL, prefix, "uiscale-setup")
    await bus.ensure_streams()
    await bus.close()
    return {
        "db": db,
        "prefix": prefix,
        "url": url,
        "token": token,
        "running": running,
        "pending": pending,
        "config": config,
        "api": f"http://127.0.0.1:{port}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help=f"nodes of {GPUS} GPUs (the first {IDLE_NODES} idle)")
    parser.add_argument(
        "--jobs", type=int, default=4000, help="jobs in Postgres: 4 running per busy node, the rest pending"
    )
    parser.add_argument("--seconds", type=float, default=60, help="how long each page is kept open under 1 Hz updates")
    parser.add_argument("--decider", action="store_true", help="also run the decider (pending reasons on the queue)")
    args = parser.parse_args()
    if args.nodes < 1 or args.jobs < 0 or args.seconds <= 0:
        parser.error("--nodes must be at least 1, --jobs not negative, --seconds positive")
    home = Path(tempfile.mkdtemp(prefix="adc-ui-scale-"))
    run = asyncio.run(prepare_run(args, home))
    services: list[subprocess.Popen] = []
    publisher = None
    beating = None
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    try:
        services.append(start_service("services.api", run["config"], home / "api.log"))
        if args.decider:
            services.append(
                start_service("services.decider", run["config"], home / "decider.log", "--log-level", "WARNING")
            )
        if not api_ready(run["api"], services[0], 60):
            raise SystemExit(f"the api did not start; see {home / 'api.log'}")
        total_s = 2 * args.seconds + 300  # both pages' measurements, and the time to render them
        publisher = multiprocessing.Process(
            target=publish, args=(run["prefix"], args.nodes, total_s, [], time.time(), {}, None), daemon=True
        )
        publisher.start()
        import threading

        beating = threading.Thread(
            target=lambda: loop.run_until_complete(keep_heartbeats(run["url"], stop)), daemon=True
        )
        beating.start()
        time.sleep(3)  # the first samples reach the api's cluster feed
        print(
            f"ui_scale: {args.nodes:,} nodes x {GPUS} GPUs at 1 Hz, {run['running'] + run['pending']:,} jobs "
            f"({run['running']:,} running, {run['pending']:,} pending); decider "
            f"{'running' if args.decider else 'not running'}",
            flush=True,
        )
        for line in measure(run["api"], run["token"], args.nodes, run["pending"], args.seconds):
            print(line, flush=True)
    finally:
        loop.call_soon_threadsafe(stop.set)
        if beating is not None:
            beating.join(timeout=10)
        if publisher is not None and publisher.is_alive():
            publisher.terminate()
            publisher.join(timeout=10)
        for proc in services:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(teardown(run["db"], run["prefix"]))


if __name__ == "__main__":
    main()
