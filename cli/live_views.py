"""Live terminal views over the API's Server-Sent Events: `adc top` (nodes, their GPUs and the
running jobs, redrawn with each telemetry frame) and `adc metrics JOB -f` (the loss curve
growing with each logging step). Neither polls: they redraw when the stream says something changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from cli.audit_commands import READ_TIMEOUT_S
from cli.client import ApiClient, Unreachable
from cli.render import sparkline, table

TERMINAL = {"succeeded", "failed", "cancelled"}
JOBS_EVERY_S = 2.0  # `adc top` re-reads the running jobs at most this often
CLEAR = "\x1b[H\x1b[2J"


def events(client: ApiClient, path: str, params: dict[str, Any] | None = None) -> Iterator[tuple[str, Any]]:
    """(event, data) from an SSE endpoint; reconnects after a transport failure."""
    while True:
        try:
            with client.events(path, params, read_timeout=READ_TIMEOUT_S) as stream:
                for sse in stream:
                    if sse.data:
                        yield sse.event, json.loads(sse.data)
        except Unreachable as err:
            print(f"adc: lost {path} ({err}); reconnecting ...", file=sys.stderr, flush=True)
            time.sleep(1.0)


def bar(fraction: float, width: int = 10) -> str:
    full = max(0, min(width, round(fraction * width)))
    return "█" * full + "·" * (width - full)


def top_screen(frames: list[dict[str, Any]], jobs: list[dict[str, Any]], known: list[dict[str, Any]]) -> str:
    """One screen: each node with its GPUs (memory and utilization bars, the job on each), then the jobs."""
    lines = [f"adc top  {time.strftime('%H:%M:%S')}   nodes {len(known)}   running jobs {len(jobs)}", ""]
    live = {f["node"]: f for f in frames}
    for node in known:
        frame = live.get(node["id"], {})
        cpu = f"cpu {frame['cpu_pct']:.0f}%" if "cpu_pct" in frame else "no telemetry"
        lines.append(f"{node['id']}  {node['status']}  {cpu}  free {node['free']}/{len(node['devices'])}")
        holders = {d["index"]: d.get("job_id") for d in node["devices"]}
        gpus = frame.get("gpus") or []
        for g in gpus:
            mem = g["memory_used_bytes"] / g["memory_total_bytes"] if g["memory_total_bytes"] else 0.0
            lines.append(
                f"  gpu {g['index']:<2} mem {bar(mem)} {mem * 100:3.0f}%  util {bar(g['util_pct'] / 100)} "
                f"{g['util_pct']:3.0f}%  {g.get('job_id') or holders.get(g['index']) or '-'}"
            )
        if not gpus:
            for d in node["devices"]:
                lines.append(f"  {d.get('kind', 'gpu')} {d['index']:<2} {d.get('job_id') or '-'}")
    lines.append("")
    lines.append(
        table(
            jobs,
            [
                ("job", lambda j: j["id"]),
                ("name", lambda j: j["name"]),
                ("team", lambda j: j["team"]),
                ("status", lambda j: j["status"]),
                ("on", lambda j: " ".join(p["node"] for p in j["placement"] or [])),
                (
                    "step",
                    lambda j: f"{(j['progress'] or {}).get('step', '-')}/{(j['progress'] or {}).get('max_steps', '?')}",
                ),
                ("loss", lambda j: _round((j["progress"] or {}).get("loss"))),
            ],
        )
        if jobs
        else "(no running jobs)"
    )
    return "\n".join(lines)


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def cmd_top(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    tty = sys.stdout.isatty() and not args.once
    jobs_at, jobs, known = float("-inf"), [], []
    for kind, frames in events(client, "/v1/nodes/stream"):
        if kind != "nodes":
            continue
        if time.monotonic() - jobs_at >= JOBS_EVERY_S:
            jobs = client.jobs(status="running", limit=100)["items"]
            known = client.nodes()["items"]
            jobs_at = time.monotonic()
        print((CLEAR if tty else "") + top_screen(frames, jobs, known), flush=True)
        if args.once:
            return 0
    return 0


def follow_metrics(client: ApiClient, job_id: str, points: list[dict[str, Any]], out=sys.stdout) -> dict[str, Any]:
    """Print each new point (and the curve so far) until the job ends; return the job."""
    losses = [p["loss"] for p in points if isinstance(p.get("loss"), (int, float))]
    tty = out.isatty()
    for kind, data in events(client, "/v1/jobs/stream", {"job_id": job_id}):
        if kind == "progress":
            if isinstance(data.get("loss"), (int, float)):
                losses.append(data["loss"])
            line = (
                f"step {data.get('step')}/{data.get('max_steps', '?')}  loss {_round(data.get('loss'))}  "
                f"tokens/s {_round(data.get('tokens_per_s'))}"
            )
            if tty:
                print(f"{CLEAR}{job_id}\nloss  {sparkline(losses)}\n{line}", file=out, flush=True)
            else:
                print(line, file=out, flush=True)
        elif kind == "job":
            print(
                f"{data['kind']} (attempt {data['attempt']}{', on ' + data['node'] if data.get('node') else ''})",
                file=out,
                flush=True,
            )
            if data["kind"] == "exited":
                job = _settled(client, job_id)
                if job["status"] in TERMINAL:
                    print(f"{job_id} {job['status']}; loss  {sparkline(losses)}", file=out, flush=True)
                    return job
    return client.job(job_id)


def _settled(client: ApiClient, job_id: str, wait_s: float = 10.0) -> dict[str, Any]:
    """The job once the executor has recorded what its exit means (a stop that moves it, or its end)."""
    deadline = time.monotonic() + wait_s
    job = client.job(job_id)
    while job["status"] in ("running", "starting") and time.monotonic() < deadline:
        time.sleep(0.5)
        job = client.job(job_id)
    return job


def register(sub) -> None:
    p = sub.add_parser("top", help="a live view of nodes, their GPUs and the running jobs")
    p.add_argument("--once", action="store_true", help="print one screen and exit")
    p.set_defaults(func=cmd_top)
