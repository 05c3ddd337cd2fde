"""`adc`: the command line for ADC's users and SREs, and the local stack (`adc up`, `adc demo`).

The verbs live beside this file: job_commands (submit, jobs, job, logs, metrics, events, cancel,
pause, resume, migrate), audit_commands (audit query, tail -f, verify), admin_commands
(nodes, cordon, uncordon, drain, controller, policies, quotas, token, whoami), live_views
(top, metrics -f) and sim_commands (sim).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli import admin_commands, audit_commands, bandit_commands, job_commands, live_views, serve_commands, sim_commands
from cli.client import ApiClient, ApiError, Unreachable, adc_home
from cli.render import audit_lines, follow

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_NAMES = ("oom", "preempt")  # cli/demo_scenarios.py, imported when one runs


# --- stack ---------------------------------------------------------------------------


def _stack(args: argparse.Namespace, **options: Any):
    from cli.stack import Stack, StackOptions, bus_keys_from_env

    settings = (
        dict(
            workers=args.workers,
            simulate_gpus=args.simulate_gpus,
            gpu_memory=args.gpu_memory,
            cpu_slots=args.cpu_slots,
            roots=[Path(r) for r in args.root],
            replicas=args.replicas,
            backend=getattr(args, "backend", "local"),
        )
        | options
    )
    return Stack(
        StackOptions(
            home=Path(args.home),
            api_port=args.port,
            nats_url=os.environ.get("NATS_URL"),
            bus_credentials=bus_keys_from_env(),  # with NATS_URL: the keys that server knows
            prefix=os.environ.get("ADC_BUS_PREFIX") or "adc",
            database_url=os.environ.get("DATABASE_URL"),
            **settings,
        )
    )


def cmd_up(args: argparse.Namespace) -> int:
    from cli.supervisor import Supervisor

    stack = _stack(args, die_with_parent=True)
    try:
        stack.start()
        supervisor = Supervisor(stack)
        supervisor.handle_stop_signals()
        print(
            f"ADC is up. Credentials in {stack.home / 'credentials.json'}; Ctrl-C (or SIGTERM) stops everything. API:",
            flush=True,
        )
        print(stack.api_url, flush=True)  # alone on its line, for scripts
        supervisor.run()
        print(f"adc: {signal.Signals(supervisor.stop_signal).name} received", file=sys.stderr, flush=True)
        return 0
    except KeyboardInterrupt:  # during start-up, before the handlers are set
        return 0
    finally:
        print("stopping ...", flush=True)
        stack.stop()


def demo_job(model_dir: Path, data_dir: Path, max_steps: int = 40) -> dict[str, Any]:
    return {
        "name": "demo-lora-sft",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(model_dir),
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "lora",
            "lora_rank": 8,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(data_dir),
            "cutoff_len": 128,
            "max_samples": 64,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1.0e-3,
            "max_steps": max_steps,
            "lr_scheduler_type": "cosine",
            "warmup_ratio": 0.1,
            "logging_steps": 5,
            "save_steps": 20,
            "seed": 42,
        },
    }


def build_tiny_model(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "worker.trainer.tiny_model", "--out", str(out)], check=True, cwd=str(REPO_ROOT)
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from cli import demo_scenarios

    scenario = args.scenario
    stack = _stack(args, **(demo_scenarios.stack_options(scenario, Path(args.home).resolve()) if scenario else {}))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        stack.start()
        model = stack.home / "models" / "tiny-llama"
        print(f"\nbuilding a tiny Llama in {model} (random weights, tokenizer trained here) ...", flush=True)
        build_tiny_model(model)
        client = ApiClient(stack.api_url, stack.token)
        if scenario:
            print(f"\nscenario {scenario}: {demo_scenarios.SCENARIOS[scenario]}", flush=True)
            return 0 if demo_scenarios.run(scenario, client, model, REPO_ROOT / "examples" / "data", stack.home) else 1
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
    from shared.infra.config import load_config
    from shared.infra.db import migrate, set_role_passwords

    database = load_config(args.config).database
    url = os.environ.get("DATABASE_URL") or database.url
    applied = asyncio.run(migrate(url))
    print(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else " (up to date)"))
    if database.passwords_dir:
        roles = asyncio.run(set_role_passwords(url, database.passwords_dir))
        print(f"passwords set for {', '.join(roles) or 'no role'} from {database.passwords_dir}")
    return 0


def cmd_secrets_init(args: argparse.Namespace) -> int:
    """Mint a key per bus role (existing ones are kept) and write nats-server's authorization for them."""
    from shared.infra.bus_auth import BusDeployment, CredentialStore, write_server_config
    from shared.infra.bus_tls import ensure_tls, give_ca

    deployment = BusDeployment(args.prefix, tuple(args.nodes), CredentialStore(args.dir))
    tls = None
    if not args.no_tls:
        args.tls_dir = args.tls_dir or str(Path(args.dir).parent / "nats-tls")
        tls = ensure_tls(args.tls_dir, tuple(dict.fromkeys(["localhost", "127.0.0.1", *args.tls_host])))
        give_ca(tls, deployment.keys.directory)
        print(
            f"bus TLS: CA and nats-server's certificate in {args.tls_dir} (the CA key stays there);"
            f" clients verify against {deployment.keys.directory / 'ca.pem'}"
        )
    path = write_server_config(Path(args.nats_config), [deployment], tls)
    if args.db_passwords:
        import secrets

        from shared.infra.db import SERVICE_ROLES

        folder = Path(args.db_passwords)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for role in SERVICE_ROLES.values():
            if not (folder / f"{role}.password").exists():
                fd = os.open(folder / f"{role}.password", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(24) + "\n")
        print(f"Postgres role passwords in {folder} (`adc db migrate` sets them when ADC_DB_PASSWORDS_DIR names it)")
    print(
        f"bus keys in {deployment.keys.directory} ({len(deployment.roles())} roles); nats-server authorization in"
        f" {path}: start nats-server with `-c {path}` (or reload it) and give each process only its own <role>.nk"
    )
    return 0


def cmd_bus_init(args: argparse.Namespace) -> int:
    from shared.infra.bus import init_streams
    from shared.infra.bus_auth import BusDeployment, CredentialStore
    from shared.infra.config import load_config

    bus = load_config(args.config).bus
    if not bus.credentials_dir:
        print("adc: bus.credentials_dir (or ADC_BUS_CREDENTIALS_DIR) is not set", file=sys.stderr)
        return 2
    asyncio.run(init_streams(bus.url, BusDeployment(bus.prefix, (), CredentialStore(bus.credentials_dir))))
    print(f"streams of prefix {bus.prefix!r} created or up to date on {bus.url}")
    return 0


# --- parser --------------------------------------------------------------------------


def _stack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=str(adc_home()), help="state folder: logs, data, credentials (default: .adc)")
    p.add_argument("--workers", type=int, default=2, help="local workers, each a node (default: 2)")
    p.add_argument("--simulate-gpus", type=int, default=0, metavar="G", help="give each worker G simulated GPUs")
    p.add_argument("--gpu-memory", default="80GiB", help="memory of each simulated GPU (default: 80GiB)")
    p.add_argument("--cpu-slots", type=int, default=1, help="job slots per worker without GPUs (default: 1)")
    p.add_argument("--port", type=int, default=8080, help="API port (default: 8080; 0 picks a free one)")
    p.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder your jobs may read models and data from (repeatable; default: the current folder)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=range(1, 6),
        metavar="N",
        help="run N of each controller and api: one decider and one executor lead, the others stand by (default: 1)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adc",
        description="ADC: submit LLaMA-Factory fine-tunes, watch them, and read why ADC acted.",
        epilog="The API and token come from ADC_API_URL/ADC_TOKEN, else from .adc/credentials.json (written by "
        "`adc up`). Add -o json to a command for scripts.",
    )
    parser.add_argument("--config", help="adc_config.yaml for commands that read it (db, token create --db)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="run the whole stack locally (NATS, Postgres, services, workers)")
    _stack_flags(p)
    p.add_argument(
        "--backend",
        choices=("local", "slurm"),
        default="local",
        help="local: the workers run the trainers (default); slurm: each worker submits them to the Slurm node "
        "of its name (node-1, ...) of the Slurm that SLURM_CONF names (python -m cli.local_slurm starts one)",
    )
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("demo", help="run the stack, fine-tune a tiny Llama with LoRA, show the audit trail")
    _stack_flags(p)
    p.add_argument("--steps", type=int, default=40, help="training steps of the demo job (default: 40)")
    p.add_argument(
        "--scenario",
        choices=sorted(SCENARIO_NAMES),
        help="a seed's story instead: GPU memory climbing past the threshold (oom), or a high-priority "
        "job arriving on a full cluster (preempt); prints the timeline and checks the weights",
    )
    p.set_defaults(func=cmd_demo)

    db = sub.add_parser("db", help="database administration").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("migrate", help="apply the migrations not yet applied (running it twice is a no-op)")
    p.set_defaults(func=cmd_db_migrate)

    secrets = sub.add_parser("secrets", help="bus credentials").add_subparsers(dest="secrets_command", required=True)
    p = secrets.add_parser("init", help="mint an nkey per bus role and write nats-server's authorization config")
    p.add_argument("--dir", default=str(adc_home() / "secrets" / "nats"), help="where the role keys go (mode 600)")
    p.add_argument(
        "--nats-config",
        default=str(adc_home() / "nats-auth.conf"),
        help="the authorization config nats-server is started with (-c)",
    )
    p.add_argument("--prefix", default="adc", help="the bus prefix (bus.prefix)")
    p.add_argument("--nodes", nargs="*", default=[], help="node names: each gets a worker and a collector key")
    p.add_argument("--db-passwords", metavar="DIR", help="also mint a password per service's Postgres role here")
    p.add_argument(
        "--tls-dir",
        help="where the bus CA (its key owner-only) and nats-server's certificate go (default: nats-tls beside --dir)",
    )
    p.add_argument(
        "--tls-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name or IP clients dial the server by, put in its certificate (repeatable;"
        " localhost and 127.0.0.1 always are)",
    )
    p.add_argument("--no-tls", action="store_true", help="no bus TLS (an operator's own TLS, or none: not advised)")
    p.set_defaults(func=cmd_secrets_init)
    bus = sub.add_parser("bus", help="bus administration").add_subparsers(dest="bus_command", required=True)
    p = bus.add_parser("init", help="create or update the streams, as the bus admin role (running it twice is a no-op)")
    p.set_defaults(func=cmd_bus_init)

    def with_output(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "-o",
            "--output",
            choices=["table", "json"],
            default="table",
            help="table for people (default), json for scripts",
        )
        return p

    job_commands.register(sub, with_output)
    audit_commands.register(sub, with_output)
    admin_commands.register(sub, with_output)
    live_views.register(sub)
    sim_commands.register(sub, with_output)
    bandit_commands.register(sub, with_output)
    serve_commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = audit_commands.with_default_verb(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(job_commands.flags_as_overrides(argv))
    admin_commands.check_policy_args(args, parser)
    try:
        return args.func(args)
    except (ApiError, Unreachable) as err:
        print(f"adc: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `adc audit tail -f | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
