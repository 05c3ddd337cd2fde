"""How the CLI shows things to people: tables, progress lines, the audit trail, a loss curve."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from cli.client import ApiClient, Unreachable

TERMINAL = {"succeeded", "failed", "cancelled"}
SPARKS = "▁▂▃▄▅▆▇█"


def table(rows: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict], Any]]]) -> str:
    cells = [[str(get(r) if get(r) is not None else "-") for _, get in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    lines = ["  ".join(h.upper().ljust(w) for (h, _), w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def fields(record: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """One `key  value` line per field, for a single record."""
    width = max((len(k) for k in record), default=0)
    return "\n".join(f"{k:<{width}}  {'-' if v is None else v}" for k, v in record.items() if k not in skip)


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


def status_line(job: dict[str, Any]) -> str:
    where = ",".join(f"{p['node']}:{p['gpus']}" for p in job.get("placement") or [])
    why = f"({job['pending_reason']})" if job["status"] == "pending" and job.get("pending_reason") else ""
    return f"{job['status']:<10} {where:<16} {progress_text(job) or why}".rstrip()


def follow(
    client: ApiClient,
    job_id: str,
    out=sys.stdout,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    outage_s: float = 120.0,
) -> dict:
    """Print status changes and progress until the job ends; return its last state. An API that
    stops answering (a restart) is waited for up to `outage_s`: a CI run should not fail for it."""
    last_line = None
    deadline = time.monotonic() + timeout_s if timeout_s else None
    unreachable_since = None
    while True:
        try:
            job = client.job(job_id)
        except Unreachable as err:
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                print(f"  {time.strftime('%H:%M:%S')}  {err}; retrying", file=out, flush=True)
            if now - unreachable_since > outage_s:
                raise
            time.sleep(poll_s)
            continue
        unreachable_since = None
        line = status_line(job)
        if line != last_line:
            print(f"  {time.strftime('%H:%M:%S')}  {line}", file=out, flush=True)
            last_line = line
        if job["status"] in TERMINAL:
            return job
        if deadline and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def audit_line(e: dict[str, Any]) -> str:
    who = e.get("actor") or e.get("source")
    subject = " ".join(f"{k}={e[k]}" for k in ("job_id", "node", "rule", "action") if e.get(k))
    ts = (e.get("ts") or "")[:23].replace("T", " ")
    return f"#{e['id']:<6} {ts}  {e['kind']:<22} {who}  {subject}: {e.get('reason') or ''}".rstrip()


def audit_lines(items: list[dict[str, Any]]) -> str:
    return "\n".join("  " + audit_line(e) for e in items)


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line curve: enough to see a loss fall, or not."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width)]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / span * len(SPARKS)))] for v in values)
