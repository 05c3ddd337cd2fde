"""Every text-only LLaMA-Factory training example in a folder through one local ADC stack.

Each example is submitted to POST /v1/jobs as it is written, with only the model (the tiny local
Llama), the dataset folder (`data` beside the examples folder), a step cap and bf16 changed (and
its DeepSpeed config path made absolute); all are submitted at once and the stack's workers
share them. By default the folder is ../shared/llamafactory/examples; `--examples` names another,
e.g. the `examples/` of LLaMA-Factory 0.9.5's sdist (`pip download --no-deps --no-binary :all:
llamafactory==0.9.5`, unpacked), which also holds the `data/` its examples name.

Not submitted, and counted: YAMLs without a `stage` (accelerate, inference, merge and v1
configs) and multimodal ones (image/video/audio keys, or a dataset with such columns). With the
default folder, each config that needs hardware a CPU node lacks (GPU-only quantization kernels,
fp8, fp16) is submitted too and must be refused on the node naming the key.

Each job ends as one of:
  trained   succeeded at the step cap
  refused   the api answered 422 naming a field, or the trainer exited 2 (configuration error)
            with a reason naming a key of the config
  BAD       anything else: a crash (exit 1), a refusal naming no key, a timeout
Printed: one line per job, the counts, and the wall time. Exit 1 if any is BAD (or, with
`--expect-all-trained`, if any example did not train).

With `--versus-cli` (the default for a folder other than the default one, `--no-versus-cli` turns it
off) each example's same adapted config (same tiny model, dataset folder and step cap; an output
folder of its own under the run's folder) also runs as `.venv-trainer/bin/llamafactory-cli train
<yaml>` on the host, from the examples' root, as LLaMA-Factory's README runs it on a CPU node: plain
for most, and with FORCE_TORCHRUN=1 NPROC_PER_NODE=1 for a config with a `deepspeed` key (LLaMA-
Factory runs DeepSpeed only under torchrun, and counts no devices on a CPU node). Each ends as:
  trained   exit 0 and a model or adapter (*.safetensors / *.bin) written in its output folder
  refused   exit non-zero with a last error line naming a key of the config
  failed    anything else (exit 0 writing no model, a crash naming no key, a timeout)
Then one line per example (ADC's outcome, LLaMA-Factory's) and a summary: the examples LLaMA-Factory
trains and ADC does not (exit 1 unless none), those ADC refuses that LLaMA-Factory also fails, and
those ADC trains that LLaMA-Factory does not.

Usage: python bench/llamafactory_examples.py [--examples DIR] [--only a,b] [--steps 2] [--workers 2] [--cpu-slots 1]
                                            [--no-hardware-configs] [--versus-cli | --no-versus-cli] [--cli-jobs 2]
(NATS_URL / DATABASE_URL as for the tests; a fresh bus prefix and database schema per run)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example, example_names  # noqa: E402
from worker.trainer.tiny_model import build_tiny_llama  # noqa: E402

# Hardware-only variants of an example: (key, value) that a CPU node must refuse, naming the key.
HARDWARE_ONLY = [("quantization_method", "hqq"), ("fp8", True), ("fp16", True)]
TERMINAL = {"succeeded", "failed", "cancelled"}
MEDIA = ("images", "videos", "audios")


def kind_of(example: Path, data: Path) -> str:
    """'train', 'no stage' or 'multimodal' for one YAML."""
    config = yaml.safe_load(example.read_text())
    if not isinstance(config, dict) or "stage" not in config:
        return "no stage"
    if any(key.startswith(("image_", "video_", "audio_")) for key in config):
        return "multimodal"
    registry = json.loads((data / "dataset_info.json").read_text()) if (data / "dataset_info.json").is_file() else {}
    for key in ("dataset", "eval_dataset"):
        for name in str(config.get(key) or "").split(","):
            columns = (registry.get(name.strip()) or {}).get("columns") or {}
            if any(media in columns for media in MEDIA):
                return "multimodal"
    return "train"


def named_keys(text: str, train: dict) -> list[str]:
    """The keys of `train` that a refusal's text names."""
    return [key for key in train if re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", text)]


def last_error(output: str) -> str:
    """The last line of a failed run's output that reads as an error, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:)", line)]
    return (errors or lines or [""])[-1]


def run_cli(name: str, train: dict, home: Path, root: Path, timeout: float) -> tuple[str, str, float]:
    """(outcome, detail, seconds) of `llamafactory-cli train` on one adapted example; a run that
    could not even start (an OSError) is failed."""
    try:
        return _run_cli(name, train, home, root, timeout)
    except OSError as error:
        return "failed", f"not run: {error!r}", 0.0


def _run_cli(name: str, train: dict, home: Path, root: Path, timeout: float) -> tuple[str, str, float]:
    folder = home / "cli" / name.replace("/", "__").removesuffix(".yaml")
    folder.mkdir(parents=True)
    config = {**train, "output_dir": str(folder / "out")}
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {
        "PATH": f"{REPO / '.venv-trainer' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(folder),
        "XDG_CACHE_HOME": str(folder / "cache"),
        "HF_HOME": str(folder / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "DISABLE_VERSION_CHECK": "1",
        "WANDB_MODE": "disabled",
    }
    if train.get("deepspeed"):
        env.update(FORCE_TORCHRUN="1", NPROC_PER_NODE="1")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [str(REPO / ".venv-trainer" / "bin" / "llamafactory-cli"), "train", str(folder / "config.yaml")],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "failed", f"timed out after {timeout:.0f} s", time.perf_counter() - started
    seconds = time.perf_counter() - started
    (folder / "output.txt").write_text(done.stdout)
    out = folder / "out"
    models = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".bin") and p.is_file()] if out.is_dir() else []
    if done.returncode == 0 and models:
        return "trained", "", seconds
    error = last_error(done.stdout)
    named = named_keys(error, train)
    outcome = "refused" if done.returncode != 0 and named else "failed"
    return outcome, f"exit {done.returncode}, naming {', '.join(named) or 'no key'}: {error[:220]}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="a LLaMA-Factory examples folder")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpu-slots", type=int, default=1, help="trainers each worker runs at once")
    parser.add_argument("--timeout", type=float, default=2400)
    parser.add_argument(
        "--only", default="", help="comma-separated substrings: submit only examples whose path has one"
    )
    parser.add_argument(
        "--expect-all-trained",
        action="store_true",
        help="exit 1 unless every example trained (the default folder's contract)",
    )
    parser.add_argument(
        "--no-hardware-configs",
        action="store_true",
        help="submit only the examples, not the hardware-only configs the default folder adds",
    )
    parser.add_argument(
        "--versus-cli",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run each example with llamafactory-cli on the host (default: on unless the default folder)",
    )
    parser.add_argument("--cli-jobs", type=int, default=2, help="llamafactory-cli runs at once")
    parser.add_argument("--cli-timeout", type=float, default=900, help="seconds per llamafactory-cli run")
    args = parser.parse_args()
    examples_dir = args.examples.resolve()
    data = examples_dir.parent / "data"
    kinds = {name: kind_of(examples_dir / name, data) for name in example_names(examples_dir)}
    wanted = [w for w in args.only.split(",") if w]
    examples = [
        name for name, kind in kinds.items() if kind == "train" and (not wanted or any(w in name for w in wanted))
    ]
    if not examples:
        print(f"no LLaMA-Factory training examples found under {examples_dir}", file=sys.stderr)
        return 1
    expect_all = args.expect_all_trained or examples_dir == EXAMPLES.resolve()
    versus_cli = args.versus_cli if args.versus_cli is not None else examples_dir != EXAMPLES.resolve()

    import httpx

    from cli.stack import Stack, StackOptions
    from tests.conftest import Isolated

    home = Path(tempfile.mkdtemp(prefix="adc-bench-examples-"))
    model = build_tiny_llama(home / "tiny-llama")
    home.chmod(0o755)  # the trainers' unprivileged uid reads the model
    env = Isolated(nodes=tuple(f"node-{i}" for i in range(1, args.workers + 1))).open()
    stack = Stack(
        StackOptions(
            home=home / "stack",
            workers=args.workers,
            cpu_slots=args.cpu_slots,
            api_port=0,
            nats_url=env.nats_url,
            bus_credentials=env.keys.directory,
            database_url=env.database_url,
            prefix=env.prefix,
            roots=[REPO, home, examples_dir.parent],  # the model and the examples' root
            # LLaMA-Factory's examples set trust_remote_code: true, which runs only for a model in a
            # trusted code root: an admin taking these configs lists the vetted model's folder.
            overrides={
                "controller": {"interval": 1},
                "worker": {"heartbeat_interval": 1},
                "tenancy": {"trusted_code_roots": [str(model)]},
            },
        )
    )
    started = time.perf_counter()
    stack.start(progress=lambda *_: None)
    try:
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        specs = {name: adapted_example(name, model, args.steps, examples_dir) for name in examples}
        refusals: dict[str, tuple[str, dict]] = {}
        if examples_dir == EXAMPLES.resolve() and not args.no_hardware_configs:
            base = (
                "train_qlora/qwen3_lora_sft_otfq.yaml"
                if "train_qlora/qwen3_lora_sft_otfq.yaml" in specs
                else examples[0]
            )
            # quantization_method means something only beside quantization_bit: without it the job just trains.
            refusals = {
                f"{base} {key}={value}": (key, {**specs[base], key: value})
                for key, value in HARDWARE_ONLY
                if key != "quantization_method" or specs[base].get("quantization_bit") is not None
            }
        outcomes: dict[str, tuple[str, str]] = {}  # label -> (outcome, detail)
        submitted: dict[str, tuple[str, float]] = {}
        for label, train in [*specs.items(), *((label, train) for label, (_, train) in refusals.items())]:
            r = http.post("/v1/jobs", json={"name": "example", "gpus": 1, "train": train})
            if r.status_code == 201:
                submitted[label] = (r.json()["id"], time.perf_counter())
                continue
            fields = (
                [
                    str(e.get("loc", [])[-1])
                    for e in (r.json().get("detail") or [])
                    if isinstance(e, dict) and e.get("loc")
                ]
                if r.status_code == 422
                else []
            )
            named = [f for f in fields if f in train]
            outcomes[label] = (
                "refused" if named and label not in refusals else "BAD",
                f"api {r.status_code} naming {', '.join(named) or 'no key'}: {r.text[:200]}",
            )
        cli_runs = {}
        if versus_cli:  # beside the stack's trainers, on the same host
            pool = ThreadPoolExecutor(max_workers=args.cli_jobs)
            cli_runs = {
                name: pool.submit(run_cli, name, specs[name], home, examples_dir.parent, args.cli_timeout)
                for name in examples
            }
            for name, run in cli_runs.items():  # progress, as each ends
                run.add_done_callback(
                    lambda run, name=name: print(f"llamafactory-cli {run.result()[0]:<8} {name}", flush=True)
                )
            pool.shutdown(wait=False)
        ended: dict[str, tuple[dict, float]] = {}
        deadline = time.monotonic() + args.timeout
        while len(ended) < len(submitted) and time.monotonic() < deadline:
            for label, (job_id, _) in submitted.items():
                if label not in ended and (job := http.get(f"/v1/jobs/{job_id}").json())["status"] in TERMINAL:
                    ended[label] = (job, time.perf_counter())
            time.sleep(0.5)
        for label, (_, at) in submitted.items():
            job, end = ended.get(
                label, ({"status": "timed out", "progress": {}, "status_reason": "", "exit_code": None}, float("nan"))
            )
            reason = job["status_reason"] or ""
            step = (job["progress"] or {}).get("step")
            train = refusals[label][1] if label in refusals else specs[label]
            named = named_keys(reason, train)
            if label in refusals:
                good = job["status"] == "failed" and refusals[label][0] in named
                outcome = "refused" if good else "BAD"
            elif job["status"] == "succeeded" and step == args.steps:
                outcome = "trained"
            elif job["status"] == "failed" and job.get("exit_code") == 2 and named:
                outcome = "refused"
            else:
                outcome = "BAD"
            detail = f"{end - at:6.1f} s from submit" + (
                ""
                if outcome == "trained"
                else f", {job['status']} exit {job.get('exit_code')} step {step}, naming {', '.join(named) or 'no key'}: "
                f"{reason[:220]}"
            )
            outcomes[label] = (outcome, detail)
        for label in [*specs, *refusals]:
            outcome, detail = outcomes[label]
            print(f"{outcome:<8} {label:<52} {detail}", flush=True)
        counts = {o: sum(1 for v, _ in outcomes.values() if v == o) for o in ("trained", "refused", "BAD")}
        skipped = {k: sorted(n for n, v in kinds.items() if v == k) for k in ("no stage", "multimodal")}
        for kind, names in skipped.items():
            print(f"not submitted ({kind}): {len(names)}: {', '.join(names)}")
        print(
            f"\n{examples_dir}: {len(specs)} text-only training examples + {len(refusals)} hardware-only configs: "
            f"{counts['trained']} trained, {counts['refused']} refused naming a key, {counts['BAD']} bad; "
            f"{args.workers} workers x {args.cpu_slots} slot(s), {time.perf_counter() - started:.1f} s wall "
            f"(stack start included)"
        )
        all_trained = all(outcomes[name][0] == "trained" for name in specs)
        passed = counts["BAD"] == 0 and (all_trained or not expect_all)
        if cli_runs:
            cli = {name: run.result() for name, run in cli_runs.items()}
            print(f"\n{'ADC':<8} {'LF cli':<8} {'example':<52} LF cli detail")
            for name in specs:
                outcome, detail, seconds = cli[name]
                print(f"{outcomes[name][0]:<8} {outcome:<8} {name:<52} {seconds:6.1f} s {detail}", flush=True)
            adc_accepted = [n for n in specs if outcomes[n][0] in ("trained", "refused")]
            adc_trained = [n for n in specs if outcomes[n][0] == "trained"]
            lf_trained = [n for n in specs if cli[n][0] == "trained"]
            lf_only = [n for n in lf_trained if outcomes[n][0] != "trained"]
            both_not = [n for n in specs if outcomes[n][0] == "refused" and cli[n][0] != "trained"]
            adc_only = [n for n in adc_trained if cli[n][0] != "trained"]
            print(
                f"\nversus llamafactory-cli: {len(specs)} examples: ADC trained {len(adc_trained)} "
                f"(accepted or refused naming a key: {len(adc_accepted)}), llamafactory-cli trained "
                f"{len(lf_trained)} ({sum(1 for n in specs if cli[n][0] == 'refused')} refused naming a key, "
                f"{sum(1 for n in specs if cli[n][0] == 'failed')} failed)"
            )
            print(f"LF trains, ADC does not: {len(lf_only)}: {', '.join(lf_only) or '-'}")
            print(f"ADC refuses, LF does not train either: {len(both_not)}: {', '.join(both_not) or '-'}")
            print(f"ADC trains, LF does not: {len(adc_only)}: {', '.join(adc_only) or '-'}")
            passed = passed and not lf_only
        return 0 if passed else 1
    finally:
        stack.stop()
        env.close()


if __name__ == "__main__":
    sys.exit(main())
