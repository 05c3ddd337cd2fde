"""Faults under the worker: NATS restarted while a job trains (everyone reconnects, nothing is
lost: the job finishes in its one attempt with every step once), then the worker frozen
(SIGSTOP) past `worker.node_timeout` and woken: its node is lost and its job requeued from the
last checkpoint it reported, the stale trainer is stopped when the node returns, and the job
finishes with no more than `save_steps` steps trained again."""
from __future__ import annotations

import os
import signal
import time

import httpx

from tests.chaos.conftest import NODE_TIMEOUT_S, lora_job

STEPS, SAVE_STEPS = 40, 5


def _progress(chaos, job_id: str, attempt: int) -> list[int]:
    return [e["step"] for e in chaos.trainer_events(job_id, attempt) if e["event"] == "progress"]


def _healthy(chaos) -> None:
    chaos.wait_ready()
    for url in chaos.stack.api_urls:
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    assert chaos.stack.check_alive() == []


def test_a_nats_restart_mid_training_loses_nothing(chaos, tiny_model, data_dir):
    job_id = chaos.submit(lora_job(tiny_model, data_dir, "through-nats-restart", STEPS, SAVE_STEPS))["id"]
    chaos.wait_for(job_id, {"running"}, timeout=120)
    chaos.wait_trainer_event(job_id, "checkpointed")
    chaos.restart_nats(down_s=2.0)

    done = chaos.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1 and done["progress"]["step"] == STEPS, done
    assert _progress(chaos, job_id, 1) == list(range(1, STEPS + 1))
    history = [r["new_status"] for r in chaos.sql(
        "SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)]
    assert history == ["pending", "scheduled", "starting", "running", "succeeded"]
    trail = chaos.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], timeout=90, job_id=job_id)
    kinds = [e["kind"] for e in trail]
    assert [k for k in kinds if k.startswith("job.")] == ["job.submitted", "job.scheduled", "job.starting",
                                                          "job.running", "job.succeeded"], kinds
    assert chaos.sql("SELECT count(*) AS n FROM audit_events WHERE kind = 'message.dead_lettered'")[0]["n"] == 0
    assert chaos.chain_breaks() is None
    _healthy(chaos)


def test_a_worker_frozen_past_the_node_timeout_loses_at_most_save_steps(chaos, tiny_model, data_dir):
    job_id = chaos.submit(lora_job(tiny_model, data_dir, "frozen-worker", STEPS, SAVE_STEPS))["id"]
    chaos.wait_for(job_id, {"running"}, timeout=120)
    chaos.wait_trainer_event(job_id, "checkpointed")
    # Frozen only once the executor has the checkpoint: a worker frozen before forwarding it leaves
    # nothing to resume from, and that is another case (a requeue from the start).
    deadline = time.monotonic() + 60
    while not chaos.job(job_id).get("last_checkpoint_step"):
        assert time.monotonic() < deadline, chaos.job(job_id)
        time.sleep(0.1)
    worker = chaos.stack.procs["worker-node-1"]
    os.kill(worker.pid, signal.SIGSTOP)  # the worker alone: its trainer, in its own group, trains on
    try:
        requeued = chaos.wait_audit(lambda t: t, timeout=NODE_TIMEOUT_S + 30, job_id=job_id, kind="job.pending")
        lost = chaos.audit(kind="node.lost")
        assert [e["node"] for e in lost] == ["node-1"]
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    done = chaos.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    assert done["status"] == "succeeded" and done["progress"]["step"] == STEPS, done
    data = requeued[0]["data"]
    resume_step, reached = data["resume_step"], data["lost_progress_from_step"]
    assert resume_step is not None and reached - resume_step <= SAVE_STEPS, data
    final = done["attempt"]
    [started] = [e for e in chaos.trainer_events(job_id, final) if e["event"] == "started"]
    assert started["step"] == resume_step
    assert _progress(chaos, job_id, final) == list(range(resume_step + 1, STEPS + 1))
    # The stale trainer was stopped once the node was back; the node is ready again.
    assert chaos.wait_audit(lambda t: t, timeout=30, kind="node.reconciled", job_id=job_id)
    assert chaos.sql("SELECT status FROM nodes WHERE id = 'node-1'")[0]["status"] == "ready"
    kinds = [e["kind"] for e in chaos.audit(job_id=job_id)]
    assert kinds.count("job.succeeded") == 1 and kinds.count("job.submitted") == 1
    assert chaos.chain_breaks() is None
    _healthy(chaos)
