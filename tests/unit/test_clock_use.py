"""One clock: the executor, decider and worker read the time and wait through `shared.infra.clock`, so
tests drive their timeouts with ManualClock. This fails on a direct reading of the host's clock in
services/ or worker/ outside shared/infra/clock.py, except where one must stay (each says why)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READING = re.compile(r"\btime\.(?:time|monotonic)\(\)|\bdatetime\.(?:now|utcnow)\(|get_running_loop\(\)\.time\(\)")

# path -> (readings allowed, why they are not the clock's)
ALLOWED = {
    "worker/trainer/events.py": (
        1,
        "the trainer is its own process in its own environment (.venv-trainer, no"
        " shared/): its events carry its host's wall time",
    ),
    "worker/trainer/atomic_checkpoints.py": (
        3,
        "the trainer's process: when a checkpoint was saved, in its manifest, and how long the save took",
    ),
    "worker/trainer/launch.py": (2, "the trainer's launcher process: grace for a failed rank's real processes"),
    "worker/trainer_process.py": (2, "waiting for a real OS process to be gone: real time, whatever the clock says"),
    "services/collector/sampler.py": (1, "rates of the host's disk and network counters over real elapsed time"),
    "services/collector/__main__.py": (1, "the collector's sample time; the collector is outside the control loop"),
    "services/api/audit.py": (2, "the api (outside the control loop): how long a verify took"),
    "services/api/auth.py": (1, "the api (outside the control loop): token expiry against the database's timestamps"),
    "services/api/cluster_feed.py": (3, "the api (outside the control loop): dashboard frame time and cache age"),
    "worker/trainer_network.py": (2, "a namespace file's age against its mtime, which the OS stamps in real time"),
}


def readings() -> dict[str, int]:
    found = {}
    for pkg in ("services", "worker"):
        for path in (REPO / pkg).rglob("*.py"):
            count = len(READING.findall(path.read_text()))
            if count:
                found[str(path.relative_to(REPO))] = count
    return found


def test_the_finder_finds_each_kind_of_reading():
    text = (
        "a = time.time()\nb = time.monotonic()\nc = datetime.now(timezone.utc)\nd = asyncio.get_running_loop().time()"
    )
    assert len(READING.findall(text)) == 4
    assert not READING.findall("self.clock.now()\nclock.monotonic()\ntime.perf_counter()")


def test_the_control_loop_reads_time_only_through_the_clock():
    found = readings()
    for path in ("services/executor", "services/decider", "worker/agent.py"):
        assert not [p for p in found if p.startswith(path)], f"{path} reads the host's clock: use shared.infra.clock"
    unexplained = {p: n for p, n in found.items() if n > ALLOWED.get(p, (0, ""))[0]}
    assert unexplained == {}, (
        f"time read outside shared/infra/clock.py (use the Clock, or allow it here with a reason): {unexplained}"
    )


def test_every_allowance_is_still_needed():
    found = readings()
    stale = {p: n for p, (n, _) in ALLOWED.items() if found.get(p, 0) < n}
    assert stale == {}, f"fewer readings than allowed: lower the allowance {stale}"
