"""Preempt-then-resume with standby trainers (worker/standby.py): a high-priority job preempts a
low-priority one on a one-GPU node, and both the high job's start and the low job's resume are handed
to standby trainers; the low job's final weights equal an untouched twin's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.e2e.test_preemption import DONE, STEPS, adapter, frozen, spec
from tests.e2e.test_protocols import wait_step
from tests.e2e.test_warm_standby_moves import standbys_ready


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # Two standbys: one for the high job's start, one for the low job's resume right after it.
    yield from running_stack(
        tmp_path_factory, workers=1, simulate_gpus=1, worker={"node_timeout": 20, "standby_trainers": 2}
    )


def wait_standbys(live, count: int, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while standbys_ready(live, "node-1") < count:
        assert time.monotonic() < deadline, f"fewer than {count} standby trainers ready"
        time.sleep(0.2)


def launched(job: dict, attempt: int) -> dict:
    return json.loads((Path(job["job_dir"]) / f"attempt-{attempt}" / "launch.json").read_text())


@pytest.mark.timeout(1200)  # four jobs one after the other on one slot, and standbys to wait for
def test_a_preempted_job_resumes_on_a_standby_bit_identical_to_its_twin(live, tiny_model, data_dir):
    twin = live.wait_for(live.submit(spec(tiny_model, data_dir, "twin"))["id"], DONE, timeout=400)
    assert twin["status"] == "succeeded", twin
    low_job = live.submit(spec(tiny_model, data_dir, "low-batch") | {"priority": "low"})
    wait_step(live, low_job["id"], 12, timeout=300)
    with frozen(low_job["id"], 1):
        wait_standbys(live, 2)  # both ready before the preemption: the high start and the low resume
        high_job = live.submit(spec(tiny_model, data_dir, "urgent", steps=6) | {"priority": "high"})
        live.wait_for(low_job["id"], {"checkpointing"}, timeout=120)
    high_done = live.wait_for(high_job["id"], DONE, timeout=300)
    assert high_done["status"] == "succeeded", high_done
    low_done = live.wait_for(low_job["id"], DONE, timeout=300)
    assert low_done["status"] == "succeeded", low_done
    assert low_done["attempt"] == 2 and low_done["progress"]["step"] == STEPS
    assert launched(high_done, 1).get("standby") is True
    resumed = launched(low_done, 2)
    assert resumed.get("standby") is True and resumed["resume_from"], resumed
    statuses = [
        r["new_status"]
        for r in live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", low_job["id"])
    ]
    assert "preempted" in statuses, statuses
    a, b = adapter(low_done), adapter(twin)
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst == 0.0, f"max abs diff {worst}"
