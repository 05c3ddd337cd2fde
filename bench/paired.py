"""Paired measurements on a shared, noisy host: CPU read from the scheduler's own counts, and the
median of paired ratios with a distribution-free confidence interval (the benches that compare two
arms side by side print their verdicts with these)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds each process's threads have run so far, to the nanosecond (the scheduler's own count,
    /proc/<pid>/task/<tid>/schedstat; utime and stime come in 10 ms ticks, too coarse for a short
    repetition). A process that is gone is left out."""
    out = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            continue
        total = 0
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                pass
        out[pid] = total / 1e9
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two readings; a process not in the first started in between."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """The median of `values` and a distribution-free confidence interval for it, from order statistics:
    [x_(k), x_(n+1-k)] covers the median with probability 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2);
    the narrowest such interval with at least `confidence` (the widest, min to max, when n is too small
    to reach it). Returns (median, low, high, its coverage)."""
    xs, n = sorted(values), len(values)
    below = [math.comb(n, i) / 2**n for i in range(n + 1)]
    k = 0  # 0-based: [xs[k], xs[n-1-k]] covers with 1 - 2 * P(B <= k)
    while 2 * (k + 1) <= n - 1 and 1 - 2 * sum(below[: k + 2]) >= confidence:
        k += 1
    return statistics.median(xs), xs[k], xs[n - 1 - k], 1 - 2 * sum(below[: k + 1])


def interval(ratios: list[float]) -> str:
    """'median  [low, high] (coverage CI)' of paired ratios."""
    median, low, high, coverage = median_ci(ratios)
    return f"{median:6.3f}  [{low:.3f}, {high:.3f}] ({coverage:.1%} CI)"


def judged(ratios: list[float], limit: float) -> str:
    """The paired ratios' interval and whether `limit` (the most a ratio may be) holds."""
    _, low, high, coverage = median_ci(ratios)
    if coverage < 0.95:
        verdict = "not judged: a 95 % interval needs 6 pairs or more"
    elif high <= limit:
        verdict = "met"
    elif low > limit:
        verdict = "NOT met"
    else:
        verdict = "undecided: the interval straddles the limit"
    return f"{interval(ratios)}   <= {limit}: {verdict}"
