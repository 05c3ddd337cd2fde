"""LLaMA-Factory's example configs through the whole stack (api, decider, executor, workers, trainer),
in one stack and all submitted at once:
- examples (a representative set; bench/llamafactory_examples.py runs every one) train to success
  through POST /v1/jobs with only the model, the dataset folder, a 2-step cap and bf16 changed;
- a config needing hardware this node lacks is refused on the node, naming the key;
- LLaMA-Factory's eval keys (val_size, do_eval, eval_strategy/eval_steps, do_predict) put their
  metrics on the job (`evaluated` events, GET /v1/jobs/{id} `evaluation`);
- a DPO example job migrated mid-training ends bit-identical to the same job left alone;
- `POST /v1/jobs/{id}/export` merges the LoRA job's adapter into its base in a worker's trainer
  environment: the merged model loads alone and matches base + adapter.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import models_root
from tests.e2e.conftest import running_stack
from tests.e2e.test_protocols import wait_stopping
from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example, example_names

# sft (exported below), a preference stage (dpo) and the reward model (its value head). pt, kto, full + ZeRO-3, LoRA + ZeRO-3 and QLoRA: the bench.
CI_EXAMPLES = ("train_lora/qwen3_lora_sft.yaml", "train_lora/qwen3_lora_dpo.yaml", "train_lora/qwen3_lora_reward.yaml")
pytestmark = pytest.mark.skipif(
    not set(CI_EXAMPLES) <= set(example_names()), reason=f"LLaMA-Factory examples not found at {EXAMPLES}"
)
TIMEOUT = 900  # seconds for every job of the module on CI's two cores (the suite's times: docs/benchmarks.md)
DPO_STEPS = 10  # long enough for a move to land before the end


def dpo_spec(tiny_model, name: str) -> dict:
    return {
        "name": name,
        "gpus": 1,
        "train": {**adapted_example("train_lora/qwen3_lora_dpo.yaml", tiny_model, DPO_STEPS), "logging_steps": 1},
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # LLaMA-Factory's examples folder (data, DeepSpeed configs) is a folder the jobs' team may read.
    # The examples set `trust_remote_code: true`, which runs only for models in a trusted code root:
    # the admin of a cluster taking these configs lists its vetted models' folder, as here.
    yield from running_stack(
        tmp_path_factory,
        workers=2,
        cpu_slots=1,
        roots=[EXAMPLES.parent],
        trusted_code_roots=[models_root(tmp_path_factory)],
    )


@pytest.fixture(scope="module")
def jobs(stack, tiny_model):
    """Every job of the module, submitted at once so the two workers share them."""
    specs = {
        example: {
            "name": Path(example).stem.replace("_", "-"),
            "gpus": 1,
            "train": adapted_example(example, tiny_model),
        }
        for example in CI_EXAMPLES
    }
    specs["hqq"] = {
        "name": "needs-gpu",
        "gpus": 1,
        "train": {**adapted_example("train_qlora/qwen3_lora_sft_otfq.yaml", tiny_model), "quantization_method": "hqq"},
    }
    # A reward model: LLaMA-Factory's do_predict scores the held-out pairs without generation.
    specs["eval"] = {
        "name": "with-eval",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(tiny_model),
            "stage": "rm",
            "finetuning_type": "lora",
            "lora_target": "all",
            "dataset": "dpo_en_demo",
            "dataset_dir": str(EXAMPLES.parent / "data"),
            "template": "qwen3_nothink",
            "cutoff_len": 64,
            "max_samples": 16,
            "per_device_train_batch_size": 2,
            "max_steps": 4,
            "logging_steps": 1,
            "val_size": 0.25,
            "do_train": True,
            "do_eval": True,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "do_predict": True,
            "per_device_eval_batch_size": 4,
        },
    }
    specs["dpo-reference"] = dpo_spec(tiny_model, "dpo-left-alone")
    return {key: stack.submit(spec)["id"] for key, spec in specs.items()}


def finished(stack, job_id: str) -> dict:
    return stack.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=TIMEOUT)


def events(stack, job_id: str, **params) -> list[dict]:
    r = stack.http.get(f"/v1/jobs/{job_id}/events", params=params)
    assert r.status_code == 200, r.text
    return r.json()["items"]


@pytest.mark.parametrize("example", CI_EXAMPLES)
def test_example_trains_to_success_through_the_api(stack, jobs, example):
    job = finished(stack, jobs[example])
    assert job["status"] == "succeeded", job["status_reason"]
    assert job["progress"]["step"] == 2
    output = Path(job["output_dir"])
    # (plot_loss draws nothing here: logging_steps 10 logs no loss in 2 steps; ADC logs progress each step.)
    for name in ("trainer_state.json", "all_results.json", "train_results.json", "adapter_model.safetensors"):
        assert (output / name).is_file(), (name, sorted(p.name for p in output.iterdir()))
    kinds = [e["kind"] for e in events(stack, jobs[example])]
    assert kinds.index("started") < kinds.index("checkpointed") < kinds.index("exited"), kinds
    if "reward" in example:  # the value head is part of the model and of its checkpoint
        assert (output / "value_head.safetensors").is_file()
        assert (output / "checkpoint-2" / "value_head.safetensors").is_file()


def test_a_config_needing_a_gpu_is_refused_on_a_cpu_node_naming_the_key(stack, jobs):
    job = finished(stack, jobs["hqq"])
    assert job["status"] == "failed" and job["exit_code"] == 2
    assert "quantization_method" in job["status_reason"] and "CUDA" in job["status_reason"]


def test_evaluation_metrics_reach_the_job(stack, jobs):
    job = finished(stack, jobs["eval"])
    assert job["status"] == "succeeded", job["status_reason"]
    evaluated = [e["data"] for e in events(stack, jobs["eval"]) if e["kind"] == "evaluated"]
    # eval_steps 2 of 4 steps, LLaMA-Factory's do_eval pass at the end, then do_predict.
    assert [(e["split"], e["step"]) for e in evaluated] == [("eval", 2), ("eval", 4), ("eval", 4), ("predict", 4)]
    assert all(e["metrics"]["eval_loss"] > 0 and 0 <= e["metrics"]["eval_accuracy"] <= 1 for e in evaluated[:3])
    assert evaluated[3]["metrics"]["predict_loss"] > 0
    shown = job["evaluation"]
    assert shown["eval"]["step"] == 4 and shown["eval"]["eval_loss"] == evaluated[2]["metrics"]["eval_loss"]
    assert shown["predict"]["predict_loss"] == evaluated[3]["metrics"]["predict_loss"]
    assert (Path(job["output_dir"]) / "generated_predictions.jsonl").is_file()  # LLaMA-Factory's rm predictions


def test_lora_job_is_exported_by_a_worker_and_matches_base_plus_adapter(stack, jobs, tiny_model):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = finished(stack, jobs["train_lora/qwen3_lora_sft.yaml"])
    assert source["status"] == "succeeded", source["status_reason"]
    r = stack.http.post(f"/v1/jobs/{source['id']}/export", json={"dtype": "float32"})
    assert r.status_code == 201, r.text
    export = finished(stack, r.json()["id"])
    assert export["status"] == "succeeded", export["status_reason"]
    merged_dir = Path(export["output_dir"])
    assert (merged_dir / "model.safetensors").is_file() and not (merged_dir / "adapter_config.json").exists()
    assert (merged_dir / "Modelfile").is_file()  # LLaMA-Factory's Ollama file, from the job's template
    trail = stack.audit(job_id=export["id"])
    assert [e["data"].get("export_of") for e in trail if e["kind"] == "job.submitted"] == [source["id"]]

    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), source["output_dir"])
    tokens = AutoTokenizer.from_pretrained(merged_dir)("Give three tips for staying healthy.", return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(merged(**tokens).logits, adapted(**tokens).logits, atol=1e-5)


def test_dpo_job_migrated_mid_training_is_bit_identical(stack, jobs, tiny_model):
    reference = finished(stack, jobs["dpo-reference"])
    assert reference["status"] == "succeeded", reference["status_reason"]
    for job_id in jobs.values():  # both workers free, so the move has a target
        finished(stack, job_id)
    job_id = stack.submit(dpo_spec(tiny_model, "dpo-moved"))["id"]
    deadline = time.monotonic() + TIMEOUT
    while not ((job := stack.job(job_id))["status"] == "running" and (job["progress"] or {}).get("step", 0) >= 2):
        assert job["status"] not in {"succeeded", "failed", "cancelled"} and time.monotonic() < deadline, job
        time.sleep(0.1)
    source = job["placement"][0]["node"]
    with stack.trainer_held(job_id):  # 10 steps: held while the target gets ready, it cannot finish first
        r = stack.http.post(
            f"/v1/jobs/{job_id}/migrate", json={"target_node": "node-2" if source == "node-1" else "node-1"}
        )
        assert r.status_code == 202, r.text
        wait_stopping(stack, job_id)
    done = finished(stack, job_id)
    assert done["status"] == "succeeded", done["status_reason"]
    assert done["attempt"] == 2 and done["placement"][0]["node"] != source, done
    history = [
        row["new_status"]
        for row in stack.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)
    ]
    assert "migrating" in history, history
    moved, alone = (load_file(str(Path(j["output_dir"]) / "adapter_model.safetensors")) for j in (done, reference))
    assert moved.keys() == alone.keys()
    assert max(float((moved[k] - alone[k]).abs().max()) for k in moved) == 0.0
