"""The same LLaMA-Factory YAML run by plain `llamafactory-cli train` and by ADC, alternating in one run.

Each round runs, one after the other (never at once, so they do not share the cores):
  lf     `.venv-trainer/bin/llamafactory-cli train FILE`                (LLaMA-Factory alone)
  adc    `python -m worker.trainer --config FILE` in the same environment (ADC's hooks added)
and, with --stack, once at the end: the YAML submitted to a local ADC stack (api, decider,
executor, worker), timed from POST /v1/jobs to `succeeded`, beside LLaMA-Factory's wall time.

Printed: samples/s (LLaMA-Factory's own train_samples_per_second from train_results.json) and
peak RSS (wait4 of the trainer process) per round, their ADC/LF ratios (median over rounds),
wall times, and the stack's submit -> succeeded time.

Usage: python bench/trainer_vs_llamafactory.py [--rounds 3] [--size 13m] [--steps 30] [--stack]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from worker.trainer.interpreter import trainer_python  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402


def config(model: Path, steps: int) -> dict:
    """LLaMA-Factory's qwen3_lora_sft example with a local model, local data and a step cap."""
    data = REPO.parent / "shared" / "llamafactory" / "data"
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "dataset": "identity,alpaca_en_demo",
        "dataset_dir": str(data if data.is_dir() else REPO / "examples" / "data"), "template": "qwen3_nothink",
        "cutoff_len": 256, "max_samples": 1000, "logging_steps": 5, "save_steps": 1000, "plot_loss": True,
        "overwrite_output_dir": True, "report_to": "none", "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 4, "learning_rate": 1.0e-4, "max_steps": steps,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "seed": 42,
    }


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes of the process tree's largest member, exit code)."""
    started = time.perf_counter()
    with open(cwd / "run.log", "w") as log:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    return time.perf_counter() - started, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def run_one(kind: str, train: dict, folder: Path) -> dict:
    folder.mkdir(parents=True)
    out = folder / "out"
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump({**train, "output_dir": str(out)}, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "ADC_EVENTS_FILE": str(folder / "events.jsonl")}
    python = trainer_python()
    if kind == "lf":
        argv = [str(Path(python).parent / "llamafactory-cli"), "train", str(path)]
    else:
        argv = [python, "-m", "worker.trainer", "--config", str(path)]
    wall, rss, code = timed(argv, folder, env)
    if code != 0:
        raise RuntimeError(f"{kind} run failed ({code}); see {folder / 'run.log'}")
    results = json.loads((out / "train_results.json").read_text())
    return {"kind": kind, "wall_s": wall, "rss": rss, "samples_per_s": results["train_samples_per_second"],
            "train_s": results["train_runtime"]}


def stack_submit_to_succeeded(train: dict, home: Path) -> float:
    import httpx

    from cli.stack import Stack, StackOptions, bus_keys_from_env

    stack = Stack(StackOptions(home=home, workers=1, api_port=0, nats_url=os.environ.get("NATS_URL"),
                               bus_credentials=bus_keys_from_env(),
                               database_url=os.environ.get("DATABASE_URL"), prefix=f"benchlf{os.getpid()}",
                               roots=[REPO, REPO.parent / "shared", home],  # its data and the model built in `home`
                               overrides={"controller": {"interval": 1}, "worker": {"heartbeat_interval": 1}}))
    stack.start(progress=lambda *_: None)
    try:
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        spec = {k: v for k, v in train.items() if k != "overwrite_output_dir"}
        started = time.perf_counter()
        job = http.post("/v1/jobs", json={"name": "bench-lf", "gpus": 1, "train": spec})
        job.raise_for_status()
        job_id = job.json()["id"]
        while True:
            status = http.get(f"/v1/jobs/{job_id}").json()
            if status["status"] == "succeeded":
                return time.perf_counter() - started
            if status["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} {status['status']}: {status.get('status_reason')}")
            time.sleep(0.1)
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", default="13m", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--stack", action="store_true", help="also time submit -> succeeded on a local ADC stack")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="adc-bench-lf-"))
    home.chmod(0o755)
    model = build_tiny_llama(home / "model", SIZES[args.size])
    train = config(model, args.steps)
    rows = []
    for round_ in range(args.rounds):
        order = ("lf", "adc") if round_ % 2 == 0 else ("adc", "lf")  # alternate who goes first
        for kind in order:
            rows.append({**run_one(kind, train, home / f"{round_}-{kind}"), "round": round_})
            r = rows[-1]
            print(f"round {round_} {kind:<3} samples/s {r['samples_per_s']:8.3f}  peak RSS {r['rss'] / 2**20:7.0f} MiB  "
                  f"wall {r['wall_s']:6.1f} s", flush=True)
    by_round = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["kind"]] = r
    speed = statistics.median(b["adc"]["samples_per_s"] / b["lf"]["samples_per_s"] for b in by_round.values())
    memory = statistics.median(b["adc"]["rss"] / b["lf"]["rss"] for b in by_round.values())
    lf_wall = statistics.median(b["lf"]["wall_s"] for b in by_round.values())
    adc_wall = statistics.median(b["adc"]["wall_s"] for b in by_round.values())
    print(f"\nmodel {args.size}, {args.steps} steps, {args.rounds} rounds (medians)")
    print(f"samples/s ADC/LF     {speed:.3f}")
    print(f"peak RSS  ADC/LF     {memory:.3f}")
    print(f"wall s    LF {lf_wall:.1f}   ADC trainer {adc_wall:.1f}")
    if args.stack:
        print(f"ADC submit -> succeeded {stack_submit_to_succeeded(train, home / 'stack'):.1f} s "
              f"(LLaMA-Factory command wall time {lf_wall:.1f} s)")


if __name__ == "__main__":
    main()
