"""A worker frozen (SIGSTOP: a partition the worker cannot notice, unlike a cut-off one, see
test_cut_off_worker.py) past `worker.node_timeout` and woken: its node is lost and its job
requeued on the other node from the last checkpoint it reported, the stale trainer (which trained
on meanwhile) is stopped when the node returns, and the job finishes with no more than
`save_steps` steps trained again. (NATS restarts are in test_workload.py.)"""

from __future__ import annotations

import json
import os
import signal
import time

from tests.chaos.conftest import NODE_TIMEOUT_S, lora_job

STEPS, SAVE_STEPS = 40, 5


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
    node = chaos.job(job_id)["placement"][0]["node"]
    worker = chaos.stack.procs[f"worker-{node}"]
    os.kill(worker.pid, signal.SIGSTOP)  # the worker alone: its trainer, in its own group, trains on
    try:
        requeued = chaos.wait_audit(lambda t: t, timeout=NODE_TIMEOUT_S + 30, job_id=job_id, kind="job.pending")
        lost = chaos.audit(kind="node.lost")
        assert node in [e["node"] for e in lost]
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    done = chaos.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    assert done["status"] == "succeeded" and done["progress"]["step"] == STEPS, done
    data = requeued[0]["data"]
    resume_step, reached = data["resume_step"], data["lost_progress_from_step"]
    assert resume_step is not None and reached - resume_step <= SAVE_STEPS, data
    final = done["attempt"]
    # The frozen worker's trainer trained on and may have checkpointed again before the new attempt
    # raised the fence: the new attempt resumes from the newest one (its worker read the folder).
    [started] = [e for e in chaos.trainer_events(job_id, final) if e["event"] == "started"]
    launch = json.loads((chaos.job_folder(job_id) / f"attempt-{final}" / "launch.json").read_text())
    assert started["step"] >= resume_step and started["resumed_from"] == launch["resume_from"], (started, launch)
    assert chaos.progress(job_id, final) == list(range(started["step"] + 1, STEPS + 1))
    # The stale trainer was stopped once the node was back; the node is ready again.
    assert chaos.wait_audit(lambda t: t, timeout=30, kind="node.reconciled", job_id=job_id)
    assert chaos.sql("SELECT status FROM nodes WHERE id = $1", node)[0]["status"] == "ready"
    # The sink audits an event after the status it reports is written: wait for it, then count.
    trail = chaos.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], timeout=60, job_id=job_id)
    kinds = [e["kind"] for e in trail]
    assert kinds.count("job.succeeded") == 1 and kinds.count("job.submitted") == 1
    assert chaos.chain_breaks() is None
    chaos.healthy()
