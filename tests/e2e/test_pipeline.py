"""A LLaMA-Factory pipeline as one chained submission through the whole stack: LoRA SFT, then DPO on the
SFT job's adapter (`adapter_name_or_path: job://pipe-sft`), then LLaMA-Factory's export of the DPO
adapter merged into the base (`job://pipe-dpo`), then an evaluation of the exported model
(`model_name_or_path: job://pipe-export`): LLaMA-Factory's batch prediction with metrics (`do_predict`,
`predict_with_generate`: BLEU and ROUGE). Each job waits for the one before it; the DPO job's
losses are those of `llamafactory-cli train` on the same adapter, the exported weights those of
`llamafactory-cli export`, and the predictions and metrics those of `llamafactory-cli train` on the same
prediction config. Another team naming the SFT job is refused; a chain whose first job fails
has its next job cancelled, saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from safetensors.torch import load_file

from services.api.auth import create_token
from shared.infra.db import connect
from tests.conftest import REPO_ROOT
from tests.e2e.conftest import running_stack
from worker.trainer.interpreter import trainer_python

TIMEOUT = 600
PAIRS = [
    {"instruction": f"Say something about the number {i}.", "input": "", "chosen": f"{i} is a fine number.",
     "rejected": "No."}
    for i in range(8)
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """alpaca (the repo's fixture) and a small preference dataset, readable by the trainers' uid."""
    folder = tmp_path_factory.getbasetemp() / "pipeline-data"
    folder.mkdir(mode=0o755, exist_ok=True)
    shutil.copy(REPO_ROOT / "examples" / "data" / "alpaca_en_demo.json", folder)
    (folder / "pairs.json").write_text(json.dumps(PAIRS))
    columns = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
    registry = {
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "pairs": {"file_name": "pairs.json", "ranking": True, "columns": columns},
    }
    (folder / "dataset_info.json").write_text(json.dumps(registry))
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


@pytest.fixture(scope="module")
def stack(tmp_path_factory, data):
    yield from running_stack(tmp_path_factory, workers=1, cpu_slots=1, roots=[data])


def lora(tiny_model: Path, data: Path, **keys) -> dict:
    return {
        "model_name_or_path": str(tiny_model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(data),
        "template": "qwen3_nothink",
        "cutoff_len": 64,
        "max_samples": 16,
        "per_device_train_batch_size": 2,
        "max_steps": 2,
        "logging_steps": 1,
        "save_steps": 500,
        "seed": 7,
        "report_to": "none",
        "disable_gradient_checkpointing": True,
        **keys,
    }


def export_keys(tiny_model: Path, adapter: str) -> dict:
    return {
        "model_name_or_path": str(tiny_model),
        "adapter_name_or_path": adapter,
        "template": "qwen3_nothink",
        "finetuning_type": "lora",
        "export_dir": "merged",
        "export_size": 1,
        "export_legacy_format": False,
    }


def predict_keys(model: str, data: Path) -> dict:
    """LLaMA-Factory's batch prediction with metrics (its examples/extras/nlg_eval), greedy so it repeats."""
    return {
        "model_name_or_path": model,
        "stage": "sft",
        "do_predict": True,
        "predict_with_generate": True,
        "eval_dataset": "alpaca_en_demo",
        "dataset_dir": str(data),
        "template": "qwen3_nothink",
        "cutoff_len": 64,
        "max_samples": 4,
        "per_device_eval_batch_size": 2,
        "do_sample": False,
        "max_new_tokens": 8,
        "seed": 7,
        "report_to": "none",
    }


@pytest.fixture(scope="module")
def chain(stack, tiny_model, data) -> list[dict]:
    specs = [
        {"name": "pipe-sft", "train": lora(tiny_model, data)},
        {
            "name": "pipe-dpo",
            "train": lora(
                tiny_model, data, stage="dpo", dataset="pairs", adapter_name_or_path="job://pipe-sft", max_steps=3
            ),
        },
        {"name": "pipe-export", "train": export_keys(tiny_model, "job://pipe-dpo")},
        {"name": "pipe-eval", "train": predict_keys("job://pipe-export", data)},
    ]
    r = stack.http.post("/v1/jobs/chain", json={"jobs": specs})
    assert r.status_code == 201, r.text
    return r.json()["items"]


def llamafactory(tmp_path: Path, verb: str, keys: dict) -> subprocess.CompletedProcess:
    """`llamafactory-cli VERB FILE` alone (no ADC code on its path), one CPU thread."""
    config = tmp_path / f"{verb}.yaml"
    config.write_text(yaml.safe_dump(keys, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", ACCELERATE_TORCH_DEVICE="cpu")
    with open(tmp_path / f"{verb}.log", "w") as log:
        done = subprocess.run(
            [str(Path(trainer_python()).parent / "llamafactory-cli"), verb, str(config)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT,
        )
    assert done.returncode == 0, (tmp_path / f"{verb}.log").read_text()[-3000:]
    return done


def finished(stack, job_id: str) -> dict:
    return stack.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=TIMEOUT)


def losses(output_dir: Path) -> dict[int, float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def test_each_job_waits_for_the_one_before_it(stack, chain):
    sft, dpo, *_ = chain
    deadline = time.monotonic() + TIMEOUT
    while "waits for job" not in ((job := stack.job(dpo["id"])).get("pending_reason") or ""):
        assert job["status"] == "pending" and time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["pending_reason"].startswith(f"waits for job {sft['id']} to succeed"), job["pending_reason"]
    assert [m["id"] for m in job["chain"]] == [j["id"] for j in chain]
    done = finished(stack, sft["id"])
    assert done["status"] == "succeeded", done["status_reason"]
    started = stack.sql("SELECT started_at FROM jobs WHERE id = $1", dpo["id"])
    finished_at = stack.sql("SELECT finished_at FROM jobs WHERE id = $1", sft["id"])[0]["finished_at"]
    assert finished(stack, dpo["id"])["status"] == "succeeded"
    assert stack.sql("SELECT started_at FROM jobs WHERE id = $1", dpo["id"])[0]["started_at"] > finished_at, started


def test_dpo_on_the_sft_adapter_trains_as_llamafactory_does(stack, chain, tmp_path):
    sft, dpo = (finished(stack, j["id"]) for j in chain[:2])
    assert dpo["status"] == "succeeded", dpo["status_reason"]
    ran = yaml.safe_load((Path(dpo["job_dir"]) / "attempt-1" / "train.yaml").read_text())
    assert ran["adapter_name_or_path"] == sft["output_dir"]  # job://pipe-sft, resolved by the api
    assert ran["save_steps"] == 500 and isinstance(ran["save_steps"], int)  # as written
    adapter = Path(dpo["output_dir"]) / "adapter_model.safetensors"
    assert adapter.stat().st_mode & 0o044 == 0o044  # the team's to read, not only the trainer uid's
    llamafactory(tmp_path, "train", {**ran, "output_dir": str(tmp_path / "out")})
    theirs, ours = losses(tmp_path / "out"), losses(Path(dpo["output_dir"]))
    assert sorted(ours) == sorted(theirs) == [1, 2, 3]
    for step, loss in theirs.items():
        assert abs(ours[step] - loss) <= 1e-4 * abs(loss), (step, ours[step], loss)


def test_the_export_equals_llamafactorys_export_and_the_team_reads_it(stack, chain, tiny_model, tmp_path):
    dpo, export = (finished(stack, j["id"]) for j in chain[1:3])
    assert export["status"] == "succeeded", export["status_reason"]
    merged = Path(export["output_dir"])
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in merged.iterdir() if p.is_file())
    keys = export_keys(tiny_model, dpo["output_dir"]) | {"export_dir": str(tmp_path / "lf-merged")}
    llamafactory(tmp_path, "export", keys)
    ours, theirs = (
        load_file(str(merged / "model.safetensors")),
        load_file(str(tmp_path / "lf-merged" / "model.safetensors")),
    )
    assert ours.keys() == theirs.keys()
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) == 0.0


def test_the_exported_models_predictions_equal_llamafactorys(stack, chain, tmp_path):
    export, evaluation = (finished(stack, j["id"]) for j in chain[2:])
    assert evaluation["status"] == "succeeded", evaluation["status_reason"]
    ran = yaml.safe_load((Path(evaluation["job_dir"]) / "attempt-1" / "train.yaml").read_text())
    assert ran["model_name_or_path"] == export["output_dir"]  # job://pipe-export, resolved by the api
    ours = Path(evaluation["output_dir"])
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in ours.iterdir() if p.is_file())
    llamafactory(tmp_path, "train", {**ran, "output_dir": str(tmp_path / "out")})
    theirs = tmp_path / "out"
    predictions = [(d / "generated_predictions.jsonl").read_text().splitlines() for d in (ours, theirs)]
    assert len(predictions[0]) == 4 and predictions[0] == predictions[1]
    assert all(json.loads(line)["predict"] for line in predictions[0])
    timing = (
        "predict_runtime",
        "predict_samples_per_second",
        "predict_steps_per_second",
        "predict_model_preparation_time",
    )
    metrics = [json.loads((d / "predict_results.json").read_text()) for d in (ours, theirs)]
    scores = [{k: v for k, v in m.items() if k not in timing} for m in metrics]
    assert {"predict_bleu-4", "predict_rouge-1", "predict_rouge-l"} <= scores[0].keys()
    assert scores[0] == scores[1]
    assert evaluation["evaluation"]["predict"]["predict_bleu-4"] == scores[0]["predict_bleu-4"]  # its event's


def test_another_team_naming_the_job_is_refused(stack, chain, tiny_model, data):
    async def token() -> str:
        conn = await connect(stack.env.database_url)
        try:
            return (await create_token(conn, "beta-user", "user", "beta"))[1]
        finally:
            await conn.close()

    spec = {"name": "steal", "train": lora(tiny_model, data, adapter_name_or_path=f"job://{chain[0]['id']}")}
    spec["train"]["dataset_dir"] = str(REPO_ROOT / "examples" / "data")  # a folder every team reads
    with httpx.Client(
        base_url=stack.stack.api_url, headers={"Authorization": f"Bearer {asyncio.run(token())}"}
    ) as http:
        r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["train", "adapter_name_or_path"] and "no job of team 'beta'" in error["msg"], error


def test_a_failed_job_cancels_the_one_waiting_for_it(stack, tiny_model, data):
    failing = lora(tiny_model, data, quantization_bit=4, quantization_method="hqq")  # needs CUDA: exit 2
    specs = [{"name": "fails", "train": failing}, {"name": "never", "train": lora(tiny_model, data)}]
    r = stack.http.post("/v1/jobs/chain", json={"jobs": specs})
    assert r.status_code == 201, r.text
    first, second = r.json()["items"]
    assert finished(stack, first["id"])["status"] == "failed"
    never = finished(stack, second["id"])
    assert never["status"] == "cancelled" and never["attempt"] == 0, never
    assert f"job {first['id']}, which it runs after, is failed" in never["status_reason"], never["status_reason"]
