"""Every LLaMA-Factory example config in ../shared/llamafactory/examples through one local ADC stack.

Each example is submitted to POST /v1/jobs as it is written, with only the model (the tiny local
Llama), the dataset folder, a step cap and bf16 changed (and its DeepSpeed config path made
absolute); all are submitted at once and the stack's workers share them. Beside them, each
config that needs hardware a CPU node lacks (GPU-only quantization kernels, fp8, fp16) is
submitted too and must be refused on the node with a reason naming the key.

Printed: one line per job (status, steps, seconds from submit to the end, the reason when it did
not succeed) and the wall time of the whole set. Exit 1 unless every example succeeded and every
hardware-only config was refused naming its key.

Usage: python bench/llamafactory_examples.py [--steps 2] [--workers 2] [--cpu-slots 1]
(NATS_URL / DATABASE_URL as for the tests; a fresh bus prefix and database schema per run)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.trainer.trainer_process import adapted_example, example_names  # noqa: E402
from worker.trainer.tiny_model import build_tiny_llama  # noqa: E402

# Hardware-only variants of an example: (key, value) that a CPU node must refuse, naming the key.
HARDWARE_ONLY = [("quantization_method", "hqq"), ("fp8", True), ("fp16", True)]
TERMINAL = {"succeeded", "failed", "cancelled"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpu-slots", type=int, default=1, help="trainers each worker runs at once")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    examples = example_names()
    if not examples:
        print("no LLaMA-Factory examples found under ../shared/llamafactory/examples", file=sys.stderr)
        return 1

    import httpx

    from cli.stack import Stack, StackOptions
    from tests.conftest import Isolated

    home = Path(tempfile.mkdtemp(prefix="adc-bench-examples-"))
    model = build_tiny_llama(home / "tiny-llama")
    env = Isolated().open()
    stack = Stack(StackOptions(home=home / "stack", workers=args.workers, cpu_slots=args.cpu_slots, api_port=0,
                               nats_url=env.nats_url, database_url=env.database_url, prefix=env.prefix,
                               overrides={"controller": {"interval": 1}, "worker": {"heartbeat_interval": 1}}))
    started = time.perf_counter()
    stack.start(progress=lambda *_: None)
    try:
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        specs = {name: adapted_example(name, model, args.steps) for name in examples}
        base = "train_qlora/qwen3_lora_sft_otfq.yaml" if "train_qlora/qwen3_lora_sft_otfq.yaml" in specs else examples[0]
        refusals = {f"{base} {key}={value}": (key, {**specs[base], key: value}) for key, value in HARDWARE_ONLY}
        submitted: dict[str, tuple[str, float]] = {}
        for label, train in [*specs.items(), *((label, train) for label, (_, train) in refusals.items())]:
            r = http.post("/v1/jobs", json={"name": "example", "gpus": 1, "train": train})
            if r.status_code != 201:
                print(f"{label}: refused by the api ({r.status_code}): {r.text[:300]}")
                return 1
            submitted[label] = (r.json()["id"], time.perf_counter())
        ended: dict[str, tuple[dict, float]] = {}
        deadline = time.monotonic() + args.timeout
        while len(ended) < len(submitted) and time.monotonic() < deadline:
            for label, (job_id, _) in submitted.items():
                if label not in ended and (job := http.get(f"/v1/jobs/{job_id}").json())["status"] in TERMINAL:
                    ended[label] = (job, time.perf_counter())
            time.sleep(0.5)
        ok = True
        for label, (job_id, at) in submitted.items():
            job, end = ended.get(label, ({"status": "timed out", "progress": {}, "status_reason": ""}, float("nan")))
            if label in refusals:
                key = refusals[label][0]
                good = job["status"] == "failed" and key in (job["status_reason"] or "")
            else:
                good = job["status"] == "succeeded" and (job["progress"] or {}).get("step") == args.steps
            ok &= good
            reason = "" if job["status"] == "succeeded" else f"  {(job['status_reason'] or '')[:160]}"
            print(f"{'ok ' if good else 'BAD'} {label:<58} {job['status']:<10} step {(job['progress'] or {}).get('step')}"
                  f"  {end - at:6.1f} s from submit{reason}", flush=True)
        print(f"\n{len(specs)} examples + {len(refusals)} hardware-only configs, {args.workers} workers x "
              f"{args.cpu_slots} slot(s): {time.perf_counter() - started:.1f} s wall (stack start included)")
        return 0 if ok else 1
    finally:
        stack.stop()
        env.close()


if __name__ == "__main__":
    sys.exit(main())
