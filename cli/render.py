"""How the CLI shows things to people: tables, progress lines, the audit trail."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

from cli.client import ApiClient

TERMINAL = {"succeeded", "failed", "cancelled"}


def table(rows: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict], Any]]]) -> str:
    cells = [[str(get(r) if get(r) is not None else "-") for _, get in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    lines = ["  ".join(h.upper().ljust(w) for (h, _), w in zip(columns, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def progress_text(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if not p.get("step"):
        return ""
    total = p.get("max_steps") or 0
    bar = ""
    if total:
        done = int(20 * min(p["step"], total) / total)
        bar = "[" + "#" * done + "." * (20 - done) + "] "
    loss = f" loss {p['loss']:.4f}" if isinstance(p.get("loss"), (int, float)) else ""
    speed = f" {p['tokens_per_s']:.0f} tok/s" if isinstance(p.get("tokens_per_s"), (int, float)) else ""
    return f"{bar}step {p['step']}/{total or '?'}{loss}{speed}"


def follow(client: ApiClient, job_id: str, out=sys.stdout, poll_s: float = 1.0, timeout_s: float | None = None) -> dict:
    """Print status changes and progress until the job ends; return its last state."""
    last_line = None
    deadline = time.monotonic() + timeout_s if timeout_s else None
    while True:
        job = client.job(job_id)
        where = ",".join(f"{p['node']}:{p['gpus']}" for p in job.get("placement") or [])
        line = f"{job['status']:<10} {where:<16} {progress_text(job)}".rstrip()
        if line != last_line:
            print(f"  {time.strftime('%H:%M:%S')}  {line}", file=out, flush=True)
            last_line = line
        if job["status"] in TERMINAL:
            return job
        if deadline and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def audit_lines(items: list[dict[str, Any]]) -> str:
    lines = []
    for e in items:
        who = e.get("actor") or e.get("source")
        rule = f" rule={e['rule']}" if e.get("rule") else ""
        lines.append(f"  #{e['id']:<5} {e['ts'][11:23]}  {e['kind']:<20} {who}{rule}: {e.get('reason') or ''}")
    return "\n".join(lines)
