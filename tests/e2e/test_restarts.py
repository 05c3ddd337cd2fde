"""Killing and restarting the executor, the decider and the audit sink mid-run loses no job
and no audit event: JetStream redelivers, and every handler is idempotent."""

from __future__ import annotations

import time
from collections import Counter

from tests.e2e.test_loop import lora_job

EXPECTED_TRAIL = [
    "job.submitted",
    "decision",
    "job.scheduled",
    "command.start",
    "job.starting",
    "job.running",
    "job.succeeded",
]


def test_kill_9_of_executor_decider_and_sink_loses_nothing(live, tiny_model, data_dir):
    jobs = [live.submit(lora_job(tiny_model, data_dir, name=f"restart-{i}", steps=10)) for i in range(2)]
    live.stack.kill("executor")  # dies with decisions and job events still to handle
    jobs += [live.submit(lora_job(tiny_model, data_dir, name=f"restart-{i}", steps=10)) for i in range(2, 4)]
    time.sleep(2)
    live.stack.kill("decider")
    live.stack.kill("audit-sink")
    live.stack.restart("executor")
    time.sleep(3)
    live.stack.restart("decider")
    live.stack.restart("audit-sink")
    live.wait_for(jobs[0]["id"], {"running", "succeeded"}, timeout=120)
    live.stack.kill("executor")  # again, mid-training this time
    time.sleep(1)
    live.stack.restart("executor")

    for job in jobs:
        done = live.wait_for(job["id"], {"succeeded", "failed", "cancelled"}, timeout=240)
        assert done["status"] == "succeeded", done

    # Every job's trail is whole, in order, and nothing was written twice.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        trails = {j["id"]: [e["kind"] for e in live.audit(job_id=j["id"])] for j in jobs}
        if all("job.succeeded" in t for t in trails.values()):
            break
        time.sleep(0.5)
    for job_id, kinds in trails.items():
        relevant = [k for k in kinds if k in EXPECTED_TRAIL]
        counts = Counter(relevant)
        assert all(counts[k] == 1 for k in EXPECTED_TRAIL if k != "decision"), (job_id, kinds)
        assert counts["decision"] >= 1, (job_id, kinds)
        firsts = [relevant.index(k) for k in EXPECTED_TRAIL]
        assert firsts == sorted(firsts), (job_id, kinds)
        history = live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)
        assert [r["new_status"] for r in history] == ["pending", "scheduled", "starting", "running", "succeeded"]

    # A second decision for a job (a decider that restarted before seeing the first acted on)
    # is refused by the executor, never carried out twice.
    refused = live.audit(kind="decision.refused")
    executed = live.sql("SELECT job_id, count(*) AS n FROM decisions WHERE state = 'done' GROUP BY job_id")
    assert all(r["n"] == 1 for r in executed) and len(executed) == len(jobs), (executed, refused)
    assert live.chain_breaks() is None
