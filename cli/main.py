"""`adc`: the command line for ADC's users and SREs, and the local stack (`adc up`, `adc demo`)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cli.client import ApiClient, ApiError, adc_home
from cli.render import TERMINAL, audit_lines, follow, table
from shared.job_spec import wrap_bare_llamafactory

REPO_ROOT = Path(__file__).resolve().parent.parent


def _print(data: Any, args: argparse.Namespace, human) -> None:
    if getattr(args, "output", "table") == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human(data))


# --- stack ---------------------------------------------------------------------------

def _stack(args: argparse.Namespace):
    from cli.stack import Stack, StackOptions

    return Stack(StackOptions(
        home=Path(args.home), workers=args.workers, simulate_gpus=args.simulate_gpus, gpu_memory=args.gpu_memory,
        cpu_slots=args.cpu_slots, api_port=args.port, nats_url=os.environ.get("NATS_URL"),
        database_url=os.environ.get("DATABASE_URL"),
    ))


def cmd_up(args: argparse.Namespace) -> int:
    stack = _stack(args)
    try:
        stack.start()
        print(f"ADC is up. API: {stack.api_url}\nCredentials in {stack.home / 'credentials.json'}; Ctrl-C stops everything.",
              flush=True)
        while not (dead := stack.check_alive()):
            time.sleep(1)
        print(f"adc: {', '.join(dead)} exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping ...", flush=True)
        stack.stop()


def demo_job(model_dir: Path, data_dir: Path, max_steps: int = 40) -> dict[str, Any]:
    return {
        "name": "demo-lora-sft",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
            "lora_rank": 8, "lora_target": "all", "dataset": "alpaca_en_demo", "dataset_dir": str(data_dir),
            "cutoff_len": 128, "max_samples": 64, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
            "learning_rate": 1.0e-3, "max_steps": max_steps, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1,
            "logging_steps": 5, "save_steps": 20, "seed": 42,
        },
    }


def build_tiny_model(out: Path) -> None:
    subprocess.run([sys.executable, "-m", "worker.trainer.tiny_model", "--out", str(out)], check=True,
                   cwd=str(REPO_ROOT))


def cmd_demo(args: argparse.Namespace) -> int:
    stack = _stack(args)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        stack.start()
        model = stack.home / "models" / "tiny-llama"
        print(f"\nbuilding a tiny Llama in {model} (random weights, tokenizer trained here) ...", flush=True)
        build_tiny_model(model)
        client = ApiClient(stack.api_url, stack.token)
        job = client.submit(demo_job(model, REPO_ROOT / "examples" / "data", args.steps))
        print(f"\nsubmitted {job['id']} ({job['name']}); following it:", flush=True)
        job = follow(client, job["id"])
        print(f"\n{job['id']} {job['status']}: {job['status_reason']}")
        print(f"output folder: {job['output_dir']}")
        print("\naudit trail:")
        print(audit_lines(client.audit(job_id=job["id"], limit=1000)["items"]))
        return 0 if job["status"] == "succeeded" else 1
    except KeyboardInterrupt:
        return 130
    finally:
        print("\nstopping the stack ...", flush=True)
        stack.stop()


def cmd_db_migrate(args: argparse.Namespace) -> int:
    from shared.config import load_config
    from shared.db import migrate

    url = os.environ.get("DATABASE_URL") or load_config(args.config).database.url
    applied = asyncio.run(migrate(url))
    print(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else " (up to date)"))
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from services.api.auth import create_token
    from shared.config import load_config
    from shared.db import connect

    url = os.environ.get("DATABASE_URL") or load_config(args.config).database.url

    async def create() -> tuple[str, str]:
        conn = await connect(url)
        try:
            return await create_token(conn, args.name, args.role, args.team, args.ttl_days)
        finally:
            await conn.close()

    token_id, secret = asyncio.run(create())
    print(f"token {token_id} for {args.name} (role {args.role}, team {args.team}); shown once:\n{secret}")
    return 0


# --- jobs ----------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        print(f"adc: cannot read {path}: {err}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict):
        print(f"adc: {path} is not a mapping", file=sys.stderr)
        return 2
    doc = wrap_bare_llamafactory(doc, name=args.name or path.stem)
    for key in ("name", "priority", "gpus"):
        if getattr(args, key) is not None:
            doc[key] = getattr(args, key)
    client = ApiClient.from_env()
    job = client.submit(doc)
    print(job["id"] if args.output == "json" else f"submitted {job['id']} ({job['name']}), {job['status']}")
    if not args.wait:
        return 0
    job = follow(client, job["id"], out=sys.stderr)
    print(f"{job['id']} {job['status']}: {job['status_reason']}", file=sys.stderr)
    return 0 if job["status"] == "succeeded" else 1


JOB_COLUMNS = [("id", lambda j: j["id"]), ("name", lambda j: j["name"]), ("team", lambda j: j["team"]),
               ("priority", lambda j: j["priority"]), ("gpus", lambda j: j["gpus"]), ("status", lambda j: j["status"]),
               ("step", lambda j: (j.get("progress") or {}).get("step")),
               ("loss", lambda j: (j.get("progress") or {}).get("loss")),
               ("node", lambda j: ",".join(p["node"] for p in j.get("placement") or []) or None)]


def cmd_jobs(args: argparse.Namespace) -> int:
    data = ApiClient.from_env().jobs(status=args.status, limit=args.limit)
    _print(data, args, lambda d: table(d["items"], JOB_COLUMNS))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    job = ApiClient.from_env().job(args.job_id)
    _print(job, args, lambda j: "\n".join(f"{k:<22} {v}" for k, v in j.items() if k != "spec"))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = ApiClient.from_env().cancel(args.job_id)
    print(f"cancel requested for {job['id']} (was {job['status']})")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    data = ApiClient.from_env().nodes()
    cols = [("node", lambda n: n["id"]), ("status", lambda n: n["status"]), ("devices", lambda n: len(n["devices"])),
            ("free", lambda n: n["free"]), ("kind", lambda n: ",".join(sorted({d["kind"] for d in n["devices"]}))),
            ("heartbeat age s", lambda n: n["last_heartbeat_age_s"])]
    _print(data, args, lambda d: table(d["items"], cols))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    data = ApiClient.from_env().audit(job_id=args.job, kind=args.kind, rule=args.rule, node=args.node,
                                      actor=args.actor, limit=args.limit)
    _print(data, args, lambda d: audit_lines(d["items"]))
    return 0


# --- parser --------------------------------------------------------------------------

def _stack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=str(adc_home()), help="state folder: logs, data, credentials (default: .adc)")
    p.add_argument("--workers", type=int, default=2, help="local workers, each a node (default: 2)")
    p.add_argument("--simulate-gpus", type=int, default=0, metavar="G", help="give each worker G simulated GPUs")
    p.add_argument("--gpu-memory", default="80GiB", help="memory of each simulated GPU (default: 80GiB)")
    p.add_argument("--cpu-slots", type=int, default=1, help="job slots per worker without GPUs (default: 1)")
    p.add_argument("--port", type=int, default=8080, help="API port (default: 8080; 0 picks a free one)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adc", description="ADC: submit LLaMA-Factory fine-tunes, watch them, and read why ADC acted.",
        epilog="The API and token come from ADC_API_URL/ADC_TOKEN, else from .adc/credentials.json (written by `adc up`).")
    parser.add_argument("--config", help="adc_config.yaml for commands that read it (db, token)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="run the whole stack locally (NATS, Postgres, services, workers)")
    _stack_flags(p)
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("demo", help="run the stack, fine-tune a tiny Llama with LoRA, show the audit trail")
    _stack_flags(p)
    p.add_argument("--steps", type=int, default=40, help="training steps of the demo job (default: 40)")
    p.set_defaults(func=cmd_demo)

    db = sub.add_parser("db", help="database administration").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("migrate", help="apply the migrations not yet applied (running it twice is a no-op)")
    p.set_defaults(func=cmd_db_migrate)

    tok = sub.add_parser("token", help="API tokens").add_subparsers(dest="token_command", required=True)
    p = tok.add_parser("create", help="create a token directly in the database (bootstraps the first admin)")
    p.add_argument("--name", required=True)
    p.add_argument("--role", choices=["user", "operator", "admin"], default="user")
    p.add_argument("--team", default="default")
    p.add_argument("--ttl-days", type=float, help="expire after this many days (default: never)")
    p.set_defaults(func=cmd_token_create)

    def with_output(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        return p

    p = with_output(sub.add_parser("submit", help="submit a job spec or a bare LLaMA-Factory YAML"))
    p.add_argument("file")
    p.add_argument("--name", help="job name (default: the file's name for a bare LLaMA-Factory config)")
    p.add_argument("--priority", help="priority level, e.g. high or low")
    p.add_argument("--gpus", type=int, help="devices the job needs")
    p.add_argument("--wait", action="store_true", help="follow the job; exit non-zero unless it succeeds (for CI)")
    p.set_defaults(func=cmd_submit)
    p = with_output(sub.add_parser("jobs", help="list jobs"))
    p.add_argument("--status")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_jobs)
    p = with_output(sub.add_parser("job", help="show one job"))
    p.add_argument("job_id")
    p.set_defaults(func=cmd_job)
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_cancel)
    p = with_output(sub.add_parser("nodes", help="list nodes and their devices"))
    p.set_defaults(func=cmd_nodes)
    p = with_output(sub.add_parser("audit", help="query the audit log"))
    p.add_argument("--job")
    p.add_argument("--kind")
    p.add_argument("--rule")
    p.add_argument("--node")
    p.add_argument("--actor")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=cmd_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ApiError as err:
        print(f"adc: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
