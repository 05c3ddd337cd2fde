"""Showing simulated runs: one table row per policy, JSON, and PNG plots (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from sim.metrics import utilization_series
from sim.simulator import SimResult


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.0f}"


def table(rows: list[dict]) -> str:
    levels = sorted({lv for r in rows for lv in r["queueing_s"]})
    head = (
        ["policy", "avg JCT s", "p50 JCT s", "p95 JCT s"]
        + [f"{lv} wait avg/p95 s" for lv in levels]
        + [
            "makespan h",
            "util",
            "preempt",
            "migrate",
            "resize",
            "ckpt GPU-h",
            "restart GPU-h",
            "spikes",
            "oom moves",
            "oom deaths",
            "passes",
            "wall s",
            "cpu s",
        ]
    )
    body = []
    for r in rows:
        body.append(
            [r["policy"], _h(r["jct_s"]["avg"]), _h(r["jct_s"]["p50"]), _h(r["jct_s"]["p95"])]
            + [
                f"{_h(r['queueing_s'].get(lv, {}).get('avg'))}/{_h(r['queueing_s'].get(lv, {}).get('p95'))}"
                for lv in levels
            ]
            + [
                f"{r['makespan_s'] / 3600:,.1f}",
                f"{r['utilization']:.1%}",
                str(r["preemptions"]),
                str(r["migrations"]),
                str(r["resizes"]),
                f"{r['checkpoint_gpu_h']:.1f}",
                f"{r['restart_gpu_h']:.1f}",
                str(r.get("memory_spikes", 0)),
                str(sum(r.get("oom_actions", {}).values())),
                str(r.get("oom_crashes", 0)),
                str(r["passes"]),
                f"{r['wall_s']:.1f}",
                f"{r.get('cpu_s', 0.0):.1f}",
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(head)] + [line(b) for b in body])


def plot(results: list[SimResult], rows: list[dict], folder: str | Path, title: str) -> list[Path]:
    """jct_cdf.png (JCT CDF per policy) and utilization.png (held devices over time per policy)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = np.sort([j.finish_s - j.submit_s for j in result.jobs if j.finish_s is not None])
        if len(jct):
            ax.plot(jct / 3600, np.arange(1, len(jct) + 1) / len(jct), label=result.policy)
    ax.set_xscale("log")
    ax.set(xlabel="job completion time (hours, log)", ylabel="fraction of jobs", title=f"JCT CDF: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    cdf = out / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf, dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for result, row in zip(results, rows):
        end = row["makespan_s"] + min(j.submit_s for j in result.jobs)
        t, held, _ = utilization_series(result, end)
        ax.plot(t / 86400, held, label=f"{result.policy} (avg {row['utilization']:.0%})", linewidth=1)
    ax.set(xlabel="days", ylabel="fraction of devices held", ylim=(0, 1.05), title=f"GPU utilization: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    util = out / "utilization.png"
    fig.tight_layout()
    fig.savefig(util, dpi=120)
    plt.close(fig)
    return [cdf, util]
