"""`adc serve JOB_OR_SPEC` and `adc chat JOB MESSAGE`: serving jobs, which answer OpenAI-style chat
completions with LLaMA-Factory's API until cancelled (services/api/serving.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cli.client import ApiClient, ApiError, path_segment
from shared.specs.job_spec import wrap_bare_llamafactory

ENDED = {"succeeded", "failed", "cancelled"}
CHAT_TIMEOUT_S = 180.0


def find_job(client: ApiClient, ref: str) -> dict[str, Any]:
    """A job by id, `job://ID`, `job://NAME` or NAME (the team's newest of that name)."""
    target = ref.removeprefix("job://")
    try:
        return client.job(target)
    except ApiError as err:
        if err.status != 404:
            raise
    items = client.jobs(name=target, limit=1)["items"]
    if not items:
        raise SystemExit(f"adc: no job {target!r}")
    return client.job(items[0]["id"])


def serving_spec(job: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """A serving job for a finished job's model: a LoRA job's adapter on its base model, an export's or a
    full fine-tune's output as the model; its template and its trust_remote_code kept."""
    train = (job.get("spec") or {}).get("train") or {}
    exported = bool(train.get("export_dir") or train.get("adc_export_of"))
    method = train.get("finetuning_type", "lora")
    if method == "lora" and not exported:
        model = {
            "model_name_or_path": train.get("model_name_or_path"),
            "adapter_name_or_path": f"job://{job['id']}",
            "finetuning_type": "lora",
        }
    else:  # an export's output, a full or freeze job's: a whole model
        model = {"model_name_or_path": f"job://{job['id']}"}
    kept = {k: train[k] for k in ("template", "trust_remote_code", "infer_dtype") if train.get(k) is not None}
    return {
        "name": name or f"{str(job['name'])[:56]}-serve",
        "serve": True,
        "priority": job.get("priority"),
        "train": {**model, **kept},
    }


def spec_of(client: ApiClient, source: str, name: str | None) -> dict[str, Any]:
    """What `adc serve SOURCE` submits: a spec file's serving job, or one for a finished job."""
    path = Path(source)
    if not source.startswith("job://") and path.is_file():
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict):
            raise SystemExit(f"adc: {source} does not hold a mapping")
        doc = wrap_bare_llamafactory(doc, name) | {"serve": True}
        return doc | ({"name": name} if name else {})
    job = find_job(client, source)
    if job["status"] != "succeeded":
        raise SystemExit(f"adc: job {job['id']} is {job['status']}; a serving job serves a succeeded job's model")
    return serving_spec(job, name)


def wait_running(client: ApiClient, job_id: str, timeout_s: float, quiet: bool = False) -> dict[str, Any]:
    deadline, said = time.monotonic() + timeout_s, None
    while True:
        job = client.job(job_id)
        if job["status"] == "running":
            return job
        if job["status"] in ENDED:
            raise SystemExit(f"adc: serving job {job_id} is {job['status']}: {job.get('status_reason') or ''}")
        if not quiet and job["status"] != said:
            print(f"waiting: job {job_id} is {job['status']}", file=sys.stderr)
            said = job["status"]
        if time.monotonic() > deadline:
            raise SystemExit(f"adc: serving job {job_id} not running after {timeout_s:.0f}s ({job['status']})")
        time.sleep(1.0)


def ask(client: ApiClient, job_id: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One chat completion; while the job is between attempts (409: preempted, moving) it waits and asks again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.call(
                "POST", f"/v1/jobs/{path_segment(job_id)}/chat/completions", json=body, timeout=CHAT_TIMEOUT_S
            )
        except ApiError as err:
            if err.status != 409 or time.monotonic() > deadline:
                raise
        wait_running(client, job_id, max(1.0, deadline - time.monotonic()), quiet=True)


def cmd_serve(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    spec = spec_of(client, args.source, args.name)
    if args.priority:
        spec["priority"] = args.priority
    if spec.get("priority") is None:
        spec.pop("priority", None)
    job = client.submit(spec)
    print(job["id"])
    if args.wait:
        wait_running(client, job["id"], args.timeout)
        print(f"serving: adc chat {job['id']} MESSAGE, or POST /v1/jobs/{job['id']}/chat/completions", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    job = find_job(client, args.job)
    if not (job.get("spec") or {}).get("serve"):
        if job["status"] != "succeeded":
            raise SystemExit(f"adc: job {job['id']} is {job['status']}: neither a serving job nor a finished one")
        job = client.submit(serving_spec(job))
        print(f"started serving job {job['id']}", file=sys.stderr)
    wait_running(client, job["id"], args.timeout)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.message}
    ]
    body = {"model": job["name"], "messages": messages}
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.greedy:
        body["do_sample"] = False
    answer = ask(client, job["id"], body, args.timeout)
    print(answer["choices"][0]["message"].get("content") or "")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a finished job's model (job://NAME) or a spec's, as a job answering chat completions",
    )
    p.add_argument(
        "source", metavar="JOB_OR_SPEC", help="job://NAME, a job id, or a spec file (its train: inference keys)"
    )
    p.add_argument("--name", help="the serving job's name (default: <job>-serve)")
    p.add_argument("--priority", help="priority level (default: the served job's)")
    p.add_argument("--wait", action="store_true", help="return once it answers")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "chat",
        help="one chat completion from a serving job (a finished job gets a serving job first) and print the answer",
    )
    p.add_argument("job", metavar="JOB", help="a serving job, or a finished job to serve (id, job://NAME or NAME)")
    p.add_argument("message")
    p.add_argument("--system", help="a system message before it")
    p.add_argument("--max-tokens", type=int, help="at most this many new tokens")
    p.add_argument("--greedy", action="store_true", help="no sampling (do_sample false): the same answer every time")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the job to answer")
    p.set_defaults(func=cmd_chat)
