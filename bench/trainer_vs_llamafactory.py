"""The same LLaMA-Factory YAML run by plain `llamafactory-cli train` and by ADC's worker, alternating in one run.

One local ADC stack (api, decider, executor, one worker with one CPU slot) stays up for the whole
run. Each round runs, one after the other (never at once, so they do not share the cores), in an
order that alternates between rounds, these arms:
  lf       `.venv-trainer/bin/llamafactory-cli train FILE` (LLaMA-Factory alone), in the environment
           the worker would give a trainer (worker/sandbox.py's allowlist: same threads, a fresh
           HOME and Hugging Face cache, like a job's), but no sandbox and no ADC code;
  trainer  ADC's trainer (`python -m worker.trainer`: LLaMA-Factory with ADC's callback and hooks)
           in that same environment plus an events and a stop file, started by the bench: no
           control plane, no sandbox. trainer/LF is the cost of ADC's hooks alone;
  adc      the same YAML as the `train` section of POST /v1/jobs: the worker launches ADC's trainer
           in its sandbox (uid, bwrap), and the control plane follows the job.
The YAML is LLaMA-Factory's example with only the model (a tiny local Llama), the dataset folder,
the step cap and bf16 changed, and `disable_tqdm: true` (ADC's default; set for all so that only
ADC's hooks differ). The first round is a warm-up (page cache, compiled bytecode), not counted.

Every arm is watched the same way while it runs (`Watch`): every 0.1 s the peak RSS of its
processes, found every 1 s as the descendants of its root (the bench's child for lf and trainer;
for adc the worker's descendants, the worker itself left out), and every 0.5 s one GET to the api
(adc: its job; the others: the job list), so the bench's own polling costs every arm alike.

Printed per run: samples/s (the trainer's own `train_samples_per_second` from train_results.json,
for all), peak RSS (the largest VmHWM among the run's processes), wall time (lf and trainer: the
command; adc: POST /v1/jobs -> `succeeded`), the CPU seconds the stack's own processes (api,
decider, executor, audit, worker, collector) used meanwhile, and the 1-minute load average at the
start. Then per preset: the trainer/LF and ADC/LF ratios per round and their median, min and max.

Usage: python bench/trainer_vs_llamafactory.py [--rounds 3] [--steps 40] [--size 13m]
                                               [--presets lora_sft,full_sft] [--arms lf,trainer,adc]
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


def _cpu_seconds(pids) -> float:
    """utime + stime of `pids` (not of their children), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return total / ticks


class Watch:
    """What the bench does while any arm runs, the same for every arm: VmHWM of the run's processes
    every 0.1 s (VmHWM only grows, so the last reading before exit is the peak), the processes found
    again every 1 s, and one api request every 0.5 s (`probe`, which says whether the run is over)."""

    PEAK_S, FIND_S, PROBE_S = 0.1, 1.0, 0.5

    def __init__(self, root: int, include_root: bool, probe) -> None:
        self.root, self.include_root, self.probe = root, include_root, probe
        self.peak = 0
        self.pids: set[int] = set()

    def run(self, done) -> None:
        """Poll until done() is true (checked at every probe, after the probe)."""
        found = probed = 0.0
        while True:
            now = time.perf_counter()
            if now - found >= self.FIND_S:
                found = now
                self.pids = _descendants(self.root) - (set() if self.include_root else {self.root})
            self.peak = max(self.peak, _tree_peak_rss(self.pids))
            if now - probed >= self.PROBE_S:
                probed = now
                answer = self.probe()
                if done(answer):
                    return
            time.sleep(self.PEAK_S)


class Arms:
    def __init__(self, http, stack, stack_root: Path) -> None:
        self.http, self.stack, self.stack_root = http, stack, stack_root
        self.service_pids = [p.pid for p in stack.procs.values()]

    def _list_jobs(self):
        return self.http.get("/v1/jobs", params={"limit": 1})

    def _local(self, kind: str, train: dict, folder: Path) -> dict:
        folder.mkdir(parents=True)
        out = folder / "out"
        path = folder / "train.yaml"
        path.write_text(yaml.safe_dump({**train, "output_dir": str(out)}, sort_keys=False))
        python = trainer_python()
        env = trainer_environment(job_dir=folder, python=python, repo_root=REPO, inherited=dict(os.environ),
                                  adc={}, tuning={})
        if kind == "lf":
            env.pop("PYTHONPATH")  # no ADC code in LLaMA-Factory's own run
            argv = [str(Path(python).parent / "llamafactory-cli"), "train", str(path)]
        else:
            env.update(ADC_EVENTS_FILE=str(folder / "events.jsonl"), ADC_STOP_FILE=str(folder / "STOP"))
            argv = [python, "-m", "worker.trainer", "--config", str(path)]
        cpu_before, load = _cpu_seconds(self.service_pids), os.getloadavg()[0]
        started = time.perf_counter()
        with open(folder / "run.log", "w") as log:
            # Its own session, as the worker starts a trainer: with the kernel's autogroup scheduling each
            # session is one CPU-sharing group, so a trainer inside the bench's session would share
            # one group's share with everything else started from that shell (measured: 13x slower).
            process = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            watch = Watch(process.pid, include_root=True, probe=self._list_jobs)
            watch.run(lambda _: process.poll() is not None)
        wall = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({process.returncode}); see {folder / 'run.log'}")
        results = json.loads((out / "train_results.json").read_text())
        return {"wall_s": wall, "rss": watch.peak, "samples_per_s": results["train_samples_per_second"],
                "stack_cpu_s": _cpu_seconds(self.service_pids) - cpu_before, "load": load}

    def lf(self, train: dict, folder: Path) -> dict:
        return self._local("lf", train, folder)

    def trainer(self, train: dict, folder: Path) -> dict:
        return self._local("trainer", train, folder)

    def adc(self, train: dict, folder: Path) -> dict:  # noqa: ARG002 - the job's folder is the stack's
        cpu_before, load = _cpu_seconds(self.service_pids), os.getloadavg()[0]
        started = time.perf_counter()
        r = self.http.post("/v1/jobs", json={"name": "bench-lf", "gpus": 1, "train": train})
        if r.status_code != 201:
            raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text[:500]}")
        job_id = r.json()["id"]
        worker = next(p.pid for name, p in self.stack.procs.items() if name.startswith("worker"))
        watch = Watch(worker, include_root=False, probe=lambda: self.http.get(f"/v1/jobs/{job_id}").json())

        def done(job) -> bool:
            if job["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} {job['status']}: {job.get('status_reason')}")
            return job["status"] == "succeeded"

        watch.run(done)
        wall = time.perf_counter() - started
        results = json.loads((self.stack_root / "data" / "jobs" / job_id / "output" / "train_results.json").read_text())
        return {"wall_s": wall, "rss": watch.peak, "samples_per_s": results["train_samples_per_second"],
                "stack_cpu_s": _cpu_seconds(self.service_pids) - cpu_before, "load": load, "job": job_id}


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  min {min(values):.3f}  max {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per preset (after one warm-up)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", default="13m", choices=sorted(SIZES))
    parser.add_argument("--presets", default="lora_sft,full_sft", help=f"comma-separated, of {', '.join(PRESETS)}")
    parser.add_argument("--arms", default="lf,trainer,adc", help="comma-separated, of lf, trainer, adc (lf needed)")
    args = parser.parse_args()
    presets = args.presets.split(",")
    arms = args.arms.split(",")
    if not EXAMPLES.is_dir() or any(p not in PRESETS for p in presets) or "lf" not in arms \
            or any(a not in ("lf", "trainer", "adc") for a in arms):
        print(f"need ../shared/llamafactory/examples, presets of {sorted(PRESETS)} and arms lf[,trainer][,adc]",
              file=sys.stderr)
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
        runner = Arms(http, stack, home / "stack")
        summary = []
        for preset in presets:
            train = train_section(preset, model, args.steps)
            by_round: dict[int, dict] = {}
            for round_ in range(args.rounds + 1):
                order = arms if round_ % 2 == 0 else arms[::-1]
                for kind in order:
                    r = getattr(runner, kind)(train, home / preset / f"{round_}-{kind}")
                    by_round.setdefault(round_, {})[kind] = r
                    print(f"{preset} round {round_}{' (warm-up)' if round_ == 0 else ''} {kind:<7} "
                          f"samples/s {r['samples_per_s']:8.3f}  peak RSS {r['rss'] / 2**20:7.0f} MiB  "
                          f"wall {r['wall_s']:6.1f} s  stack CPU {r['stack_cpu_s']:5.1f} s  load {r['load']:.2f}",
                          flush=True)
            counted = [by_round[i] for i in range(1, args.rounds + 1)]
            lines = [f"{preset}: {args.rounds} rounds after a warm-up, {args.steps} steps, model {args.size}"]
            for kind in (a for a in arms if a != "lf"):
                speed = [b[kind]["samples_per_s"] / b["lf"]["samples_per_s"] for b in counted]
                memory = [b[kind]["rss"] / b["lf"]["rss"] for b in counted]
                label = "ADC job" if kind == "adc" else "trainer"
                lines += [f"  samples/s {label}/LF  {spread(speed)}   per round {', '.join(f'{v:.3f}' for v in speed)}",
                          f"  peak RSS  {label}/LF  {spread(memory)}   per round {', '.join(f'{v:.3f}' for v in memory)}"]
            lines.append(f"  wall s    LF command {spread([b['lf']['wall_s'] for b in counted])}")
            if "trainer" in arms:
                lines.append(f"            trainer command {spread([b['trainer']['wall_s'] for b in counted])}")
            if "adc" in arms:
                lines.append(f"            ADC submit -> succeeded {spread([b['adc']['wall_s'] for b in counted])}")
            lines.append("  stack CPU s during " + ", ".join(
                f"{kind} {statistics.median([b[kind]['stack_cpu_s'] for b in counted]):.1f}" for kind in arms))
            summary.append("\n".join(lines))
        print("\n" + "\n".join(summary))
        return 0
    finally:
        stack.stop()
        env.close()


if __name__ == "__main__":
    sys.exit(main())
