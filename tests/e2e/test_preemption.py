"""A high-priority job arrives on a full cluster: a low-priority job is checkpointed and
preempted, the high-priority job runs, then the low-priority one resumes from its checkpoint
and finishes. The audit log tells the story in order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.e2e.test_loop import lora_job

DONE = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    yield from running_stack(tmp_path_factory, workers=1, cpu_slots=1, worker={"node_timeout": 10})


def test_high_priority_preempts_low_which_resumes_from_its_checkpoint(live, tiny_model, data_dir):
    low = lora_job(tiny_model, data_dir, name="low-batch", steps=150)
    low.update(priority="low")
    low_job = live.submit(low)
    deadline = time.monotonic() + 120
    while (live.job(low_job["id"])["progress"] or {}).get("step", 0) < 20:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    high = lora_job(tiny_model, data_dir, name="urgent", steps=20)
    high.update(priority="high")
    high_job = live.submit(high)

    high_done = live.wait_for(high_job["id"], DONE, timeout=300)
    assert high_done["status"] == "succeeded", high_done
    low_done = live.wait_for(low_job["id"], DONE, timeout=300)
    assert low_done["status"] == "succeeded", low_done
    assert low_done["attempt"] == 2 and low_done["progress"]["step"] == 150

    history = [
        r["new_status"]
        for r in live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", low_job["id"])
    ]
    assert history == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "checkpointing",
        "preempted",
        "pending",
        "scheduled",
        "starting",
        "running",
        "succeeded",
    ], history

    # The sink records events after the status they report: wait for the last one this test reads.
    trail = live.wait_audit(lambda t: any(e["kind"] == "job.succeeded" and e["job_id"] == low_job["id"] for e in t))

    def at(pred):
        return next(i for i, e in enumerate(trail) if pred(e))

    preempt = at(lambda e: e["kind"] == "decision" and e["action"] == "preempt" and e["job_id"] == low_job["id"])
    decision = trail[preempt]
    assert decision["rule"] == "priority_scheduling" and decision["reason"]
    stopped = at(lambda e: e["kind"] == "command.stop" and e["job_id"] == low_job["id"])
    preempted = at(lambda e: e["kind"] == "job.preempted" and e["job_id"] == low_job["id"])
    high_running = at(lambda e: e["kind"] == "job.running" and e["job_id"] == high_job["id"])
    high_succeeded = at(lambda e: e["kind"] == "job.succeeded" and e["job_id"] == high_job["id"])
    low_resumed = at(
        lambda e: e["kind"] == "command.start" and e["job_id"] == low_job["id"] and e["data"]["attempt"] == 2
    )
    low_succeeded = at(lambda e: e["kind"] == "job.succeeded" and e["job_id"] == low_job["id"])
    assert preempt < stopped < preempted < high_running < high_succeeded < low_resumed < low_succeeded
    checkpoint = trail[stopped]["data"]["checkpoint"]
    assert checkpoint and trail[low_resumed]["data"]["resume_from"] == checkpoint
    assert trail[stopped]["data"]["step"] >= 20
    # The resumed attempt did not tokenize again: it loaded the dataset the first one cached in the job's folder.
    logs = [(Path(low_done["job_dir"]) / f"attempt-{n}" / "trainer.log").read_text() for n in (1, 2)]
    assert "Loaded tokenized dataset from" not in logs[0] and "Tokenized dataset is saved at" in logs[0]
    assert "Loaded tokenized dataset from" in logs[1] and "Tokenized dataset is saved at" not in logs[1]
