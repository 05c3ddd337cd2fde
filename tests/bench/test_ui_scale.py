"""bench/ui_scale.py at its smallest size: it completes and prints each of its figure lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIGURES = [
    r"ui_scale: 20 nodes x 8 GPUs at 1 Hz, 50 jobs \(0 running, 50 pending\)",
    r"ui_scale: api alone \(best of 3\): GET /v1/nodes \d+ ms, .*; api CPU per cluster read \d+ ms",
    r"ui_scale: cluster page: 20 nodes, 160 GPU cells drawn in \d+ ms; first live frame applied at \d+ ms",
    r"ui_scale:   cluster view, timed in the page: drawn \d+ ms after it opened",
    r"ui_scale: cluster page kept 5 s: [\d.]+ live frames/s applied; JS heap [\d.]+ MiB -> [\d.]+ MiB after GC",
    r"ui_scale: queue page: 50 of 50 pending jobs listed \(25 flagged 'can never fit'\) in \d+ ms",
    r"ui_scale:   queue view, timed in the page: drawn \d+ ms after it opened",
    r"ui_scale: queue page kept 5 s: [\d.]+ refreshes/s applied; JS heap [\d.]+ MiB -> [\d.]+ MiB after GC",
]


def test_ui_scale():
    if not Path("/usr/bin/chromium").exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs /usr/bin/chromium for bench/ui_scale.py")
        pytest.skip("no /usr/bin/chromium")
    run = subprocess.run(
        [sys.executable, "bench/ui_scale.py", "--nodes", "20", "--jobs", "50", "--seconds", "5", "--opens", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for figure in FIGURES:
        assert re.search(figure, run.stdout), f"no line like {figure!r} in:\n{run.stdout}"
    # Live frames arrive about once a second: the page keeps up (some, at least, in 5 s).
    frames = float(re.search(r"cluster page kept 5 s: ([\d.]+) live frames/s", run.stdout).group(1))
    assert frames > 0, run.stdout
