"""`adc demo --scenario oom|preempt`: the seeds' stories on a local stack, told by the audit log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.client import ApiClient

SCENARIOS = {
    "oom": "two identical jobs on simulated GPUs; the memory of one job's GPU climbs past the threshold "
    "mid-training; ADC checkpoints it and migrates it within the window, training goes on, and its final "
    "weights equal those of the job nobody touched",
    "preempt": "one device; a low-priority job runs; a high-priority one arrives; the low one is checkpointed "
    "and requeued, the high one runs, then the low one resumes and finishes with the weights of an "
    "uninterrupted run of the same job",
}
TIMELINE = {
    "job.submitted",
    "decision",
    "job.scheduled",
    "job.running",
    "command.stop",
    "job.checkpointing",
    "job.migrating",
    "job.preempted",
    "job.pending",
    "command.start",
    "job.succeeded",
    "job.failed",
    "protocol.done",
}


def stack_options(scenario: str, home: Path) -> dict[str, Any]:
    """What the scenario's stack needs beyond the defaults."""
    if scenario == "oom":
        return {
            "workers": 2,
            "simulate_gpus": 2,
            "simulated_usage_dir": home / "usage",
            "overrides": {"controller": {"interval": 0.5}, "strategies": {"oom_protection": {"for_s": 3}}},
        }
    return {"workers": 1, "simulate_gpus": 1, "overrides": {"controller": {"interval": 1}}}


def _job(model: Path, data: Path, name: str, steps: int, priority: str = "low") -> dict[str, Any]:
    return {
        "name": name,
        "gpus": 1,
        "priority": priority,
        "train": {
            "model_name_or_path": str(model),
            "stage": "sft",
            "finetuning_type": "lora",
            "lora_rank": 4,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(data),
            "cutoff_len": 64,
            "max_samples": 64,
            "per_device_train_batch_size": 2,
            "learning_rate": 1e-3,
            "max_steps": steps,
            "logging_steps": 5,
            "save_steps": 20,
            "seed": 42,
        },
    }


def _wait(client: ApiClient, job_id: str, done: Callable[[dict], bool], timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if done(job):
            return job
        if job["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"{job_id} {job['status']}: {job['status_reason']}")
        time.sleep(0.3)
    raise TimeoutError(f"{job_id} still {job['status']} after {timeout:.0f}s")


def _finished(client: ApiClient, job_id: str) -> dict:
    return _wait(client, job_id, lambda j: j["status"] == "succeeded")


def _step(n: int) -> Callable[[dict], bool]:
    return lambda j: j["status"] == "running" and (j["progress"] or {}).get("step", 0) >= n


def timeline(client: ApiClient, job_ids: list[str], say=print) -> None:
    names = {j: client.job(j)["name"] for j in job_ids}
    events = sorted(
        (e for j in job_ids for e in client.audit(job_id=j, limit=1000)["items"] if e["kind"] in TIMELINE),
        key=lambda e: e["id"],
    )
    say("\ntimeline (from the audit log):")
    for e in events:
        rule = f" [{e['rule']}]" if e.get("rule") else ""
        say(f"  {e['ts'][11:23]}  {names[e['job_id']]:<10} {e['kind']:<18}{rule} {(e['reason'] or '')[:110]}")


def weights_check(a: dict, b: dict, say=print) -> bool:
    from safetensors.torch import load_file

    wa = load_file(str(Path(a["output_dir"]) / "adapter_model.safetensors"))
    wb = load_file(str(Path(b["output_dir"]) / "adapter_model.safetensors"))
    worst = (
        max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa) if wa.keys() == wb.keys() else float("inf")
    )
    same = worst == 0.0
    say(
        f"\nweights check: {a['name']} vs {b['name']}: max abs diff {worst:g} "
        + ("(bit-identical: nothing was lost)" if same else "(they differ)")
    )
    return same


def run(scenario: str, client: ApiClient, model: Path, data: Path, home: Path, say=print) -> bool:
    return {"oom": _oom, "preempt": _preempt}[scenario](client, model, data, home, say)


def _oom(client: ApiClient, model: Path, data: Path, home: Path, say) -> bool:
    usage = home / "usage"
    usage.mkdir(parents=True, exist_ok=True)
    steps = 120
    climber = client.submit(_job(model, data, "climber", steps))
    calm = client.submit(_job(model, data, "untouched", steps))
    running = _wait(client, climber["id"], _step(30))
    _wait(client, calm["id"], _step(1))
    [part] = running["placement"]
    node, gpu = part["node"], part["gpus"][0]
    say(f"\n{climber['id']} runs on {node} GPU {gpu}; its memory climbs (simulated):")
    try:
        for fraction in (0.70, 0.80, 0.88, 0.93):
            (usage / f"{node}.json").write_text(json.dumps({str(gpu): fraction}))
            say(f"  {node}:{gpu} memory {fraction:.0%}")
            time.sleep(1)
        moved = _wait(client, climber["id"], lambda j: j["attempt"] >= 2, timeout=120)
        say(f"ADC moved it to {moved['placement'][0]['node']} (attempt {moved['attempt']}); training goes on")
    finally:
        (usage / f"{node}.json").write_text("{}")
    a, b = _finished(client, climber["id"]), _finished(client, calm["id"])
    timeline(client, [a["id"]], say)
    return weights_check(a, b, say)


def _preempt(client: ApiClient, model: Path, data: Path, home: Path, say) -> bool:
    low = client.submit(_job(model, data, "low-batch", 80))
    _wait(client, low["id"], _step(25))
    say(f"\nthe cluster is full ({low['id']} holds its only device); a high-priority job arrives")
    high = client.submit(_job(model, data, "urgent", 20, priority="high"))
    _finished(client, high["id"])
    low_done = _finished(client, low["id"])
    timeline(client, [low["id"], high["id"]], say)
    say("\nrunning the same low-priority job once more, uninterrupted, to compare ...")
    reference = _finished(client, client.submit(_job(model, data, "reference", 80))["id"])
    return weights_check(low_done, reference, say)
