"""A worker cut off from the bus (its relay black-holed: a network partition, the worker itself
runs on) while its trainer trains. Within worker.node_timeout the worker has checkpoint-stopped the
trainer itself; the executor calls the node lost and the job resumes on the other node from that
very checkpoint, which nobody could report: no step lost, none trained twice, and the old trainer
had exited before the new attempt was launched (one trainer at a time on the job's `output/`, the
fence raised to the new attempt). Healed, the node is ready again and its late exit report of the
old attempt changes nothing.

The self-stop latency (cut -> the trainer's `stopped` event) is printed.
"""

from __future__ import annotations

import json
import os
import signal
import time

from tests.chaos.conftest import DONE, NODE_TIMEOUT_S, lora_job

STEPS, SAVE_STEPS = 60, 10
MARGIN_S = 3.0  # the step in progress and the checkpoint, on a busy machine


def cut_while_frozen(chaos, job_id: str, node: str) -> tuple[float, int]:
    """Freeze the node's trainer, wait until the executor knows the newest checkpoint it wrote, cut the
    node off, and thaw the trainer once the cut-off worker has asked it to stop (the attempt's stop
    file): a tiny model on an idle machine would otherwise finish first. The trainer then checkpoints
    at its next step, past the reported checkpoint. When the cut began, and the reported step."""
    pid = chaos.trainer_record(job_id, node)["pid"]
    stop_file = chaos.job_folder(job_id) / "attempt-1" / "stop"
    os.killpg(pid, signal.SIGSTOP)
    try:
        # Frozen, it writes no checkpoint; the ones it wrote before reach the executor first, so the
        # step the executor knows at the cut is fixed (read before the freeze, it could still move on).
        written = max(e["step"] for e in chaos.trainer_events(job_id) if e.get("event") == "checkpointed")
        deadline = time.monotonic() + 30
        while (reported := chaos.job(job_id).get("last_checkpoint_step")) != written:
            assert time.monotonic() < deadline, (reported, written)
            time.sleep(0.05)
        cut_at = chaos.partitions[node].cut()
        deadline = time.monotonic() + NODE_TIMEOUT_S + 10
        while not stop_file.exists():
            assert time.monotonic() < deadline, "the cut-off worker never asked its trainer to stop"
            time.sleep(0.05)
    finally:
        os.killpg(pid, signal.SIGCONT)
    return cut_at, reported


def test_a_cut_off_worker_checkpoint_stops_its_trainer_and_the_job_resumes_elsewhere_losing_nothing(
    chaos, tiny_model, data_dir
):
    job_id = chaos.submit(lora_job(tiny_model, data_dir, "cut-off", STEPS, SAVE_STEPS))["id"]
    # Cut between two checkpoints, the first one reported: the self-stop's is newer than any the executor knows.
    deadline = time.monotonic() + 120
    while not (job := chaos.job(job_id)).get("last_checkpoint_step"):
        assert time.monotonic() < deadline and job["status"] not in DONE, job
        time.sleep(0.1)
    node = job["placement"][0]["node"]
    try:
        cut_at, reported = cut_while_frozen(chaos, job_id, node)
        stopped = chaos.wait_trainer_event(job_id, "stopped", timeout=NODE_TIMEOUT_S + 30)
        latency = stopped["ts"] - cut_at
        print(
            f"\nself-stop: {latency:.2f} s after the cut (worker.node_timeout {NODE_TIMEOUT_S:.0f} s), "
            f"at step {stopped['step']}"
        )
        assert latency <= NODE_TIMEOUT_S + MARGIN_S, latency
        assert stopped["step"] > reported and stopped["checkpoint"].endswith(f"checkpoint-{stopped['step']}")
        requeued = chaos.wait_audit(lambda t: t, timeout=NODE_TIMEOUT_S + 30, job_id=job_id, kind="job.pending")
        assert node in [e["node"] for e in chaos.audit(kind="node.lost")]
        chaos.wait_for(job_id, {"running"} | DONE, timeout=120)
    finally:
        chaos.partitions[node].heal()

    done = chaos.wait_for(job_id, DONE, timeout=180)
    assert done["status"] == "succeeded" and done["progress"]["step"] == STEPS, done
    assert done["attempt"] == 2 and done["placement"][0]["node"] != node, done
    # The executor knew only the older checkpoint; the new attempt's worker found the newer one.
    assert "was lost" in requeued[0]["reason"] and requeued[0]["data"]["resume_step"] == reported, requeued
    launch = json.loads((chaos.job_folder(job_id) / "attempt-2" / "launch.json").read_text())
    assert launch["resume_from"] == stopped["checkpoint"], launch
    [started] = [e for e in chaos.trainer_events(job_id, 2) if e["event"] == "started"]
    assert started["step"] == stopped["step"] and started["resumed_from"] == stopped["checkpoint"], started
    assert chaos.progress(job_id, 1) + chaos.progress(job_id, 2) == list(range(1, STEPS + 1))
    # One trainer at a time on output/: the old one had stopped before the new one was launched.
    launched_at = (chaos.job_folder(job_id) / "attempt-2" / "launch.json").stat().st_mtime
    assert stopped["ts"] < launched_at
    assert (chaos.job_folder(job_id) / "fence").read_text().strip() == "2"

    # Healed: the node is back, the old attempt's late exit changed nothing, each event once.
    chaos.healthy()
    history = chaos.history(job_id)
    assert history == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "pending",
        "scheduled",
        "starting",
        "running",
        "succeeded",
    ], history
    trail = chaos.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], timeout=60, job_id=job_id)
    kinds = [e["kind"] for e in trail]
    assert kinds.count("job.succeeded") == 1 and kinds.count("job.pending") == 1, kinds
    starts = [e["data"]["attempt"] for e in trail if e["kind"] == "command.start"]
    assert starts == [1, 2], starts
    assert chaos.chain_breaks() is None
