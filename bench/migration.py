"""How long a lossless migration takes, cold and warm side by side, on the real stack with real training.

For each model size, one uninterrupted LoRA job gives the reference weights; then the same job is
migrated mid-training from one local worker to the other twice: once with cold moves (the source
checkpoint-stops, then the target starts a new trainer: imports, dataset, model, checkpoint) and
once with warm moves (`controller.warm_moves`: the target's trainer is made ready to load the
checkpoint while the source trains on, then the source stops and the target loads the checkpoint
at once). The executor is restarted between the two with the setting changed. The source's
trainer is held (SIGSTOP to each process whose environment names the job) from its fifth step until the executor asks
it to stop, so that a tiny job cannot finish while the target gets ready; it trains again from the
stop request on, so the pause below is measured as it is. Figures come from the audit log and the trainers' events:

  decision -> source stopped   the migrate decision until the checkpoint-stop returned (warm: after
                               the target was ready, time a source spends training)
  decision -> target resumed   until the trainer's first progress on the target
  training paused              the source's last optimizer step until the target's first one: what
                               the move costs the job
  prepare s                    warm only: how long the target's trainer took to get ready
  stop s                       the checkpoint-stop command: the step in flight, the save, the exit
  save s                       the stop checkpoint's save (written, fsynced, renamed into place)
  go/start->step s             the target told to train (warm: its go; cold: its start) until its
                               first optimizer step is done (cold: imports, dataset, model, checkpoint)
  steps lost                   checkpointed step minus the step training resumed at (0 = none)
  weights                      the moved job's final adapter against the reference: identical or not

With --backend slurm, the same moves run on each backend side by side: the built-in workers and a
real one-host Slurm (cli/local_slurm.py, as root with slurm-wlm and munge), each one node with two
GPUs, the job moved to the node's other GPU (a new Slurm job for the Slurm backend). On Slurm the
moves are cold only.

Usage: python bench/migration.py [--sizes tiny,13m] [--steps 300] [--backend local|slurm] [--standby-trainers 0,1]
Uses NATS_URL / DATABASE_URL when set, else starts its own NATS and Postgres. With --backend slurm the
Slurm run gets a database of its own beside DATABASE_URL's (its name + `_slurm`), so neither stack sees
the other's jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.stack import Stack, StackOptions, bus_keys_from_env  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ADAPTER = "adapter_model.safetensors"


def wait(http: httpx.Client, job_id: str, pred, timeout: float = 900, poll: float = 0.05) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if pred(job):
            return job
        if job["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"job {job_id} {job['status']}: {job['status_reason']}")
        time.sleep(poll)
    raise TimeoutError(job_id)


def spec(model: Path, steps: int) -> dict:
    return {
        "name": f"bench-{model.name}",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(model),
            "stage": "sft",
            "finetuning_type": "lora",
            "lora_rank": 8,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(REPO / "examples" / "data"),
            "cutoff_len": 128,
            "max_samples": 64,
            "per_device_train_batch_size": 2,
            "learning_rate": 1e-3,
            "max_steps": steps,
            "logging_steps": 1,
            "save_steps": 1000,
            "seed": 1,
        },
    }


def weights(job: dict) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(job["output_dir"]) / ADAPTER))


def identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def events(job: dict, attempt: int) -> list[dict]:
    path = Path(job["job_dir"]) / f"attempt-{attempt}" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reference(http: httpx.Client, model: Path, steps: int) -> dict:
    job = http.post("/v1/jobs", json=spec(model, steps)).json()
    return weights(wait(http, job["id"], lambda j: j["status"] == "succeeded"))


def progress_step(events_file: Path) -> int:
    """The newest step a trainer has logged in its events file."""
    try:
        lines = events_file.read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(line).get("step", 0) for line in lines if '"progress"' in line), default=0)


def trainer_pids(job_id: str) -> list[int]:
    """This host's processes whose environment names the job: its trainer, on either backend."""
    mark = f"\0ADC_JOB_ID={job_id}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in b"\0" + (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def hold(stack: Stack, job_id: str, at_step: int, timeout: float = 600) -> Callable[[], None]:
    """Once the job's first trainer has logged `at_step`, hold it (SIGSTOP to its processes); returns what
    lets it go on. Watched on the job's events file every 10 ms, not over the API: a tiny model steps in
    ~20 ms and would finish first."""
    events_file = stack.home / "data" / "jobs" / job_id / "attempt-1" / "events.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if progress_step(events_file) >= at_step and (pids := trainer_pids(job_id)):
            signal_all(pids, signal.SIGSTOP)
            return functools.partial(signal_all, pids, signal.SIGCONT)
        time.sleep(0.01)
    raise TimeoutError(f"job {job_id} logged no step {at_step} within {timeout:.0f}s")


def standbys_ready(stack: Stack, node: str) -> int:
    """How many standby trainers the node's worker has ready (worker/standby.py notes it)."""
    try:
        return json.loads((stack.home / "data" / "nodes" / node / "standbys.json").read_text())["ready"]
    except (OSError, ValueError, KeyError):
        return 0


def wait_standbys(stack: Stack, nodes: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not all(standbys_ready(stack, n) for n in nodes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no standby trainer ready on {nodes}")
        time.sleep(0.2)


def measure(stack: Stack, http: httpx.Client, model: Path, steps: int, mode: str, expected: dict, standby: int) -> dict:
    job = http.post("/v1/jobs", json=spec(model, steps)).json()
    release = hold(stack, job["id"], at_step=5)
    try:
        running = wait(http, job["id"], lambda j: j["status"] == "running")  # the API may be behind the files
        source = running["placement"][0]["node"]
        # Two nodes: to the other one; one node: to its other GPU (the drain rule places on the named node).
        target = source if len(stack.nodes) == 1 else ("node-2" if source == "node-1" else "node-1")
        if standby and stack.o.backend == "local":  # the move starts once the target's standby trainer is ready
            wait_standbys(stack, [target])
        r = http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
        if r.is_error:
            raise RuntimeError(f"migrate {job['id']}: {r.status_code} {r.text[:500]}")
        request_id = r.json()["request_id"]  # the decider's drain rule answers it with a migrate decision
        wait(http, job["id"], lambda j: j["status"] != "running", poll=0.01)  # the executor asks for the stop
    finally:
        release()
    done = wait(http, job["id"], lambda j: j["status"] in ("succeeded", "failed", "cancelled"))
    if done["status"] != "succeeded" or done["attempt"] != 2:
        raise RuntimeError(f"{mode} move of {job['id']} ended {done['status']} at attempt {done['attempt']}")
    audit = http.get("/v1/audit", params={"job_id": job["id"], "limit": 1000}).json()["items"]
    ts = lambda e: datetime.fromisoformat(e["ts"]).timestamp()  # noqa: E731
    decided = next(
        e for e in audit if e["kind"] == "decision" and (e["evidence"] or {}).get("request_id") == request_id
    )
    stopped = next(e for e in audit if e["kind"] == "command.stop" and e["decision_id"] == decided["decision_id"])
    prepared = [e for e in audit if e["kind"] == "protocol.prepared" and e["decision_id"] == decided["decision_id"]]
    resumed = next(e for e in audit if e["kind"] == "job.running" and e["data"].get("attempt") == 2)
    # The target told to train: the go of a warm move, the start of a cold one.
    launched = next(
        e
        for e in audit
        if (e["kind"] == "protocol.resumed" and e["data"].get("ok"))
        or (e["kind"] == "command.start" and e["data"].get("attempt") == 2 and e["data"].get("ok"))
    )
    if bool(prepared) != (mode == "warm"):
        raise RuntimeError(f"the {mode} move of {job['id']} was {'warm' if prepared else 'cold'}")
    before = [e for e in events(done, 1) if e["event"] == "progress"]
    saved = [e for e in events(done, 1) if e["event"] == "checkpointed"][-1]
    after = events(done, 2)
    first = next(e for e in after if e["event"] == "progress")
    started = next(e for e in after if e["event"] == "started")
    return {
        "backend": stack.o.backend,
        "model": model.name,
        "mode": mode,
        "stopped_s": ts(stopped) - ts(decided),
        "resumed_s": ts(resumed) - ts(decided),
        "paused_s": first["ts"] - before[-1]["ts"],
        "prepare_s": prepared[0]["data"]["prepare_s"] if prepared else None,
        "save_s": saved.get("save_s"),
        "stop_s": stopped["data"]["stop_s"],
        "to_step_s": first["ts"] - ts(launched),
        "steps_lost": stopped["data"]["step"] - started.get("step", 0),
        "identical": identical(weights(done), expected),
    }


def use_warm_moves(stack: Stack, warm: bool) -> None:
    """The executor restarted with controller.warm_moves set (a clean stop hands its lease over at once)."""
    path = stack.home / "adc_config.yaml"
    config = yaml.safe_load(path.read_text())
    config.setdefault("controller", {})["warm_moves"] = warm
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    stack.kill("executor", signal.SIGTERM)
    stack.restart("executor")


def database_for(backend: str, suffix: str = "") -> str | None:
    """DATABASE_URL's database, or beside it one of each other stack (`_slurm`, a standby setting's)."""
    url = os.environ.get("DATABASE_URL")
    return f"{url}{'_slurm' if backend == 'slurm' else ''}{suffix}" if url else url


def run_backend(
    backend: str, sizes: list[str], steps: int, one_node: bool, standby: int = 1, db_suffix: str = ""
) -> list[dict]:
    """Each size: its reference weights, then its moves (cold and warm; Slurm: cold) on a fresh stack of
    `backend`: two nodes, or one node with two GPUs."""
    home = Path(tempfile.mkdtemp(prefix=f"adc-bench-migration-{backend}-"))
    home.chmod(0o755)  # a locally started Postgres runs as the postgres user and must reach it
    with contextlib.ExitStack() as cleanup:
        if backend == "slurm":
            from cli.local_slurm import LocalSlurm, slurm_missing

            if why := slurm_missing():
                raise SystemExit(f"--backend slurm: {why}")
            cluster = LocalSlurm(home / "slurm", gpus=2)
            print(f"starting a one-host Slurm in {cluster.home} ...", flush=True)
            cleanup.callback(cluster.stop)
            cluster.start()
            os.environ["SLURM_CONF"] = str(cluster.conf)  # the stack's workers inherit it
        stack = Stack(
            StackOptions(
                home=home,
                workers=1 if one_node else 2,
                simulate_gpus=2 if one_node else 0,
                api_port=0,
                nats_url=os.environ.get("NATS_URL"),
                bus_credentials=bus_keys_from_env(),
                database_url=database_for(backend, db_suffix),
                prefix=f"benchmig{backend}{os.getpid()}",
                overrides={
                    "controller": {"interval": 1},
                    "worker": {"heartbeat_interval": 1, "standby_trainers": standby},
                },
                backend=backend,
            )
        )
        print(f"starting a local stack ({backend} backend) in {home} ...", flush=True)
        cleanup.callback(stack.stop)
        stack.start(progress=lambda *_: None)
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
        rows = []
        for size in sizes:
            model = home / "models" / size
            build_tiny_llama(model, SIZES[size])
            print(f"training the {size} model uninterrupted for the reference weights ({backend}) ...", flush=True)
            expected = reference(http, model, steps)
            for mode in ("cold", "warm") if backend == "local" else ("cold",):
                use_warm_moves(stack, mode == "warm")
                print(f"migrating a LoRA job on the {size} model, {mode} ({backend}) ...", flush=True)
                rows.append(measure(stack, http, model, steps, mode, expected, standby))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,13m", help=f"model sizes among {sorted(SIZES)}")
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps of each job (enough to outlast the move)"
    )
    parser.add_argument(
        "--backend",
        choices=("local", "slurm"),
        default="local",
        help="local: the built-in workers, node to node (default); slurm: the built-in workers and Slurm side "
        "by side, each moving the job to the other GPU of one node",
    )
    parser.add_argument(
        "--standby-trainers",
        default="1",
        help="worker.standby_trainers of the stack's workers (worker/standby.py); a list such as 0,1 runs a stack "
        "for each, one table each",
    )
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    settings = [int(n) for n in args.standby_trainers.split(",")]
    for standby in settings:
        suffix = f"_standby{standby}" if len(settings) > 1 else ""  # each stack its own database
        if args.backend == "local":
            rows = run_backend("local", sizes, args.steps, one_node=False, standby=standby, db_suffix=suffix)
        else:
            rows = [
                r
                for b in ("local", "slurm")
                for r in run_backend(b, sizes, args.steps, one_node=True, standby=standby, db_suffix=suffix)
            ]
        print_table(standby, rows)  # each stack's as soon as it is done


def print_table(standby: int, rows: list[dict]) -> None:
    print(f"\nworker.standby_trainers: {standby}")
    print(
        f"\n{'backend':<8} {'model':<8} {'move':<5} {'decision->source stopped s':>27} {'decision->target resumed s':>27} "
        f"{'training paused s':>18} {'prepare s':>10} {'stop s':>7} {'save s':>7} {'go/start->step s':>17} "
        f"{'steps lost':>11} {'weights':>10}"
    )
    for r in rows:
        prepare = f"{r['prepare_s']:.2f}" if r["prepare_s"] is not None else "-"
        save = f"{r['save_s']:.2f}" if r["save_s"] is not None else "-"
        print(
            f"{r['backend']:<8} {r['model']:<8} {r['mode']:<5} {r['stopped_s']:>27.2f} {r['resumed_s']:>27.2f} "
            f"{r['paused_s']:>18.2f} {prepare:>10} {r['stop_s']:>7.2f} {save:>7} {r['to_step_s']:>17.2f} "
            f"{r['steps_lost']:>11} {'identical' if r['identical'] else 'DIFFERENT':>10}"
        )


if __name__ == "__main__":
    main()
