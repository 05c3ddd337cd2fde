"""The same LLaMA-Factory YAML run by plain `llamafactory-cli train` and by ADC's worker, alternating in one run.

One local ADC stack (api, decider, executor, one worker with one CPU slot) stays up for the whole
run. Each round runs, one after the other (never at once, so they do not share the cores), in an
order that alternates between rounds:
  lf   `.venv-trainer/bin/llamafactory-cli train FILE` (LLaMA-Factory alone), in the environment
       the worker would give a trainer (worker/sandbox.py's allowlist: same threads, a fresh
       HOME and Hugging Face cache, like a job's), but no sandbox and no ADC code;
  adc  the same YAML as the `train` section of POST /v1/jobs: the worker launches ADC's trainer
       in its sandbox (uid, bwrap), LLaMA-Factory runs inside it with ADC's callback and hooks.
The YAML is LLaMA-Factory's example with only the model (a tiny local Llama), the dataset folder,
the step cap and bf16 changed, and `disable_tqdm: true` (ADC's default; set for both so that only
ADC's hooks differ). The first round is a warm-up for both (page cache, compiled bytecode) and is
not counted.

Printed per run: samples/s (the trainer's own `train_samples_per_second` from train_results.json,
for both), peak RSS (the largest VmHWM among the run's processes, polled from /proc every 50 ms the
same way for both), and wall time: LLaMA-Factory's command wall time, ADC's POST /v1/jobs ->
`succeeded`. Then per preset: the ADC/LF ratios per round and their median, min and max.

Usage: python bench/trainer_vs_llamafactory.py [--rounds 3] [--steps 40] [--size 13m]
                                               [--presets lora_sft,full_sft]
(NATS_URL / DATABASE_URL as for the tests; a fresh bus prefix and database per run)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example  # noqa: E402
from worker.sandbox import trainer_environment  # noqa: E402
from worker.trainer.interpreter import trainer_python  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402

# Example -> keys dropped (full SFT's example names ZeRO-3, which plain LLaMA-Factory runs only
# under torchrun with FORCE_TORCHRUN; the comparison is of one process each).
PRESETS = {
    "lora_sft": ("train_lora/qwen3_lora_sft.yaml", ()),
    "full_sft": ("train_full/qwen3_full_sft.yaml", ("deepspeed",)),
    "dpo": ("train_lora/qwen3_lora_dpo.yaml", ()),
}


def train_section(preset: str, model: Path, steps: int) -> dict:
    example, dropped = PRESETS[preset]
    train = adapted_example(example, model, steps)
    for key in dropped:
        train.pop(key, None)
    # One save at the end for both (LLaMA-Factory's final model), no periodic checkpoint.
    return {**train, "disable_tqdm": True, "save_steps": 10 * steps}


def _tree_peak_rss(pids: set[int]) -> int:
    """The largest VmHWM (peak resident set) among `pids`, in bytes (0 for those gone)."""
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except (OSError, ValueError):
            continue
    return peak


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _with_job_id(job_id: str) -> set[int]:
    """The processes of one ADC job: the worker gives each of them ADC_JOB_ID (the bench runs as root)."""
    marker = f"ADC_JOB_ID={job_id}\0".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class PeakRSS:
    """Polls a set of processes' VmHWM; VmHWM only grows, so the last reading before exit is the peak."""

    def __init__(self) -> None:
        self.peak = 0

    def poll(self, pids: set[int]) -> None:
        self.peak = max(self.peak, _tree_peak_rss(pids))


def run_lf(train: dict, folder: Path) -> dict:
    folder.mkdir(parents=True)
    out = folder / "out"
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump({**train, "output_dir": str(out)}, sort_keys=False))
    python = trainer_python()
    env = trainer_environment(job_dir=folder, python=python, repo_root=REPO, inherited=dict(os.environ),
                              adc={}, tuning={})
    env.pop("PYTHONPATH")  # no ADC code in LLaMA-Factory's own run
    peak = PeakRSS()
    started = time.perf_counter()
    with open(folder / "run.log", "w") as log:
        # Its own session, as the worker starts a trainer: with the kernel's autogroup scheduling each
        # session is one CPU-sharing group, so LLaMA-Factory inside the bench's session would share
        # one group's share with everything else started from that shell (measured: 13x slower).
        process = subprocess.Popen([str(Path(python).parent / "llamafactory-cli"), "train", str(path)], cwd=folder,
                                   env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        while process.poll() is None:
            peak.poll(_descendants(process.pid))
            time.sleep(0.05)
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"llamafactory-cli failed ({process.returncode}); see {folder / 'run.log'}")
    results = json.loads((out / "train_results.json").read_text())
    return {"wall_s": wall, "rss": peak.peak, "samples_per_s": results["train_samples_per_second"]}


def run_adc(http, stack_root: Path, train: dict) -> dict:
    peak = PeakRSS()
    started = time.perf_counter()
    r = http.post("/v1/jobs", json={"name": "bench-lf", "gpus": 1, "train": train})
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text[:500]}")
    job_id = r.json()["id"]
    polled = 0.0
    while True:
        peak.poll(_with_job_id(job_id))
        if time.perf_counter() - polled > 0.5:  # the api every 0.5 s, /proc every 50 ms
            polled = time.perf_counter()
            job = http.get(f"/v1/jobs/{job_id}").json()
            if job["status"] == "succeeded":
                break
            if job["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} {job['status']}: {job.get('status_reason')}")
        time.sleep(0.05)
    wall = time.perf_counter() - started
    results = json.loads((stack_root / "data" / "jobs" / job_id / "output" / "train_results.json").read_text())
    return {"wall_s": wall, "rss": peak.peak, "samples_per_s": results["train_samples_per_second"], "job": job_id}


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  min {min(values):.3f}  max {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per preset (after one warm-up)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", default="13m", choices=sorted(SIZES))
    parser.add_argument("--presets", default="lora_sft,full_sft", help=f"comma-separated, of {', '.join(PRESETS)}")
    args = parser.parse_args()
    presets = args.presets.split(",")
    if not EXAMPLES.is_dir() or any(p not in PRESETS for p in presets):
        print(f"need ../shared/llamafactory/examples and presets of {sorted(PRESETS)}", file=sys.stderr)
        return 1

    import httpx

    from cli.stack import Stack, StackOptions
    from tests.conftest import Isolated

    home = Path(tempfile.mkdtemp(prefix="adc-bench-lf-"))
    home.chmod(0o755)  # the trainers' unprivileged uid reads the model
    model = build_tiny_llama(home / "model", SIZES[args.size])
    env = Isolated(nodes=("node-1",)).open()
    stack = Stack(StackOptions(home=home / "stack", workers=1, cpu_slots=1, api_port=0, nats_url=env.nats_url,
                               bus_credentials=env.keys.directory, database_url=env.database_url, prefix=env.prefix,
                               roots=[REPO, home, EXAMPLES.parent],
                               overrides={"controller": {"interval": 1}, "worker": {"heartbeat_interval": 1}}))
    # SIGTERM (a killed benchmark) still stops the stack, its trainer and the bus in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stack.start(progress=lambda *_: None)
    try:
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        summary = []
        for preset in presets:
            train = train_section(preset, model, args.steps)
            by_round: dict[int, dict] = {}
            for round_ in range(args.rounds + 1):
                order = ("lf", "adc") if round_ % 2 == 0 else ("adc", "lf")
                for kind in order:
                    r = run_lf(train, home / preset / f"{round_}-lf") if kind == "lf" \
                        else run_adc(http, home / "stack", train)
                    by_round.setdefault(round_, {})[kind] = r
                    print(f"{preset} round {round_}{' (warm-up)' if round_ == 0 else ''} {kind:<3} "
                          f"samples/s {r['samples_per_s']:8.3f}  peak RSS {r['rss'] / 2**20:7.0f} MiB  "
                          f"wall {r['wall_s']:6.1f} s", flush=True)
            counted = [by_round[i] for i in range(1, args.rounds + 1)]
            speed = [b["adc"]["samples_per_s"] / b["lf"]["samples_per_s"] for b in counted]
            memory = [b["adc"]["rss"] / b["lf"]["rss"] for b in counted]
            summary.append(
                f"{preset}: {args.rounds} rounds after a warm-up, {args.steps} steps, model {args.size}\n"
                f"  samples/s ADC/LF  {spread(speed)}   per round {', '.join(f'{s:.3f}' for s in speed)}\n"
                f"  peak RSS  ADC/LF  {spread(memory)}   per round {', '.join(f'{m:.3f}' for m in memory)}\n"
                f"  wall s    LF command {spread([b['lf']['wall_s'] for b in counted])}\n"
                f"            ADC submit -> succeeded {spread([b['adc']['wall_s'] for b in counted])}")
        print("\n" + "\n".join(summary))
        return 0
    finally:
        stack.stop()
        env.close()


if __name__ == "__main__":
    sys.exit(main())
