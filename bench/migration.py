"""How long a lossless migration takes, measured on the real stack with real training.

For each model size: a LoRA job trains on one local worker, is migrated mid-training to the
other, and the figures come from the audit log and the status history:

  request -> decision           POST /v1/jobs/{id}/migrate (a move request) until the decider's
                                drain rule decided the migration
  decision -> devices freed     that decision until the checkpoint-stop returned
  decision -> training resumed  until the trainer's first progress on the target
  checkpoint size               the stop checkpoint on shared storage
  steps lost                    checkpointed step minus the step training resumed at (0 = none)

With --backend slurm, the same move runs on each backend side by side: the built-in workers and a
real one-host Slurm (cli/local_slurm.py, as root with slurm-wlm and munge), each one node with two
GPUs, the job moved to the node's other GPU (a new Slurm job for the Slurm backend).

Usage: python bench/migration.py [--sizes tiny,13m] [--steps 300] [--backend local|slurm]
Uses NATS_URL / DATABASE_URL when set, else starts its own NATS and Postgres. With --backend slurm the
Slurm run gets a database of its own beside DATABASE_URL's (its name + `_slurm`), so neither stack sees
the other's jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.stack import Stack, StackOptions, bus_keys_from_env  # noqa: E402
from worker.trainer.tiny_model import SIZES, build_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def wait(http: httpx.Client, job_id: str, pred, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if pred(job):
            return job
        if job["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"job {job_id} {job['status']}: {job['status_reason']}")
        time.sleep(0.05)
    raise TimeoutError(job_id)


def measure(stack: Stack, model: Path, steps: int) -> dict:
    http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
    spec = {
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
            "save_steps": 50,
            "seed": 1,
        },
    }
    job = http.post("/v1/jobs", json=spec).json()
    running = wait(http, job["id"], lambda j: j["status"] == "running" and (j["progress"] or {}).get("step", 0) >= 10)
    source = running["placement"][0]["node"]
    # Two nodes: to the other one; one node: to its other GPU (the drain rule places on the named node).
    target = source if len(stack.nodes) == 1 else ("node-2" if source == "node-1" else "node-1")
    r = http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})
    r.raise_for_status()
    # A request (202 with its request_id): the decider's drain rule answers it with a migrate decision
    # whose evidence names the request.
    request_id = r.json()["request_id"]
    moved = wait(http, job["id"], lambda j: j["attempt"] == 2 and j["status"] == "running")
    audit = http.get("/v1/audit", params={"job_id": job["id"], "limit": 1000}).json()["items"]
    ts = lambda e: datetime.fromisoformat(e["ts"]).timestamp()  # noqa: E731
    requested = next(e for e in audit if e["kind"] == "job.move_requested" and e["data"]["request_id"] == request_id)
    decided = next(
        e for e in audit if e["kind"] == "decision" and (e["evidence"] or {}).get("request_id") == request_id
    )
    decision_id = decided["decision_id"]
    stopped = next(e for e in audit if e["kind"] == "command.stop" and e["decision_id"] == decision_id)
    resumed = next(e for e in audit if e["kind"] == "job.running" and e["data"].get("attempt") == 2)
    events = Path(moved["job_dir"]) / "attempt-2" / "events.jsonl"
    started = next(json.loads(line) for line in events.read_text().splitlines() if '"started"' in line)
    ckpt = Path(stopped["data"]["checkpoint"])
    http.post(f"/v1/jobs/{job['id']}/cancel")
    return {
        "model": model.name,
        "decided_s": ts(decided) - ts(requested),
        "freed_s": ts(stopped) - ts(decided),
        "resumed_s": ts(resumed) - ts(decided),
        "checkpoint_mb": folder_size(ckpt) / 1e6,
        "steps_lost": stopped["data"]["step"] - started.get("step", 0),
        "stop_step": stopped["data"]["step"],
    }


def database_for(backend: str) -> str | None:
    url = os.environ.get("DATABASE_URL")
    return f"{url}_slurm" if url and backend == "slurm" else url


def run_backend(backend: str, sizes: list[str], steps: int, one_node: bool) -> list[dict]:
    """Each size migrated once on a fresh stack of `backend`: two nodes, or one node with two GPUs."""
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
                database_url=database_for(backend),
                prefix=f"benchmig{backend}{os.getpid()}",
                overrides={"controller": {"interval": 1}, "worker": {"heartbeat_interval": 1}},
                backend=backend,
            )
        )
        print(f"starting a local stack ({backend} backend) in {home} ...", flush=True)
        cleanup.callback(stack.stop)
        stack.start(progress=lambda *_: None)
        rows = []
        for size in sizes:
            model = home / "models" / size
            build_tiny_llama(model, SIZES[size])
            print(f"migrating a LoRA job on the {size} model ({backend}) ...", flush=True)
            rows.append(measure(stack, model, steps) | {"backend": backend})
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
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    if args.backend == "local":
        rows = run_backend("local", sizes, args.steps, one_node=False)
    else:
        rows = [r for b in ("local", "slurm") for r in run_backend(b, sizes, args.steps, one_node=True)]
    first = f"{'backend':<8} " if args.backend == "slurm" else ""
    print(
        f"\n{first}{'model':<8} {'request->decision s':>20} {'decision->freed s':>18} {'decision->resumed s':>20} {'checkpoint MB':>14} "
        f"{'stop step':>10} {'steps lost':>11}"
    )
    for r in rows:
        lead = f"{r['backend']:<8} " if args.backend == "slurm" else ""
        print(
            f"{lead}{r['model']:<8} {r['decided_s']:>20.2f} {r['freed_s']:>18.2f} {r['resumed_s']:>20.2f} {r['checkpoint_mb']:>14.2f} "
            f"{r['stop_step']:>10} {r['steps_lost']:>11}"
        )


if __name__ == "__main__":
    main()
