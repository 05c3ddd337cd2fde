"""The dashboard at scale: headless Chromium against a real api fed as bench/scale.py feeds the
decider (1,000 nodes x 8 GPUs reporting at 1 Hz through the real NATS, 4,000 jobs in the real
Postgres), by default.

A publisher process plays the collectors and workers (bench/telemetry_load.py); the bench plays
the executor's part the api reads: each node's row in `nodes`, its heartbeat kept fresh, the
running jobs' placements. Debian's Chromium (/usr/bin/chromium), driven by Playwright, signs in
and measures:
- render: from opening the cluster page (a new tab: loading the page, its script and signing in
  from the session cookie) to every node listed and the rows in view drawn (the page draws only
  those; it says how many nodes and cells it holds), and to the first live frame applied; the same for
  the queue page (every pending job listed); and the view's own time, measured in the page, from
  the view opening to drawn (the api's answer included);
- keeping up: for --seconds on each page, the live frames applied per second (the api sends at
  most one a second), the share of the time the page's main thread was busy, and the JS heap
  (after a forced GC) at the start and the end, so growth shows a leak.
Wall times include waiting for a shared host's cores; the main-thread figures (Chromium's own
TaskDuration, and ThreadTime: the CPU time its main thread got) separate the page's own work.
The busy nodes' GPU utilization moves every second (as a training step's does), so each live
frame has every busy GPU to redraw.

With `--baseline REV` the same run also serves the dashboard from commit REV's api (`git archive`,
started from there, on the same database, bus and load, beside this tree's, both ingesting
throughout): the cluster page is opened --opens times in each, alternating, REV's first, and
each figure is printed beside REV's (medians).

Usage: .venv/bin/python bench/ui_scale.py [--nodes 1000] [--jobs 4000] [--seconds 60] [--decider]
                                          [--opens 3] [--baseline REV]
  smallest: --nodes 20 --jobs 50 --seconds 5 (well under a minute)
Needs NATS (JetStream) at 127.0.0.1:4222 and Postgres at 127.0.0.1:5432 (as bench/scale.py), and
/usr/bin/chromium. --decider also runs the decider, so the queue shows its pending reasons.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import telemetry_load  # noqa: E402
from bench.api import export_tree  # noqa: E402
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
from bench.telemetry_load import metrics as steady_metrics  # noqa: E402
from cli.local_services import api_ready, free_port  # noqa: E402
from services.api.auth import create_token  # noqa: E402
from shared.infra.bus import Bus  # noqa: E402
from shared.infra.bus_auth import CredentialStore  # noqa: E402
from shared.infra.db import create_pool  # noqa: E402

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


def start_service(module: str, config: Path, log: Path, *extra: str, tree: Path) -> subprocess.Popen:
    """`module` of the code in `tree` (this checkout, or the baseline's files)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL", "ADC_BUS_PREFIX")}
    env["PYTHONPATH"] = str(tree)
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(config), *extra],
        cwd=tree,
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


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def api_times(api: Api, token: str, reads: int = 5) -> str:
    """What the pages wait for from the api alone: the best of three reads of each (the nodes as that
    tree's cluster page reads them: with their readings, where the api has them); and the api's CPU
    time per cluster read, net of what it spends meanwhile on taking in 1,000 nodes' telemetry."""
    import httpx

    best = {}
    nodes = "/v1/nodes?telemetry=true"
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        if http.get(nodes).status_code == 422:  # an api from before `telemetry`: its page reads the plain list
            nodes = "/v1/nodes"
        for path in (nodes, "/v1/queue", "/v1/cluster/history"):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                r = http.get(path)
                times.append(time.perf_counter() - started)
                if r.status_code != 200:
                    raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
            best[path] = min(times)
        before, started = cpu_s(api.proc.pid), time.perf_counter()
        time.sleep(3)
        steady = (cpu_s(api.proc.pid) - before) / (time.perf_counter() - started)
        before, started = cpu_s(api.proc.pid), time.perf_counter()
        for _ in range(reads):
            http.get(nodes)
        spent = cpu_s(api.proc.pid) - before - steady * (time.perf_counter() - started)
    return (
        "ui_scale: api alone (best of 3): "
        + ", ".join(f"GET {p.split('?')[0]} {t * 1000:.0f} ms" for p, t in best.items())
        + f"; api CPU per cluster read {max(0.0, spent) / reads * 1000:.0f} ms (beside its steady "
        f"{steady * 100:.0f} % of a core)"
    )


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


@dataclass
class Api:
    """An api process serving the dashboard: this tree's, or --baseline's (`label` names it)."""

    label: str
    tree: Path
    url: str
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    opens: list[dict[str, float]] = field(default_factory=list)
    work: str = ""  # the main thread's time on the last open


def sign_in(browser, api: Api, token: str):
    context = browser.new_context(base_url=api.url, viewport={"width": 1400, "height": 900})
    login = context.new_page()
    login.goto("/ui#/audit")
    login.fill("#login-token", token)
    login.click("#login-submit")
    login.wait_for_selector("#nav:not([hidden])")
    login.close()  # the session cookie stays with the context: each page below opens signed in
    return context


def open_cluster(context) -> tuple[object, object, dict[str, float], str]:
    """The cluster page, in a tab of its own (the time includes loading the page and its script)."""
    page, cdp, drawn, work = open_page(context, "#/cluster", "#nodes[data-loaded]")
    started = time.perf_counter() - drawn
    fetched = page.evaluate("""() => {
        const e = performance.getEntriesByType("resource").filter((r) => /[/]v1[/]nodes([?]|$)/.test(r.name)).pop();
        return e ? e.responseEnd - e.startTime : null;
    }""")
    figures = {
        "drawn": drawn * 1000,
        "in_page": attr(page, "#nodes", "data-drawn-ms"),
        "fetched": fetched or 0.0,
        # The list's nodes and cells as the view holds them (a page that draws only the rows in view
        # says so in data-nodes / data-cells; an older one drew them all), and the rows in the DOM.
        "rows": attr(page, "#nodes", "data-nodes") or page.locator("#nodes .node").count(),
        "cells": attr(page, "#nodes", "data-cells") or page.locator("#nodes .gpu").count(),
        "in_dom": page.locator("#nodes .node").count(),
    }
    wait_attr(page, "#nodes", "data-frames", 0, 60)
    figures["live"] = (time.perf_counter() - started) * 1000
    return page, cdp, figures, work


def measure(apis: list[Api], token: str, pending: int, seconds: float, opens: int) -> None:
    from playwright.sync_api import sync_playwright

    for api in apis:
        api.lines.append(api_times(api, token))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            contexts = [sign_in(browser, api, token) for api in apis]
            for _ in range(opens):  # alternating, the baseline first: both see the same moments of the host
                for api, context in zip(apis, contexts):
                    page, cdp, figures, work = open_cluster(context)
                    api.opens.append(figures)
                    api.work = work
                    page.close()
            for api, context in zip(apis, contexts):
                f = {k: statistics.median(o[k] for o in api.opens) for k in api.opens[0]}
                of = f" (median of {opens} opens)" if opens > 1 else ""
                api.lines.append(
                    f"ui_scale: cluster page: {f['rows']:,.0f} nodes, {f['cells']:,.0f} GPU cells drawn in "
                    f"{f['drawn']:.0f} ms; first live frame applied at {f['live']:.0f} ms{of}"
                )
                api.lines.append(
                    f"ui_scale:   cluster view, timed in the page: drawn {f['in_page']:.0f} ms after it opened"
                    + (f", of which GET /v1/nodes {f['fetched']:.0f} ms" if f["fetched"] else "")
                    + f"; {f['in_dom']:,.0f} node rows in the DOM"
                    + (" (the rest listed, drawn when scrolled to)" if f["in_dom"] < f["rows"] else "")
                    + f"; last open: {api.work}"
                )
                page, cdp, _, _ = open_cluster(context)
                api.lines.append(keep_up(page, cdp, "cluster", "#nodes", "data-frames", seconds))
                page.close()

                page, cdp, drawn, work = open_page(context, "#/queue", "#queue-table[data-loaded]")
                listed = page.locator("#queue-table tbody tr").count()
                never = page.locator('#queue-table tr[data-never-fits="true"]').count()
                api.lines.append(
                    f"ui_scale: queue page: {listed:,} of {pending:,} pending jobs listed ({never:,} flagged "
                    f"'can never fit') in {drawn * 1000:.0f} ms"
                )
                api.lines.append(
                    f"ui_scale:   queue view, timed in the page: drawn {attr(page, '#queue-table', 'data-drawn-ms')} "
                    f"ms after it opened; {work}"
                )
                api.lines.append(keep_up(page, cdp, "queue", "#queue-table", "data-loaded", seconds, renders=True))
                context.close()
        finally:
            browser.close()


def side_by_side(base: Api, this: Api) -> list[str]:
    """This tree's cluster-page medians beside the baseline's."""
    lines = []
    for key, what in (
        ("drawn", "cluster page drawn"),
        ("live", "first live frame applied"),
        ("in_page", "cluster view, timed in the page"),
        ("fetched", "GET /v1/nodes, in the page"),
    ):
        b = statistics.median(o[key] for o in base.opens)
        t = statistics.median(o[key] for o in this.opens)
        ratio = f"{t / b:.2f}x" if b else "-"
        lines.append(f"ui_scale: {what}: this tree {t:.0f} ms, {base.label} {b:.0f} ms ({ratio})")
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
        "keys": keys.directory,
    }


def write_config(run: dict, home: Path, name: str) -> tuple[Path, str]:
    """A services config on the run's database and bus, with an api port of its own; and the api's URL."""
    port = free_port()
    config = home / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "bus": {"url": NATS_URL, "prefix": run["prefix"], "credentials_dir": str(run["keys"])},
                "database": {"url": run["url"], "pool_max": 10},
                "storage": {"root": str(home / "data")},
                "api": {"host": "127.0.0.1", "port": port},
                "controller": {"interval": 5},
            }
        )
    )
    return config, f"http://127.0.0.1:{port}"


def varying_metrics(i: int, ts: float, hot: set[int]):
    """bench/telemetry_load's sample, with each busy GPU's utilization moving every second."""
    sample = steady_metrics(i, ts, hot)
    if i >= IDLE_NODES:
        for g in sample.gpus:
            g.util_pct = float(60 + (int(ts) * 7 + i * 3 + g.index * 5) % 40)
    return sample


def publish_varying(*args) -> None:
    """The load publisher (its own process), sending varying_metrics."""
    telemetry_load.metrics = varying_metrics
    publish(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help=f"nodes of {GPUS} GPUs (the first {IDLE_NODES} idle)")
    parser.add_argument(
        "--jobs", type=int, default=4000, help="jobs in Postgres: 4 running per busy node, the rest pending"
    )
    parser.add_argument("--seconds", type=float, default=60, help="how long each page is kept open under 1 Hz updates")
    parser.add_argument("--decider", action="store_true", help="also run the decider (pending reasons on the queue)")
    parser.add_argument("--opens", type=int, default=3, help="times the cluster page is opened (medians printed)")
    parser.add_argument(
        "--baseline", metavar="REV", help="also serve the dashboard from commit REV's api, beside this tree's"
    )
    args = parser.parse_args()
    if args.nodes < 1 or args.jobs < 0 or args.seconds <= 0 or args.opens < 1:
        parser.error("--nodes and --opens must be at least 1, --jobs not negative, --seconds positive")
    home = Path(tempfile.mkdtemp(prefix="adc-ui-scale-"))
    home.chmod(0o755)
    apis: list[Api] = []
    if args.baseline:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline], capture_output=True, text=True
        ).stdout.strip()
        label = f"{rev} ({args.baseline})" if rev and rev != args.baseline else rev or args.baseline
        apis.append(Api(label, export_tree(args.baseline, home / "baseline"), ""))
    apis.append(Api("this tree", REPO, ""))
    run = asyncio.run(prepare_run(args, home))
    services: list[subprocess.Popen] = []
    publisher = None
    beating = None
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    try:
        for k, api in enumerate(apis):
            config, api.url = write_config(run, home, f"api{k}")
            api.proc = start_service("services.api", config, home / f"api{k}.log", tree=api.tree)
            services.append(api.proc)
        if args.decider:
            services.append(
                start_service("services.decider", config, home / "decider.log", "--log-level", "WARNING", tree=REPO)
            )
        for k, api in enumerate(apis):
            if not api_ready(api.url, api.proc, 60):
                raise SystemExit(f"the api of {api.label} did not start; see {home / f'api{k}.log'}")
        # Every page's measurements, and the time to render them.
        total_s = len(apis) * (2 * args.seconds + 60 + 20 * args.opens) + 240
        publisher = multiprocessing.Process(
            target=publish_varying, args=(run["prefix"], args.nodes, total_s, [], time.time(), {}, None), daemon=True
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
        measure(apis, run["token"], run["pending"], args.seconds, args.opens)
        for api in apis:
            if args.baseline:
                print(f"ui_scale: --- served by {api.label}", flush=True)
            for line in api.lines:
                print(line, flush=True)
        if args.baseline:
            for line in side_by_side(apis[0], apis[-1]):
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
