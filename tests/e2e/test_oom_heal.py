"""A real out-of-memory heals itself: a job moved onto a node whose cap on the trainer's memory
(RLIMIT_AS, set by the worker) is too small for its micro-batch runs out of memory there (exit 76,
no fault injection), is requeued from its checkpoint as a typed outcome, and the decider's oom_retry
rule retries it (its budget is the rule's) with half the micro-batch and twice the gradient accumulation. It succeeds with the weights of a run that used
the smaller micro-batch from that checkpoint on; the audit tells the story."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.e2e.test_protocols import adapter, wait_stopping
from tests.integration.trainer.trainer_process import TrainerProcess

DONE = {"succeeded", "failed", "cancelled"}
# Measured on CPU with one thread (VmPeak of LLaMA-Factory's trainer, in .venv-trainer, on the
# tiny Llama, packed 1024-token blocks, 2 steps): micro-batch 2 peaks at 5573 MiB of address space,
# micro-batch 4 at 5700 MiB (most of it is the mapped torch libraries). The cap sits between them.
CAP = "5640MiB"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the address space a trainer needs depends on its threads
    try:
        yield from running_stack(
            tmp_path_factory,
            workers=2,
            cpu_slots=1,
            worker={"node_timeout": 10},
            worker_args={"node-2": ["--trainer-memory-limit", CAP]},
            strategies={"comm_jitter": {"enabled": False}},
        )
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads


def hungry_job(tiny_model: Path, data_dir: Path) -> dict:
    # max_steps leaves the migration asked at checkpoint 2 time to land before the job could finish.
    return {
        "name": "hungry",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(tiny_model),
            "stage": "pt",
            "finetuning_type": "lora",
            "lora_rank": 4,
            "lora_target": "all",
            "dataset": "c4_demo",
            "dataset_dir": str(data_dir),
            "cutoff_len": 1024,
            "flash_attn": "disabled",
            "gradient_checkpointing": False,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1e-3,
            "max_steps": 12,
            "logging_steps": 1,
            "save_steps": 2,
            "seed": 7,
        },
    }


def test_an_out_of_memory_attempt_resumes_with_a_smaller_micro_batch_and_the_same_global_batch(
    live, tiny_model, data_dir, tmp_path
):
    assert live.http.post("/v1/nodes/node-2/cordon").status_code == 202  # start it on the roomy node
    live.wait_audit(lambda t: t, node="node-2", kind="node.cordoned")
    job = live.submit(hungry_job(tiny_model, data_dir))
    deadline = time.monotonic() + 180
    while (live.job(job["id"]).get("last_checkpoint_step") or 0) < 2:
        assert time.monotonic() < deadline and live.job(job["id"])["status"] not in DONE, live.job(job["id"])
        time.sleep(0.2)
    assert live.http.post("/v1/nodes/node-2/uncordon").status_code == 202
    live.wait_audit(lambda t: t, node="node-2", kind="node.ready")
    with live.trainer_held(job["id"]):  # held while the target gets ready: the job cannot finish first
        assert live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": "node-2"}).status_code == 202
        wait_stopping(live, job["id"])

    # The OOM on node-2 requeues it from a checkpoint: the reference (the smaller micro-batch from
    # that checkpoint on, run by the trainer alone) runs meanwhile.
    trail = live.wait_audit(lambda t: any(_is_oom(e) for e in t), timeout=180, job_id=job["id"])
    resumed_from = next(e for e in trail if _is_oom(e))["data"]["checkpoint"]
    checkpoint = tmp_path / Path(resumed_from).name
    shutil.copytree(resumed_from, checkpoint)
    settings = hungry_job(tiny_model, data_dir)["train"] | {
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "resume_from_checkpoint": str(checkpoint),
    }
    reference_run = TrainerProcess(tmp_path / "reference", settings)

    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 3 and done["oom_retries"] == 1, done
    trail = live.wait_audit(lambda t: any(e["kind"] == "job.succeeded" for e in t), job_id=job["id"])
    kinds = [e["kind"] for e in trail]

    # The OOM on node-2, with where it resumes from ...
    oom = next(e for e in trail if _is_oom(e))
    assert oom["data"]["outcome"] == "oom" and oom["data"]["exit_code"] == 76 and oom["data"]["node"] == "node-2", oom
    assert "out-of-memory exit 1" in oom["reason"]
    # ... the decision that heals it, the decider's (the executor only requeued it) ...
    retry = next(e for e in trail if e["kind"] == "decision" and e["rule"] == "oom_retry")
    assert "retry 1 of 2" in retry["reason"] and retry["data"]["reason_code"] == "oom_retry.smaller_batch"
    assert retry["evidence"]["train_overrides"] == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}
    assert "global batch kept" in retry["reason"]
    start = next(e for e in trail if e["kind"] == "command.start" and e["data"]["attempt"] == 3)
    assert start["decision_id"] == retry["decision_id"] and start["data"]["resume_from"] == resumed_from
    # ... and the outcome, in that order.
    assert kinds.index("job.migrating") < trail.index(oom) < trail.index(retry) < kinds.index("job.succeeded")
    attempt_3 = Path(done["job_dir"]) / "attempt-3" / "events.jsonl"
    started = next(e for e in map(json.loads, attempt_3.read_text().splitlines()) if e["event"] == "started")
    assert started["global_batch_size"] == 4 and started["gradient_accumulation_steps"] == 2, started

    reference = reference_run.wait(timeout=300)
    assert reference.returncode == 0, reference.log_tail()
    ours, theirs = adapter(done), load_reference(reference.output_dir)
    worst = max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours)
    scale = max(float(theirs[k].float().abs().max()) for k in theirs)
    assert ours.keys() == theirs.keys() and worst <= 1e-4 * scale, (worst, scale)


def _is_oom(event: dict) -> bool:
    return event["kind"] == "job.pending" and "out of memory" in (event["reason"] or "")


def load_reference(output_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(output_dir / "adapter_model.safetensors"))
