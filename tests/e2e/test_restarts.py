"""Killing and restarting the executor, the decider and the audit sink mid-run loses no job
and no audit event: JetStream redelivers, and every handler is idempotent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.e2e.test_loop import lora_job
from tests.waits import until

EXPECTED_TRAIL = [
    "job.submitted",
    "decision",
    "job.scheduled",
    "command.start",
    "job.starting",
    "job.running",
    "job.succeeded",
]


def _events(job: dict) -> list[str]:
    """The events the job's trainer has written to its attempt's events.jsonl (it writes on, whoever
    listens)."""
    path = Path(job["job_dir"]) / f"attempt-{job['attempt']}" / "events.jsonl"
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_kill_9_of_executor_decider_and_sink_loses_nothing(live, tiny_model, data_dir):
    jobs = [live.submit(lora_job(tiny_model, data_dir, name=f"restart-{i}", steps=10)) for i in range(2)]
    live.stack.kill("executor")  # dies with decisions and job events still to handle
    jobs += [live.submit(lora_job(tiny_model, data_dir, name=f"restart-{i}", steps=10)) for i in range(2, 4)]
    # The decider decides while the executor is away: a start, and why each other job waits.
    ids = {j["id"] for j in jobs}
    trail = live.wait_audit(lambda t: {e["job_id"] for e in t} & ids, kind="decision", timeout=60)
    decided = {e["job_id"] for e in trail} & ids
    until(
        lambda: all((v := live.job(i))["status"] != "pending" or v.get("pending_reason") for i in ids),
        "a pending reason for each job still pending",
    )
    live.stack.kill("decider")
    live.stack.kill("audit-sink")
    live.stack.restart("executor")
    # The new executor carries out the decisions JetStream redelivers, with no decider and no sink.
    for job_id in decided:
        live.wait_for(job_id, {"scheduled", "starting", "running", "succeeded"}, may_be_dead={"decider", "audit-sink"})
    live.stack.restart("decider")
    live.stack.restart("audit-sink")
    first = live.wait_for(jobs[0]["id"], {"running", "succeeded"}, timeout=120)
    live.stack.kill("executor")  # again, mid-training this time
    written = _events(first)
    if first["status"] == "running" and not {"succeeded", "failed"} & set(written):
        # Its trainer reports on while no executor listens: events the new one must catch up on.
        until(lambda: len(_events(first)) > len(written), "an event while the executor is away")
    live.stack.restart("executor")

    for job in jobs:
        done = live.wait_for(job["id"], {"succeeded", "failed", "cancelled"}, timeout=240)
        assert done["status"] == "succeeded", done

    # Every job's trail is whole, in order, and nothing was written twice.
    def trails() -> dict[str, list[str]]:
        return {j["id"]: [e["kind"] for e in live.audit(job_id=j["id"])] for j in jobs}

    until(
        lambda: all("job.succeeded" in t for t in trails().values()),
        lambda: f"the sink wrote each job's job.succeeded: {trails()}",
        timeout=60,
        poll=0.5,
    )
    for job_id, kinds in trails().items():
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
