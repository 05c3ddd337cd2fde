"""`adc submit | jobs | job | logs | metrics | events | cancel | pause | resume | migrate | export`:
what a user (or their CI pipeline) does with jobs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from cli.client import ApiClient, Unreachable, path_segment
from cli.live_views import follow_metrics
from cli.render import fields, follow, progress_text, sparkline, table
from shared.specs.job_spec import JobSpec, wrap_bare_llamafactory


def show(data: Any, args: argparse.Namespace, human) -> None:
    if getattr(args, "output", "table") == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human(data))


class OverrideError(ValueError):
    pass


def apply_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`key=value` overrides as `llamafactory-cli train FILE key=value` applies them: OmegaConf's
    dotlist (values parsed as YAML, `a.b=v` nested), merged into the file (mappings merge, anything
    else is replaced). `doc` is an ADC job spec: a key naming a job-spec field (`gpus=2`,
    `train.x=v`) sets the spec, any other key is a LLaMA-Factory key of its `train` section.
    Interpolation (`${...}`) is refused: the api stores and forwards values as they are written."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"{item!r} is not key=value")
        if "${" in item:
            raise OverrideError(f"{key}: interpolation (${{...}}) is not supported in overrides")
    try:
        given = OmegaConf.to_container(OmegaConf.from_dotlist(overrides))
        spec_part = {k: v for k, v in given.items() if k in JobSpec.model_fields}
        train_part = {k: v for k, v in given.items() if k not in JobSpec.model_fields}
        merged = OmegaConf.merge(
            OmegaConf.create(doc), OmegaConf.create(spec_part), OmegaConf.create({"train": train_part})
        )
        return OmegaConf.to_container(merged)
    except (OmegaConfBaseException, ValueError, TypeError) as err:
        raise OverrideError(str(err).splitlines()[0]) from None


SUBMIT_FLAGS = {"--name", "--priority", "--gpus", "--wait", "--chain", "--output", "-o", "--help", "-h"}


def flags_as_overrides(argv: list[str]) -> list[str]:
    """`adc submit FILE --learning_rate 1e-4 --do_eval` as LLaMA-Factory's own flags: each `--key value`
    (or `--key=value`) that is not one of submit's options becomes the override `key=value`; a flag with
    no value (`--do_eval` followed by another flag or nothing) is `key=true`, as HfArgumentParser reads it."""
    if not argv or argv[0] != "submit":
        return argv
    out, i = [argv[0]], 1
    while i < len(argv):
        item = argv[i]
        name = item.split("=", 1)[0]
        if not item.startswith("--") or name in SUBMIT_FLAGS or item == "--":
            out.append(item)
            if name in SUBMIT_FLAGS - {"--wait", "--chain", "--help", "-h"} and "=" not in item and i + 1 < len(argv):
                out.append(argv[i + 1])  # that option's value
                i += 1
        elif "=" in item:
            out.append(item[2:])
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{item[2:]}={argv[i + 1]}")
            i += 1
        else:
            out.append(f"{item[2:]}=true")
        i += 1
    return out


def read_spec(path: Path, name: str | None, overrides: list[str]) -> dict[str, Any]:
    """One file as a job spec (a bare LLaMA-Factory config wrapped), overrides applied; SystemExit(2) with
    the reason on stderr when it cannot be."""
    try:
        text = path.read_text()
        doc = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as err:
        print(f"adc: cannot read {path}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if not isinstance(doc, dict):
        print(f"adc: {path} is not a mapping", file=sys.stderr)
        raise SystemExit(2)
    doc = wrap_bare_llamafactory(doc, name=name or path.stem)
    if overrides:
        if not isinstance(doc.get("train"), dict):
            print(f"adc: {path} has no train section to override", file=sys.stderr)
            raise SystemExit(2)
        try:
            doc = apply_overrides(doc, overrides)
        except OverrideError as err:
            print(f"adc: override refused: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    return doc


def cmd_submit(args: argparse.Namespace) -> int:
    files = [Path(item) for item in args.items if "=" not in item]
    overrides = [item for item in args.items if "=" in item]
    if not files:
        print("adc: name a job spec or LLaMA-Factory config file", file=sys.stderr)
        return 2
    if len(files) > 1 and not args.chain:
        print("adc: several files are submitted as one chain: add --chain", file=sys.stderr)
        return 2
    if args.chain and overrides:
        print("adc: key=value overrides apply to one file; write them in the chain's files", file=sys.stderr)
        return 2
    try:
        docs = [read_spec(path, args.name if not args.chain else None, overrides) for path in files]
    except SystemExit as exit_:
        return int(exit_.code)
    for doc in docs:
        for key in ("name", "priority", "gpus") if not args.chain else ("priority",):
            if getattr(args, key) is not None:
                doc[key] = getattr(args, key)
    client = ApiClient.from_env()
    if args.chain:
        submitted = client.call("POST", "/v1/jobs/chain", json={"jobs": docs})["items"]
    else:
        submitted = [client.submit(docs[0])]
    for job in submitted:
        note = f"; {job['quota_note']}" if job.get("quota_note") else ""
        if args.output == "json":
            print(job["id"], flush=True)  # stdout is the ids alone, for `JOB=$(adc submit ... -o json)`
            if note:
                print(f"adc: {job['quota_note']}", file=sys.stderr)
        else:
            after = f", after {job['spec']['after']}" if job["spec"].get("after") else ""
            print(f"submitted {job['id']} ({job['name']}), {job['status']}{after}{note}")
    if not args.wait:
        return 0
    code = 0
    for job in submitted:  # in order: each starts once the one before it succeeded
        job = follow(client, job["id"], out=sys.stderr)
        print(f"{job['id']} {job['status']}: {job['status_reason']}", file=sys.stderr)
        code = code or (0 if job["status"] == "succeeded" else 1)
    return code


JOB_COLUMNS = [
    ("id", lambda j: j["id"]),
    ("name", lambda j: j["name"]),
    ("team", lambda j: j["team"]),
    ("owner", lambda j: j["owner"]),
    ("priority", lambda j: j["priority"]),
    ("gpus", lambda j: j["gpus"]),
    ("status", lambda j: j["status"]),
    ("after", lambda j: (j.get("spec") or {}).get("after")),
    ("step", lambda j: (j.get("progress") or {}).get("step")),
    ("loss", lambda j: _round((j.get("progress") or {}).get("loss"))),
    ("node", lambda j: ",".join(p["node"] for p in j.get("placement") or []) or None),
]


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def cmd_jobs(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    params = {
        "status": args.status,
        "team": args.team,
        "owner": args.owner,
        "priority": args.priority,
        "limit": args.limit,
        "before": args.before,
    }
    data = client.jobs(**params)
    if args.all:
        while data["next"]:
            page = client.jobs(**params | {"before": data["next"]})
            data = {"items": data["items"] + page["items"], "next": page["next"]}
    show(
        data, args, lambda d: table(d["items"], JOB_COLUMNS) + (f"\n(more: --before {d['next']})" if d["next"] else "")
    )
    return 0


def _job_text(job: dict[str, Any]) -> str:
    shown = {k: v for k, v in job.items() if k not in ("spec", "progress", "placement")}
    shown["placement"] = ", ".join(f"{p['node']}:{p['gpus']}" for p in job.get("placement") or []) or None
    shown["progress"] = progress_text(job) or None
    for split, metrics in (job.get("evaluation") or {}).items():  # LLaMA-Factory's eval / predict metrics
        shown[split] = f"step {metrics.get('step')}: " + ", ".join(
            f"{k} {_round(v)}" for k, v in metrics.items() if k != "step"
        )
    shown.pop("evaluation", None)
    if job.get("chain"):  # the jobs submitted with it, each after the one before
        shown["chain"] = " -> ".join(f"{m['name']} {m['id']} ({m['status']})" for m in job["chain"])
    if (job.get("spec") or {}).get("after"):
        shown["after"] = job["spec"]["after"]
    return fields(shown)


def cmd_job(args: argparse.Namespace) -> int:
    show(ApiClient.from_env().job(args.job_id), args, _job_text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = ApiClient.from_env().cancel(args.job_id)
    show(job, args, lambda j: f"cancel requested for {j['id']} (was {j['status']})")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    params = {"attempt": args.attempt, "tail": args.tail, "follow": "true" if args.follow else None}
    out = sys.stdout.buffer
    try:
        with client.stream(f"/v1/jobs/{path_segment(args.job_id)}/logs", params) as response:
            for chunk in response.iter_bytes():
                out.write(chunk)
                out.flush()
    except Unreachable as err:
        print(f"adc: the log stream broke: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _metrics_text(data: dict[str, Any]) -> str:
    points, s = data["points"], data["summary"]
    if not points:
        return f"no progress reported yet for {data['job_id']}"
    losses = [p["loss"] for p in points if isinstance(p.get("loss"), (int, float))]
    rows = table(
        points[-20:],
        [
            ("attempt", lambda p: p["attempt"]),
            ("step", lambda p: p.get("step")),
            ("loss", lambda p: _round(p.get("loss"))),
            ("lr", lambda p: f"{p['learning_rate']:.2e}" if p.get("learning_rate") else None),
            ("tokens/s", lambda p: _round(p.get("tokens_per_s"))),
        ],
    )
    head = (
        f"{data['job_id']}: {s['points']} point(s), last step {s['last_step']}, loss {_round(s['last_loss'])} "
        f"(min {_round(s['min_loss'])}), mean {_round(s['mean_tokens_per_s'])} tokens/s"
    )
    return f"{head}\nloss  {sparkline(losses)}\n\n{rows}"


def cmd_metrics(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    data = client.job_metrics(args.job_id, attempt=args.attempt)
    show(data, args, _metrics_text)
    if args.follow:
        follow_metrics(client, args.job_id, data["points"])
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    data = ApiClient.from_env().job_events(args.job_id, include_progress=args.progress or None)
    cols = [
        ("seq", lambda e: e["seq"]),
        ("kind", lambda e: e["kind"]),
        ("attempt", lambda e: e["attempt"]),
        ("node", lambda e: e["node"]),
        ("actor", lambda e: e["actor"]),
        ("data", lambda e: json.dumps(e["data"])[:80] if e["data"] else None),
    ]
    show(data, args, lambda d: table(d["items"], cols))
    return 0


def cmd_job_action(args: argparse.Namespace) -> int:
    """pause, resume: manual decisions the executor carries out; migrate: a request the decider completes."""
    body = {"target_node": args.to} if getattr(args, "to", None) else None
    result = ApiClient.from_env().job_action(args.job_id, args.action, body)
    ref = f"decision {result['decision_id']}" if result.get("decision_id") else f"request {result.get('request_id')}"
    show(
        result,
        args,
        lambda r: f"{args.action} of {args.job_id} requested ({ref}); follow it with `adc audit --job {args.job_id}`",
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """LLaMA-Factory's export (merge LoRA into the base) of a succeeded job, run by a worker as a job."""
    client = ApiClient.from_env()
    body = {"dtype": args.dtype} | ({"name": args.name} if args.name else {})
    job = client.job_action(args.job_id, "export", body)
    if args.output == "json":
        print(job["id"], flush=True)
    else:
        print(
            f"export of {args.job_id} submitted as {job['id']} ({job['name']}), {job['status']}; "
            f"the merged model will be in {job['id']}'s output_dir"
        )
    if not args.wait:
        return 0
    job = follow(client, job["id"], out=sys.stderr)
    print(
        f"{job['id']} {job['status']}: {job['status_reason']}"
        + (f"\nmerged model: {job['output_dir']}" if job["status"] == "succeeded" else ""),
        file=sys.stderr,
    )
    return 0 if job["status"] == "succeeded" else 1


def register(sub, with_output) -> None:
    p = with_output(
        sub.add_parser(
            "submit",
            help="submit a job spec or a bare LLaMA-Factory config (YAML or JSON)",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Submit a job spec or a bare LLaMA-Factory config, optionally overriding keys of the file\n"
            "as `llamafactory-cli train FILE key=value` does.",
            epilog="overrides (key=value, after the file):\n"
            "  values are read as YAML (OmegaConf's dotlist, as llamafactory-cli reads them):\n"
            "  learning_rate=1e-4 is a number, bf16=false a boolean, lora_target=[q_proj,v_proj] a list,\n"
            "  'template=\"3\"' a string, key= and key=null give null (None), as in llamafactory-cli.\n"
            "  A bare key is a LLaMA-Factory key of the train section; train.KEY says the same;\n"
            "  a job-spec field (gpus, priority, name, ...) sets the spec. ${...} is refused.\n"
            "  LLaMA-Factory's flag style works too: --learning_rate 1e-4 is learning_rate=1e-4,\n"
            "  a bare --do_eval is do_eval=true.\n"
            "chains (--chain): sft.yaml dpo.yaml export.yaml is one submission; each job waits for the one\n"
            "  before it and is cancelled if that one fails; job://NAME in a model key (adapter_name_or_path,\n"
            "  model_name_or_path, ref_model, reward_model) names an earlier job's output (NAME/checkpoint-N\n"
            "  a checkpoint of it).\n"
            "example:\n"
            "  adc submit examples/train_lora/qwen3_lora_sft.yaml model_name_or_path=/models/my-qwen \\\n"
            "      dataset_dir=/data/mine dataset=my_set max_steps=200",
        )
    )
    p.add_argument(
        "items", nargs="+", metavar="FILE [key=value ...]", help="the file, then keys to override (see below)"
    )
    p.add_argument("--name", help="job name (default: the file's name for a bare LLaMA-Factory config)")
    p.add_argument(
        "--chain",
        action="store_true",
        help="several files as one chain: each job waits for the one before it (or its `after`) to succeed",
    )
    p.add_argument("--priority", help="priority level, e.g. high or low")
    p.add_argument("--gpus", type=int, help="devices the job needs")
    p.add_argument("--wait", action="store_true", help="follow the job; exit non-zero unless it succeeds (for CI)")
    p.set_defaults(func=cmd_submit)

    p = with_output(sub.add_parser("jobs", help="list jobs, newest first"))
    p.add_argument("--status")
    p.add_argument("--team", help="operators and admins: any team")
    p.add_argument("--owner")
    p.add_argument("--priority")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--before", help="cursor from a previous page")
    p.add_argument("--all", action="store_true", help="every page")
    p.set_defaults(func=cmd_jobs)

    p = with_output(sub.add_parser("job", help="one job: status, placement, progress, why pending"))
    p.add_argument("job_id")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("logs", help="a job's trainer log")
    p.add_argument("job_id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("--attempt", type=int, help="an earlier attempt (default: the current one)")
    p.set_defaults(func=cmd_logs)

    p = with_output(sub.add_parser("metrics", help="a job's loss curve and throughput"))
    p.add_argument("job_id")
    p.add_argument("--attempt", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep drawing the curve live until the job ends")
    p.set_defaults(func=cmd_metrics)

    p = with_output(
        sub.add_parser("events", help="a job's events: submitted, started, checkpointed, evaluated, exited")
    )
    p.add_argument("job_id")
    p.add_argument("--progress", action="store_true", help="include every progress event")
    p.set_defaults(func=cmd_events)

    p = with_output(sub.add_parser("cancel", help="cancel a job"))
    p.add_argument("job_id")
    p.set_defaults(func=cmd_cancel)

    p = with_output(
        sub.add_parser(
            "export",
            help="merge a succeeded LoRA job's adapter into its base model (LLaMA-Factory's export)",
            description="Queue an export job: a worker runs LLaMA-Factory's export (merge LoRA) on JOB's output in the "
            "trainer's environment; the merged model (safetensors, config, tokenizer with its chat template, "
            "Ollama Modelfile) lands in the export job's output_dir. Refused for a job that has not "
            "succeeded or was not trained with finetuning_type lora.",
        )
    )
    p.add_argument("job_id")
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="dtype of the merged weights (default: the base model's)",
    )
    p.add_argument("--name", help="the export job's name (default: NAME-export)")
    p.add_argument("--wait", action="store_true", help="follow the export; exit non-zero unless it succeeds")
    p.set_defaults(func=cmd_export)

    for action, text in (
        ("pause", "checkpoint a running job and hold it"),
        ("resume", "queue a paused job to continue from its checkpoint"),
        ("migrate", "move a running job to another node (operators)"),
    ):
        p = with_output(sub.add_parser(action, help=text))
        p.add_argument("job_id")
        if action == "migrate":
            p.add_argument("--to", metavar="NODE", help="target node (default: any with room)")
        p.set_defaults(func=cmd_job_action, action=action)
