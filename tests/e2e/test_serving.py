"""A serving job through the whole stack: a tiny LoRA job trains, then a serving job (`serve: true`,
`adapter_name_or_path: job://serve-sft`) runs LLaMA-Factory's OpenAI-style API in the trainer's sandbox,
and `POST /v1/jobs/{id}/chat/completions` answers through the worker's relay, with the text
LLaMA-Factory's own `ChatModel` gives for the same model, adapter and prompt (greedy). A high-priority job
preempts it (it stops, saving nothing), then it runs again and answers the same. Another team's token
finds no such job; `adc chat` prints the answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.api.auth import create_token
from shared.infra.db import connect
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import running_stack
from worker.sandbox import bubblewrap
from worker.trainer.interpreter import trainer_python

TIMEOUT = 300
DONE = {"succeeded", "failed", "cancelled"}
PROMPT = [{"role": "user", "content": "Describe a process of making crepes."}]
GENERATION = {"do_sample": False, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # One device: the high-priority job runs only by preempting the serving job.
    yield from running_stack(tmp_path_factory, workers=1, simulate_gpus=1)


def sft(tiny_model: Path, data_dir: Path, name: str, steps: int) -> dict:
    return {
        "name": name,
        "train": {
            "model_name_or_path": str(tiny_model),
            "stage": "sft",
            "finetuning_type": "lora",
            "lora_rank": 4,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(data_dir),
            "template": "qwen3_nothink",
            "cutoff_len": 64,
            "max_samples": 16,
            "per_device_train_batch_size": 2,
            "learning_rate": 1e-2,
            "max_steps": steps,
            "logging_steps": 1,
            "save_steps": 500,
            "seed": 7,
        },
    }


def serving(tiny_model: Path) -> dict:
    return {
        "name": "serve-chat",
        "serve": True,
        "priority": "low",
        "train": {
            "model_name_or_path": str(tiny_model),
            "adapter_name_or_path": "job://serve-sft",
            "template": "qwen3_nothink",
            "finetuning_type": "lora",
            "infer_backend": "huggingface",
            **GENERATION,
        },
    }


@pytest.fixture(scope="module")
def trained(stack, tiny_model, data_dir) -> dict:
    job = stack.wait_for(stack.submit(sft(tiny_model, data_dir, "serve-sft", 2))["id"], DONE, timeout=TIMEOUT)
    assert job["status"] == "succeeded", job["status_reason"]
    return job


@pytest.fixture(scope="module")
def served(stack, trained, tiny_model) -> dict:
    job = stack.submit(serving(tiny_model))
    return stack.wait_for(job["id"], {"running", *DONE}, timeout=TIMEOUT)


def chat(stack, job_id: str, http: httpx.Client | None = None, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": PROMPT, **fields}
    return (http or stack.http).post(f"/v1/jobs/{job_id}/chat/completions", json=body, timeout=180)


def llamafactory_answer(tiny_model: Path, adapter: str, tmp_path: Path) -> str:
    """LLaMA-Factory's ChatModel alone, in the trainer's environment (no ADC code on its path)."""
    script = (
        "import json, sys\n"
        "from llamafactory.chat import ChatModel\n"
        "args, messages = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "print(json.dumps(ChatModel(args).chat(messages)[0].response_text))\n"
    )
    args = {
        "model_name_or_path": str(tiny_model),
        "adapter_name_or_path": adapter,
        "template": "qwen3_nothink",
        "finetuning_type": "lora",
        **GENERATION,
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [trainer_python(), "-c", script, json.dumps(args), json.dumps(PROMPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_serving_job_answers_as_llamafactorys_chat_model(stack, trained, served, tiny_model, tmp_path):
    assert served["status"] == "running", served["status_reason"]
    r = chat(stack, served["id"])
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["message"]["content"] == llamafactory_answer(tiny_model, trained["output_dir"], tmp_path)
    ran = (Path(served["job_dir"]) / "attempt-1" / "train.yaml").read_text()
    assert trained["output_dir"] in ran  # job://serve-sft, resolved by the api
    attempt = Path(served["job_dir"]) / "attempt-1"
    launch = json.loads((attempt / "launch.json").read_text())
    if bubblewrap() is not None:  # its own network namespace, loopback only: the socket is the one way in
        assert launch["bubblewrap"] and launch["network"] == "own", launch
    info = (attempt / "serve.sock").lstat()  # the worker's, in the worker's folder; the server got its descriptor
    assert stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0


def test_the_serving_job_is_preempted_and_answers_again(stack, served, tiny_model, data_dir):
    first = chat(stack, served["id"]).json()["choices"][0]["message"]["content"]
    urgent = stack.submit(sft(tiny_model, data_dir, "urgent", 2) | {"priority": "high"})
    stack.wait_for(served["id"], {"checkpointing", "preempted", "pending"}, timeout=TIMEOUT)
    assert stack.wait_for(urgent["id"], DONE, timeout=TIMEOUT)["status"] == "succeeded"
    again = stack.wait_for(served["id"], {"running", *DONE}, timeout=TIMEOUT)
    assert again["status"] == "running" and again["attempt"] == 2, again
    history = [
        r["new_status"]
        for r in stack.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", served["id"])
    ]
    assert history[:8] == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "checkpointing",
        "preempted",
        "pending",
        "scheduled",
    ], history
    events = [json.loads(line) for line in (Path(served["job_dir"]) / "attempt-1" / "events.jsonl").open()]
    assert events[-1]["event"] == "stopped" and events[-1]["checkpoint"] is None  # nothing to save
    r = chat(stack, served["id"])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == first


def test_adc_chat_prints_the_answer(stack, served):
    job = stack.wait_for(served["id"], {"running", *DONE}, timeout=TIMEOUT)
    expected = chat(stack, job["id"]).json()["choices"][0]["message"]["content"]
    env = dict(os.environ, ADC_API_URL=stack.stack.api_url, ADC_TOKEN=stack.stack.token, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "cli", "chat", job["id"], PROMPT[0]["content"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected.strip()


def test_another_team_finds_no_such_job(stack, served):
    async def token() -> str:
        conn = await connect(stack.env.database_url)
        try:
            return (await create_token(conn, "beta-user", "user", "beta"))[1]
        finally:
            await conn.close()

    with httpx.Client(
        base_url=stack.stack.api_url, headers={"Authorization": f"Bearer {asyncio.run(token())}"}
    ) as other:
        r = chat(stack, served["id"], other)
    assert r.status_code in (403, 404), r.text


def test_cancelling_ends_the_serving_job(stack, served):
    r = stack.http.post(f"/v1/jobs/{served['id']}/cancel")
    assert r.status_code in (200, 202), r.text
    assert stack.wait_for(served["id"], DONE, timeout=TIMEOUT)["status"] == "cancelled"
    r = chat(stack, served["id"])
    assert r.status_code == 409, r.text


def test_adc_chat_serves_a_finished_job_first(stack, trained, served):
    """`adc chat` on the training job itself: it submits a serving job of the job's adapter, waits for it to
    answer and prints the answer (the device is free again: the first serving job was cancelled)."""
    assert stack.job(served["id"])["status"] == "cancelled"
    env = dict(os.environ, ADC_API_URL=stack.stack.api_url, ADC_TOKEN=stack.stack.token, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "cli", "chat", "job://serve-sft", PROMPT[0]["content"], "--greedy", "--max-tokens", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
    )
    assert done.returncode == 0, done.stderr
    assert "started serving job" in done.stderr
    started = done.stderr.split("started serving job ")[1].split()[0]
    job = stack.job(started)
    assert job["spec"]["serve"] and job["spec"]["train"]["adapter_name_or_path"] == trained["output_dir"]
    again = chat(stack, started, do_sample=False, max_tokens=8).json()["choices"][0]["message"]["content"]
    assert done.stdout.strip() == again.strip() and again
    stack.http.post(f"/v1/jobs/{started}/cancel")
