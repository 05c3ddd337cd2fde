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
  sandbox  (not run unless named in --arms) that trainer inside the worker's sandbox
           (worker/sandbox.py's bwrap view, pid namespace and uid `nobody`), started by the bench:
           sandbox/trainer is bwrap's cost, adc/sandbox the control plane's;
  adc      the same YAML as the `train` section of POST /v1/jobs: the worker launches ADC's trainer
           in its sandbox (uid, bwrap), and the control plane follows the job.
The YAML is LLaMA-Factory's example with only the model (a tiny local Llama), the dataset folder,
the step cap and bf16 changed, and `disable_tqdm: true` (ADC's default; set for all so that only
ADC's hooks differ). The first round is a warm-up (page cache, compiled bytecode), not counted
(`--no-warmup`: none, for a smoke run that only shows the bench works).
Every arm's rank gets the same CPU threads (`--threads`, default 1): OMP_NUM_THREADS for the
bench's commands, the worker's `--cpu-cores` (so its `OMP_NUM_THREADS`) for the job.

The loop's cost, robust to a shared machine. Wall-clock samples/s on a machine others use too
swings 20-40 % from round to round (a run waits for the cores whenever someone else has them),
so it cannot decide a 1 % difference. CPU time does not count the waiting: the bench reads the
CPU seconds the training process tree has used (utime + stime of every thread, exited ones
included, and of its dataloader workers and other descendants, plus those already waited for:
/proc/<pid>/stat, `tree_cpu_seconds`) at each logging step, when LLaMA-Factory's own LogCallback
appends a line to `output_dir/trainer_log.jsonl` (a thread polls that file every 5 ms, at nice -10
when root; `LoopClock`). Both programs write that file the same way (ADC keeps LLaMA-Factory's
callbacks), so the same reading applies to lf, trainer, sandbox and adc (the job's process tree
found from /proc by its folder), and nothing is added to any of them. The loop is from the first
logged step to the last (the start-up and the first window, with the dataloader's first batches,
and the end-of-training save are outside it); every arm trains the same steps on the same
samples in the same order (same seed), so CPU per step is compared on identical work.
`samples per loop CPU-s X/LF` = LF's loop CPU / X's loop CPU on the steps both measured, per
round (the arms of a round run back to back), with the median, min and max over rounds; all
rounds pooled (summed CPU); and the best of rounds: each step's cheapest CPU over the rounds (its
logging window's, per step), for LF and for X, summed, with the range of that figure when each
round is left out in turn. With 1 thread per rank the CPU time is the time the loop would take on
an idle machine; with more, OpenMP threads spinning in barriers while another process holds a
core would add CPU time, which is why the default is 1. CPU time is not immune either: another
program taking turns on the same core evicts the loop's data from the core's caches, and the loop
spends more CPU refilling them (measured here at load 4-7 on 2 cores: 160 to 210 ms per LoRA
step, round to round). So from its first mark on, the loop clock also gives every process of the
arm's tree the autogroup nice `--nice` (default -20, root only: /proc/<pid>/autogroup; each
trainer is started in its own session, so its own autogroup), and the bench's own session the
same: the kernel then hands the trainer its core before other sessions' programs, and the loop
runs with its caches its own (then 155-168 ms per step at load 2-8, wall about equal to CPU).
The noise left only adds, so the best of rounds is the least disturbed figure, and the median
and the pooled figure stand beside it; enough steps that the loop is 10-20 CPU s (/proc counts
CPU in 10 ms ticks). What is left: rounds' ratios between 0.95 and 1.07, and a whole run's median
within about ±2 % of another run's (docs/benchmarks.md: three runs side by side), so a 1 % threshold sits at
the edge of what one run decides on a shared 2-core machine. The loop's wall time between the same
two lines is printed too (`loop wall-s`). `--summary runs.json` prints a finished run's figures again.

While any arm runs the bench does the same: one GET to the api every 0.5 s (adc: its job; the
others: the job list), so the bench's own polling costs every arm alike; nothing else.

Peak RSS is the kernel's high-water mark, exact rather than sampled: the largest VmHWM of the
training process and of the child processes it waited for (dataset preprocessing and dataloader
workers). For lf, trainer and sandbox the bench is the parent and takes it from `wait4()` at the
exit (`ru_maxrss`); a job's trainer has the worker's sandbox as its parent, so for adc it is the
same number as the trainer reads it for itself at its end (`peak_rss_bytes` of its `succeeded`
event, worker/trainer/peak_rss.py). The trainer arm has both, printed side by side (`event`).

Printed per run: samples/s (the trainer's own `train_samples_per_second` from train_results.json,
for all), the loop's steps, CPU seconds (per step, and the cheapest and dearest logging window)
and wall seconds, peak RSS, wall time (lf, trainer and sandbox: the command; adc: the job's submitted_at ->
finished_at as the control plane recorded them, and as the bench saw `succeeded`), the CPU seconds
of the training process tree (from wait4; not for adc), the CPU seconds the stack's own processes
(api, decider, executor, audit, worker, collector) used meanwhile, and the 1-minute load average at
the start. Then per preset: the ratios to LF per round and their median, min and max. Every run's figures
and loop marks are written to runs.json in the bench's temporary folder (printed at the end).

Usage: python bench/trainer_vs_llamafactory.py [--rounds 3] [--steps 40 | --steps lora_sft=100,full_sft=400]
                                               [--size 13m] [--presets lora_sft,full_sft]
                                               [--arms lf,trainer,adc] [--threads 1] [--no-warmup]
(NATS_URL / DATABASE_URL as for the tests; a fresh bus prefix and database per run)
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example  # noqa: E402
from worker.launch_check import code_folders  # noqa: E402
from worker.sandbox import Identity, bubblewrap, bwrap_argv, own_folders, trainer_environment  # noqa: E402
from worker.trainer.interpreter import trainer_python  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402

# Example -> keys dropped (full SFT's example names ZeRO-3, which plain LLaMA-Factory runs only
# under torchrun with FORCE_TORCHRUN; the comparison is of one process each).
PRESETS = {
    "lora_sft": ("train_lora/qwen3_lora_sft.yaml", ()),
    "full_sft": ("train_full/qwen3_full_sft.yaml", ("deepspeed",)),
    "dpo": ("train_lora/qwen3_lora_dpo.yaml", ()),
}
ARMS = ("lf", "trainer", "sandbox", "adc")
PROBE_S = 0.5


def train_section(preset: str, model: Path, steps: int) -> dict:
    example, dropped = PRESETS[preset]
    train = adapted_example(example, model, steps)
    for key in dropped:
        train.pop(key, None)
    # One save at the end for both (LLaMA-Factory's final model), no periodic checkpoint.
    return {**train, "disable_tqdm": True, "save_steps": 10 * steps}


def _cpu_seconds(pids) -> float:
    """utime + stime of `pids` (not of their children), in seconds."""
    total = 0
    for pid in pids:
        fields = _proc_stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (field 3, state, is [0])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(root: int) -> set[int]:
    """`root` and its live descendants."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None:
                parent[int(entry.name)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in tree]
        tree.update(kids)
        frontier += kids
    return tree


def tree_cpu_seconds(root: int, tree: set[int]) -> float | None:
    """CPU seconds of a process tree so far (`tree`: `process_tree(root)`): for `root` and every live
    descendant, utime + stime (all its threads, exited ones included) + cutime + cstime (its children
    already waited for). A process waited for is no longer live, so nothing is counted twice. None
    once root is gone."""
    ticks, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in tree:  # read together, right after the scan: the instant of the reading is this one
        fields = _proc_stat(pid)
        if fields is None:
            if pid == root:
                return None
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / ticks


class LoopClock:
    """The training loop's CPU time and wall time, read the same way from outside for every arm.

    LLaMA-Factory's own LogCallback appends a line to `output_dir/trainer_log.jsonl` at every
    logging step (`current_steps`), in plain LLaMA-Factory as in ADC's trainer, which keeps
    LLaMA-Factory's callbacks. This thread polls that file's size every POLL_S; when a line has
    been added it reads the CPU seconds of the trainer's process tree (`tree_cpu_seconds`) and the
    wall clock, and records them with the line's step. Nothing is added to the trainer."""

    POLL_S = 0.005

    def __init__(self, log_file: Path, root_pid, nice: int | None = None) -> None:
        self.log_file, self.root_pid = log_file, root_pid  # root_pid(): the trainer's outermost pid, or None yet
        self.nice = nice
        self.marks: list[tuple[int, float, float]] = []  # (step, CPU s, wall s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoopClock:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        if os.geteuid() == 0:  # woken at once when the line appears, even on a loaded machine
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
            except OSError:
                pass
        size, pid = 0, None
        while not self._stop.wait(self.POLL_S):
            try:
                now = self.log_file.stat().st_size
            except OSError:
                continue
            if now == size:
                continue
            text = self.log_file.read_bytes()
            if not text.endswith(b"\n"):
                continue  # a line being written: read at the next poll
            size = len(text)
            line = json.loads(text.splitlines()[-1])
            if "loss" not in line:  # the end-of-training line (train_runtime, ...), after the final save
                continue
            pid = pid or self.root_pid()
            tree = process_tree(pid) if pid else set()  # one scan of /proc: read here, prioritized below
            cpu = tree_cpu_seconds(pid, tree) if pid else None
            wall = time.perf_counter()
            if cpu is not None and (not self.marks or line["current_steps"] > self.marks[-1][0]):
                self.marks.append((int(line["current_steps"]), cpu, wall))
                prioritize(tree, self.nice)  # from the first mark on: the loop measured

    def loop(self) -> dict | None:
        """From the first logged step to the last: steps, CPU s, wall s, and CPU s per step of each
        logging window. The first window (model and dataloader start, first batches) is left out."""
        marks = self.marks
        if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
            return None
        windows = [(c2 - c1) / (s2 - s1) for (s1, c1, _), (s2, c2, _) in zip(marks, marks[1:]) if s2 > s1]
        return {
            "steps": marks[-1][0] - marks[0][0],
            "cpu_s": marks[-1][1] - marks[0][1],
            "wall_s": marks[-1][2] - marks[0][2],
            "window_cpu_per_step": windows,
            "marks": marks,
        }


def _trainer_pid(job_dir: Path) -> int | None:
    """The outermost process of a job's trainer (the sandbox's bwrap, or the trainer itself)."""
    matching = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker.trainer" in argv and any(str(job_dir).encode() in a for a in argv):
            fields = _proc_stat(int(entry.name))
            if fields is not None:
                matching[int(entry.name)] = int(fields[1])
    outer = [pid for pid, ppid in matching.items() if ppid not in matching]
    return min(outer) if outer else None


def prioritize(pids, nice: int | None) -> None:
    """Give the autogroups (one per session: each trainer is started in its own) of `pids` this
    nice value, so that on a shared machine the kernel hands their core to them before other
    sessions' programs. Needs root; a no-op with nice None."""
    if nice is None:
        return
    for pid in pids:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:
            continue


def _terminal_event(events_file: Path) -> dict:
    lines = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    return next((e for e in reversed(lines) if e["event"] in ("succeeded", "stopped", "failed", "oom")), {})


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


class Arms:
    def __init__(self, http, stack, stack_root: Path, readable: list[Path], threads: int, nice: int | None) -> None:
        self.http, self.stack, self.stack_root, self.readable = http, stack, stack_root, readable
        self.threads, self.nice = threads, nice
        self.service_pids = [p.pid for p in stack.procs.values()]
        self.nobody = pwd.getpwnam("nobody")

    def _probe_until(self, done) -> None:
        """What the bench does while any arm runs: one api request every PROBE_S until done()."""
        while True:
            answer = self.http.get("/v1/jobs", params={"limit": 1})
            if done(answer):
                return
            time.sleep(PROBE_S)

    def _local(self, kind: str, train: dict, folder: Path) -> dict:
        folder.mkdir(parents=True)
        out = folder / "out"
        path = folder / "train.yaml"
        path.write_text(yaml.safe_dump({**train, "output_dir": str(out)}, sort_keys=False))
        python = trainer_python()
        env = trainer_environment(
            job_dir=folder, python=python, repo_root=REPO, inherited=dict(os.environ), adc={}, tuning={}
        )
        env["OMP_NUM_THREADS"] = str(self.threads)  # what the worker gives a rank (its --cpu-cores share)
        if kind == "lf":
            env.pop("PYTHONPATH")  # no ADC code in LLaMA-Factory's own run
            argv = [str(Path(python).parent / "llamafactory-cli"), "train", str(path)]
        else:
            env.update(ADC_EVENTS_FILE=str(folder / "events.jsonl"), ADC_STOP_FILE=str(folder / "STOP"))
            argv = [python, "-m", "worker.trainer", "--config", str(path)]
        if kind == "sandbox":  # as the worker wraps a job's trainer (worker/launch_check.py plans the view)
            identity = Identity(self.nobody.pw_uid, self.nobody.pw_gid)
            own_folders(identity, [folder])
            argv = bwrap_argv(
                bubblewrap(), identity, argv, writable=folder, readable=[*self.readable, *code_folders()], hidden=[]
            )
        cpu_before, load = _cpu_seconds(self.service_pids), os.getloadavg()[0]
        exit_: dict = {}
        started = time.perf_counter()
        with (
            open(folder / "run.log", "w") as log,
            LoopClock(out / "trainer_log.jsonl", lambda: process.pid, self.nice) as clock,
        ):
            # Its own session, as the worker starts a trainer: with the kernel's autogroup scheduling each
            # session is one CPU-sharing group, so a trainer inside the bench's session would share
            # one group's share with everything else started from that shell (measured: 13x slower).
            process = subprocess.Popen(
                argv,
                cwd=folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

            def reap() -> None:  # blocks in wait4: the exit's instant, status and rusage, nothing polled
                _, status, usage = os.wait4(process.pid, 0)
                exit_.update(wall=time.perf_counter() - started, status=status, usage=usage)
                process.returncode = os.waitstatus_to_exitcode(status)

            reaper = threading.Thread(target=reap, daemon=True)
            reaper.start()
            self._probe_until(lambda _: not reaper.is_alive())
        if process.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({process.returncode}); see {folder / 'run.log'}")
        results = json.loads((out / "train_results.json").read_text())
        usage = exit_["usage"]
        run = {
            "wall_s": exit_["wall"],
            "rss": usage.ru_maxrss * 1024,
            "samples_per_s": results["train_samples_per_second"],
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "stack_cpu_s": _cpu_seconds(self.service_pids) - cpu_before,
            "load": load,
            "loop": clock.loop(),
        }
        if kind != "lf":
            run["rss_event"] = _terminal_event(folder / "events.jsonl").get("peak_rss_bytes")
        return run

    def lf(self, train: dict, folder: Path) -> dict:
        return self._local("lf", train, folder)

    def trainer(self, train: dict, folder: Path) -> dict:
        return self._local("trainer", train, folder)

    def sandbox(self, train: dict, folder: Path) -> dict:
        return self._local("sandbox", train, folder)

    def adc(self, train: dict, folder: Path) -> dict:  # noqa: ARG002 - the job's folder is the stack's
        cpu_before, load = _cpu_seconds(self.service_pids), os.getloadavg()[0]
        started = time.perf_counter()
        r = self.http.post("/v1/jobs", json={"name": "bench-lf", "gpus": 1, "train": train})
        if r.status_code != 201:
            raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text[:500]}")
        job_id = r.json()["id"]
        job: dict = {}
        job_dir = self.stack_root / "data" / "jobs" / job_id

        def done(answer) -> bool:
            job.update(answer.json())
            if job["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} {job['status']}: {job.get('status_reason')}")
            return job["status"] == "succeeded"

        with LoopClock(job_dir / "output" / "trainer_log.jsonl", lambda: _trainer_pid(job_dir), self.nice) as clock:
            while True:  # the same requests as the other arms' probes, for this job
                if done(self.http.get(f"/v1/jobs/{job_id}")):
                    break
                time.sleep(PROBE_S)
        seen = time.perf_counter() - started
        results = json.loads((job_dir / "output" / "train_results.json").read_text())
        events_file = job_dir / f"attempt-{job['attempt']}" / "events.jsonl"
        return {
            "wall_s": _seconds(job["finished_at"]) - _seconds(job["submitted_at"]),
            "seen_s": seen,
            "rss": _terminal_event(events_file)["peak_rss_bytes"],
            "samples_per_s": results["train_samples_per_second"],
            "cpu_s": None,
            "stack_cpu_s": _cpu_seconds(self.service_pids) - cpu_before,
            "load": load,
            "job": job_id,
            "loop": clock.loop(),
        }


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  min {min(values):.3f}  max {max(values):.3f}"


def _line(preset: str, round_: int, kind: str, r: dict) -> str:
    event = f" (event {r['rss_event'] / 2**20:.1f})" if r.get("rss_event") is not None else ""
    extra = f"  seen {r['seen_s']:5.1f} s" if r.get("seen_s") is not None else ""
    cpu = f"{r['cpu_s']:6.1f} s" if r["cpu_s"] is not None else "     - "
    loop = r["loop"]
    if loop is not None:
        windows = loop["window_cpu_per_step"]
        extra += (
            f"  loop {loop['steps']} steps: CPU {loop['cpu_s']:6.2f} s ({1000 * loop['cpu_s'] / loop['steps']:.1f} ms/step,"
            f" windows {min(windows) * 1000:.1f}-{max(windows) * 1000:.1f}), wall {loop['wall_s']:6.2f} s"
        )
    else:
        extra += "  loop -"
    return (
        f"{preset} round {round_}{' (warm-up)' if round_ == 0 else ''} {kind:<7} "
        f"samples/s {r['samples_per_s']:8.3f}  peak RSS {r['rss'] / 2**20:7.1f} MiB{event}  "
        f"wall {r['wall_s']:6.2f} s  CPU {cpu}  stack CPU {r['stack_cpu_s']:5.1f} s  load {r['load']:.2f}{extra}"
    )


def _step_costs(run: dict) -> dict[int, tuple[float, float]]:
    """Each step of a run's loop -> (CPU s, wall s): its logging window's, spread evenly over the window's steps."""
    marks = run["loop"]["marks"] if run.get("loop") else []
    costs = {}
    for (s1, c1, w1), (s2, c2, w2) in zip(marks, marks[1:]):
        for step in range(s1 + 1, s2 + 1):
            costs[step] = ((c2 - c1) / (s2 - s1), (w2 - w1) / (s2 - s1))
    return costs


def _common(costs: list[dict]) -> list[int]:
    steps = set.intersection(*(set(c) for c in costs))
    if not steps:
        raise RuntimeError("no loop steps common to the runs (fewer than two logging steps seen?): use more --steps")
    return sorted(steps)


def _ratio(lf: dict, arm: dict, which: int) -> float:
    """LF's loop cost / the arm's, on the steps both measured (the same samples): samples per loop CPU-s
    (which=0) or wall-s (which=1), arm/LF."""
    steps = _common([lf, arm])
    return sum(lf[s][which] for s in steps) / sum(arm[s][which] for s in steps)


def _best_of_rounds(lf: list[dict], arm: list[dict]) -> float:
    """Each step's cheapest CPU over the rounds, for LF and for the arm, summed over the steps all
    runs measured: LF's sum / the arm's. Another program on the core only adds CPU (cache refills
    after it), so the cheapest round of a step is the one least disturbed."""
    steps = _common(lf + arm)
    return sum(min(c[s][0] for c in lf) for s in steps) / sum(min(c[s][0] for c in arm) for s in steps)


def _figures(values: list[float], digits: int = 3) -> str:
    return f"{spread(values)}   per round {', '.join(f'{v:.{digits}f}' for v in values)}"


def summarize(preset: str, by_round: dict[int, dict], steps: int, size: str, threads: int, nice: int | None) -> str:
    arms = list(by_round[min(by_round)])
    counted = [by_round[i] for i in sorted(by_round) if i > 0]
    costs = [{kind: _step_costs(b[kind]) for kind in arms} for b in counted]
    lines = [
        f"{preset}: {len(counted)} rounds {'after a' if 0 in by_round else 'without'} warm-up, {steps} steps, model {size}, {threads} thread(s) per rank, "
        f"loop at autogroup nice {nice if nice is not None else 'as started'}"
    ]
    labels = {"trainer": "trainer", "sandbox": "sandbox", "adc": "ADC job"}
    for kind in (a for a in arms if a != "lf"):
        loop_cpu = [_ratio(c["lf"], c[kind], 0) for c in costs]
        loop_wall = [_ratio(c["lf"], c[kind], 1) for c in costs]
        pooled = sum(sum(c["lf"][s][0] for s in _common([c["lf"], c[kind]])) for c in costs) / sum(
            sum(c[kind][s][0] for s in _common([c["lf"], c[kind]])) for c in costs
        )
        best = _best_of_rounds([c["lf"] for c in costs], [c[kind] for c in costs])
        without = (
            [
                _best_of_rounds([c["lf"] for c in costs if c is not left], [c[kind] for c in costs if c is not left])
                for left in costs
            ]
            if len(costs) > 1
            else [best]
        )
        speed = [b[kind]["samples_per_s"] / b["lf"]["samples_per_s"] for b in counted]
        memory = [b[kind]["rss"] / b["lf"]["rss"] for b in counted]
        lines += [
            f"  samples per loop CPU-s {labels[kind]}/LF  {_figures(loop_cpu, 4)}",
            f"      all rounds pooled {pooled:.4f}; best of rounds per step {best:.4f} "
            f"(each round left out in turn: {min(without):.4f}-{max(without):.4f})",
            f"  samples per loop wall-s {labels[kind]}/LF  {_figures(loop_wall)}",
            f"  samples/s {labels[kind]}/LF  {_figures(speed)}",
            f"  peak RSS  {labels[kind]}/LF  {_figures(memory)}",
        ]
    lines.append(
        "  loop CPU ms/step  "
        + ", ".join(
            f"{kind} {1000 * statistics.median([b[kind]['loop']['cpu_s'] / b[kind]['loop']['steps'] for b in counted]):.1f}"
            for kind in arms
        )
        + "   within a run, dearest/cheapest logging window (median over rounds)  "
        + ", ".join(
            f"{kind} {statistics.median([max(w) / min(w) for b in counted for w in [b[kind]['loop']['window_cpu_per_step']]]):.3f}"
            for kind in arms
        )
    )
    lines.append(
        "  peak RSS MiB  "
        + ", ".join(f"{kind} {statistics.median([b[kind]['rss'] for b in counted]) / 2**20:.1f}" for kind in arms)
    )
    lines.append(f"  wall s    LF command {spread([b['lf']['wall_s'] for b in counted])}")
    for kind in (a for a in arms if a in ("trainer", "sandbox")):
        lines.append(f"            {kind} command {spread([b[kind]['wall_s'] for b in counted])}")
    if "adc" in arms:
        lines.append(f"            ADC submit -> succeeded {spread([b['adc']['wall_s'] for b in counted])}")
    lines.append(
        "  stack CPU s during "
        + ", ".join(f"{kind} {statistics.median([b[kind]['stack_cpu_s'] for b in counted]):.1f}" for kind in arms)
    )
    lines.append("  load at start  " + ", ".join(f"{b[kind]['load']:.2f}" for b in counted for kind in arms))
    return "\n".join(lines)


def print_summary(paths: list[Path]) -> int:
    """The figures of one or more finished runs: each preset's counted rounds of every run, pooled
    (the first run's warm-up round stands for all; warm-ups are never counted)."""
    pooled: dict[str, tuple[tuple, dict[int, dict]]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for preset, run in data["presets"].items():
            setting = (run["steps"], data["size"], data["threads"], data.get("nice"))
            rounds = {int(k): v for k, v in run["by_round"].items()}
            if preset not in pooled:
                pooled[preset] = (setting, {k: v for k, v in rounds.items() if k == 0})
            elif pooled[preset][0] != setting:
                print(
                    f"{path}: {preset} ran with (steps, size, threads, nice) {setting}, the runs before with "
                    f"{pooled[preset][0]}: not pooled",
                    file=sys.stderr,
                )
                return 1
            by_round = pooled[preset][1]
            for i in sorted(k for k in rounds if k > 0):
                by_round[max(by_round, default=0) + 1] = rounds[i]
    for preset, ((steps, size, threads, nice), by_round) in pooled.items():
        print(summarize(preset, by_round, steps, size, threads, nice))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per preset (after one warm-up)")
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="no warm-up round: the first counted round pays the page cache and bytecode (a smoke run)",
    )
    parser.add_argument(
        "--steps", default="40", help="steps per run: N for every preset, or per preset (lora_sft=100,full_sft=400)"
    )
    parser.add_argument("--size", default="13m", choices=sorted(SIZES))
    parser.add_argument("--presets", default="lora_sft,full_sft", help=f"comma-separated, of {', '.join(PRESETS)}")
    parser.add_argument("--arms", default="lf,trainer,adc", help=f"comma-separated, of {', '.join(ARMS)} (lf needed)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads per rank for every arm (OMP_NUM_THREADS; the worker's --cpu-cores)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=-20,
        help="autogroup nice of every arm's training processes during the measured loop, and of the "
        "bench's own session (root only; 0 to leave all at the default)",
    )
    parser.add_argument(
        "--summary",
        metavar="RUNS_JSON",
        nargs="+",
        help="print the figures of finished runs' runs.json, their counted rounds pooled per preset "
        "(runs of a preset must agree on steps, size, threads and nice); run nothing",
    )
    args = parser.parse_args()
    if args.summary:
        return print_summary([Path(p) for p in args.summary])
    presets = args.presets.split(",")
    if "=" in args.steps:
        steps = {k: int(v) for k, v in (item.split("=") for item in args.steps.split(","))}
    else:
        steps = dict.fromkeys(presets, int(args.steps))
    arms = args.arms.split(",")
    if (
        not EXAMPLES.is_dir()
        or any(p not in PRESETS or p not in steps for p in presets)
        or "lf" not in arms
        or any(a not in ARMS for a in arms)
    ):
        print(
            f"need ../shared/llamafactory/examples, presets of {sorted(PRESETS)} and arms lf and any of {ARMS}",
            file=sys.stderr,
        )
        return 1
    if "sandbox" in arms and (os.geteuid() != 0 or bubblewrap() is None):
        print("the sandbox arm needs root (to switch to uid nobody) and a working bwrap", file=sys.stderr)
        return 1

    import httpx

    from cli.stack import Stack, StackOptions
    from tests.conftest import Isolated

    home = Path(tempfile.mkdtemp(prefix="adc-bench-lf-"))
    home.chmod(0o755)  # the trainers' unprivileged uid reads the model
    model = build_tiny_llama(home / "model", SIZES[args.size])
    env = Isolated(nodes=("node-1",)).open()
    roots = [REPO, home, EXAMPLES.parent]
    stack = Stack(
        StackOptions(
            home=home / "stack",
            workers=1,
            cpu_slots=1,
            api_port=0,
            nats_url=env.nats_url,
            bus_credentials=env.keys.directory,
            database_url=env.database_url,
            prefix=env.prefix,
            roots=roots,
            # The examples set trust_remote_code: true, which runs only for a model in a trusted code root.
            overrides={
                "controller": {"interval": 1},
                "worker": {"heartbeat_interval": 1},
                "tenancy": {"trusted_code_roots": [str(model)]},
            },
            # one CPU slot offered this many cores: its trainer gets OMP_NUM_THREADS=threads
            worker_args={"node-1": ["--cpu-cores", str(args.threads)]},
        )
    )
    # SIGTERM (a killed benchmark) still stops the stack, its trainer and the bus in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stack.start(progress=lambda *_: None)
    try:
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        nice = args.nice if args.nice and os.geteuid() == 0 else None
        prioritize([os.getpid()], nice)  # the loop clock's readings come at once
        runner = Arms(http, stack, home / "stack", readable=roots, threads=args.threads, nice=nice)
        summary, raw = [], {}
        for preset in presets:
            train = train_section(preset, model, steps[preset])
            by_round: dict[int, dict] = {}
            for round_ in range(1 if args.no_warmup else 0, args.rounds + 1):
                order = arms if round_ % 2 == 0 else arms[::-1]
                for kind in order:
                    r = getattr(runner, kind)(train, home / preset / f"{round_}-{kind}")
                    by_round.setdefault(round_, {})[kind] = r
                    print(_line(preset, round_, kind, r), flush=True)
            raw[preset] = {"steps": steps[preset], "by_round": by_round}
            summary.append(summarize(preset, by_round, steps[preset], args.size, args.threads, nice))
        (home / "runs.json").write_text(
            json.dumps(
                {"size": args.size, "threads": args.threads, "nice": nice, "presets": raw}, indent=1, default=str
            )
        )
        print("\n" + "\n".join(summary) + f"\n(every run's figures and loop marks: {home / 'runs.json'})")
        return 0
    finally:
        stack.stop()
        env.close()


if __name__ == "__main__":
    sys.exit(main())
