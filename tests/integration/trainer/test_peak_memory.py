"""The trainer's terminal events carry its peak resident memory, the kernel's own figure."""

from __future__ import annotations

# What may still be mapped between the terminal event and the exit (the events file closed, exit
# handlers run). The interpreter's module teardown, which the trainer skips, added about 120 MiB.
MAX_GROWTH_AFTER_EVENT = 8 * 2**20


def test_terminal_events_carry_the_peak_rss_the_kernel_hands_the_parent(lora_runs):
    """`peak_rss_bytes` of `succeeded` and `stopped` is what wait4() gives the trainer's parent at its
    exit (ru_maxrss: the high-water mark of the process and of its waited-for children), read by the
    trainer itself, since a job's trainer has the worker's sandbox as its parent. Exact, not
    sampled: the bench compares it with LLaMA-Factory's own run, and the job's users read it."""
    for run, kind in ((lora_runs.reference, "succeeded"), (lora_runs.stopped, "stopped")):
        reported = run.one(kind)["peak_rss_bytes"]
        assert run.peak_rss_bytes > 100 * 2**20, run.peak_rss_bytes  # torch alone is more than that
        # Written just before the exit: the kernel's final figure is that one, give or take the exit itself.
        assert run.peak_rss_bytes - MAX_GROWTH_AFTER_EVENT <= reported <= run.peak_rss_bytes, (
            kind,
            reported,
            run.peak_rss_bytes,
        )
        # At least every peak the progress events saw (this process's own, read at each log).
        assert reported >= max(e["peak_memory_bytes"] for e in run.of("progress")), kind
