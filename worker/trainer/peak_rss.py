"""The trainer's peak resident memory as the kernel keeps it, for its terminal events.

`peak_rss_bytes()` is the larger of this process's high-water mark (VmHWM: the kernel records it
before any page is given back, so nothing is missed between readings) and that of its child
processes that have ended and been waited for (LLaMA-Factory's dataset preprocessing workers, the
dataloader workers). It is the figure the parent's `wait4()` gets when the process exits
(`ru_maxrss`), read by the trainer itself: under the worker's sandbox (bwrap, another uid) no ADC
process waits for the trainer directly, and the job's events are where its users look.

Importable without torch.
"""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * 1024  # ru_maxrss is in KiB on Linux
