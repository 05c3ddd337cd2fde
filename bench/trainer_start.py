"""How long a warm trainer takes to get ready, this tree beside a baseline commit, alternately (ABAB).

A warm trainer (worker/trainer/warm_start.py) imports torch, transformers and LLaMA-Factory, loads
the tokenized dataset from the job's cache and builds the model, then says `prepared` and waits for
its go: that is what a warm move waits for. Each round starts one such trainer from each code tree
(the baseline's files by `git archive REV`, the tree's own as they are), on the same tiny model,
config and filled tokenized cache, and kills it at `prepared`. Printed per tree: the median wall
time from the start to `prepared`, and the median CPU time the trainer used until then (its
rusage at the kill): on a shared host the CPU time is the steadier of the two.

Usage: python bench/trainer_start.py [--rounds 3] [--size tiny] [--baseline HEAD]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import export_tree  # noqa: E402
from worker.trainer.interpreter import trainer_python  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def settings(model: Path, output_dir: Path) -> dict:
    """The LoRA SFT job of tests/integration/trainer (base_settings), 200 steps."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(REPO / "examples" / "data"),
        "cutoff_len": 64,
        "max_samples": 64,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "learning_rate": 1.0e-3,
        "max_steps": 200,
        "logging_steps": 1,
        "save_steps": 1000,
        "seed": 7,
        "report_to": "none",
        "template": "qwen3_nothink",
        "output_dir": str(output_dir),
    }


def environment(tree: Path, work: Path, events: Path, go_file: Path | None) -> dict[str, str]:
    """What the worker's sandbox gives a trainer (worker/sandbox.py trainer_environment), less the uid."""
    env = {k: os.environ[k] for k in ("LANG", "LC_ALL", "TZ") if k in os.environ}
    env |= {
        "PATH": f"{Path(trainer_python()).parent}:/usr/bin:/bin",
        "HOME": str(work / "home"),
        "XDG_CACHE_HOME": str(work / "cache"),
        "HF_HOME": str(work / "cache" / "huggingface"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(tree),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "ADC_TOKENIZED_CACHE": str(work / "tokenized"),
        "ADC_EVENTS_FILE": str(events),
    }
    if go_file is not None:
        env["ADC_GO_FILE"] = str(go_file)
    return env


def fill_cache(work: Path, config: Path) -> None:
    """One cold trainer of the same job: tokenizes the data into the job's cache, trains one step."""
    one_step = work / "fill.yaml"
    one_step.write_text(config.read_text().replace("max_steps: 200", "max_steps: 1"))
    events = work / "fill.jsonl"
    done = subprocess.run(
        [trainer_python(), "-m", "worker.trainer", "--config", str(one_step)],
        cwd=REPO,
        env=environment(REPO, work, events, None),
        capture_output=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the cold run that fills the cache failed:\n{done.stderr.decode()[-3000:]}")


def start_until_prepared(tree: Path, work: Path, config: Path, n: int, timeout_s: float) -> tuple[float, float]:
    """(wall s, CPU s) of one warm trainer from its start to its `prepared` event."""
    events = work / f"events-{n}.jsonl"
    began = time.monotonic()
    process = subprocess.Popen(
        [trainer_python(), "-m", "worker.trainer", "--config", str(config)],
        cwd=tree,
        env=environment(tree, work, events, work / f"go-{n}"),  # never written: the trainer waits
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not (events.exists() and '"prepared"' in events.read_text()):
            if process.poll() is not None:
                raise SystemExit(f"the trainer of {tree} exited ({process.returncode}) before `prepared`")
            if time.monotonic() - began > timeout_s:
                raise SystemExit(f"the trainer of {tree} was not prepared within {timeout_s:.0f} s")
            time.sleep(0.01)
        wall = time.monotonic() - began
    finally:
        process.kill()
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = -9  # reaped here, for its rusage
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="trainers per tree, started alternately")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="tiny model size")
    parser.add_argument("--baseline", default="HEAD", metavar="REV", help="the commit to compare this tree with")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a trainer may take to be prepared")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="adc-bench-trainer-start-") as tmp:
        work = Path(tmp)
        trees = {f"baseline {rev or args.baseline}": export_tree(args.baseline, work / "baseline"), "this tree": REPO}
        model = work / "model"
        build_tiny_llama(model, SIZES[args.size])
        config = work / "train.yaml"
        config.write_text(yaml.safe_dump(settings(model, work / "out"), sort_keys=False))
        fill_cache(work, config)
        figures: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
        n = 0
        for round_ in range(1, args.rounds + 1):
            for label, tree in trees.items():
                n += 1
                wall, cpu = start_until_prepared(tree, work, config, n, args.timeout)
                figures[label].append((wall, cpu))
                print(f"round {round_} {label:<18} start -> prepared {wall:6.2f} s wall {cpu:6.2f} s CPU", flush=True)
    print(f"{args.rounds} rounds, model {args.size}, tokenized dataset in the job's cache")
    medians = {label: tuple(statistics.median(f[i] for f in runs) for i in (0, 1)) for label, runs in figures.items()}
    for label, (wall, cpu) in medians.items():
        print(f"  {label:<18} start -> prepared median {wall:6.2f} s wall {cpu:6.2f} s CPU")
    (base_wall, base_cpu), (wall, cpu) = medians.values()
    print(f"  this tree / baseline         median {wall / base_wall:6.2f} wall {cpu / base_cpu:6.2f} CPU")


if __name__ == "__main__":
    main()
