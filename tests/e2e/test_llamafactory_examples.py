"""LLaMA-Factory's example configs through the whole stack (api, decider, executor, workers, trainer),
in one stack and all submitted at once:
- examples (a representative set; bench/llamafactory_examples.py runs every one) train to success
  through POST /v1/jobs with only the model, the dataset folder, a 2-step cap and bf16 changed;
- a config needing hardware this node lacks is refused on the node, naming the key;
- LLaMA-Factory's eval keys (val_size, do_eval, eval_strategy/eval_steps) put their metrics on the
  job (`evaluated` events, GET /v1/jobs/{id} `evaluation`);
- `POST /v1/jobs/{id}/export` merges the LoRA job's adapter into its base in a worker's trainer
  environment: the merged model loads alone and matches base + adapter.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example, example_names

# sft (exported below), a preference stage (dpo) and the reward model (its value head). pt, kto, full + ZeRO-3, LoRA + ZeRO-3 and QLoRA: the bench.
CI_EXAMPLES = ("train_lora/qwen3_lora_sft.yaml", "train_lora/qwen3_lora_dpo.yaml", "train_lora/qwen3_lora_reward.yaml")
pytestmark = pytest.mark.skipif(not set(CI_EXAMPLES) <= set(example_names()),
                                reason=f"LLaMA-Factory examples not found at {EXAMPLES}")
TIMEOUT = 900  # seconds for every job of the module on CI's two cores (measured: see the README)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from running_stack(tmp_path_factory, workers=2, cpu_slots=1)


@pytest.fixture(scope="module")
def jobs(stack, tiny_model, data_dir):
    """Every job of the module, submitted at once so the two workers share them."""
    specs = {example: {"name": Path(example).stem.replace("_", "-"), "gpus": 1,
                       "train": adapted_example(example, tiny_model)} for example in CI_EXAMPLES}
    specs["hqq"] = {"name": "needs-gpu", "gpus": 1, "train": {
        **adapted_example("train_qlora/qwen3_lora_sft_otfq.yaml", tiny_model), "quantization_method": "hqq"}}
    specs["eval"] = {"name": "with-eval", "gpus": 1, "train": {
        "model_name_or_path": str(tiny_model), "stage": "sft", "finetuning_type": "lora", "lora_target": "all",
        "dataset": "alpaca_en_demo", "dataset_dir": str(data_dir), "template": "qwen3_nothink", "cutoff_len": 64,
        "max_samples": 16, "per_device_train_batch_size": 2, "max_steps": 4, "logging_steps": 1,
        "val_size": 0.25, "do_train": True, "do_eval": True, "eval_strategy": "steps", "eval_steps": 2,
        "per_device_eval_batch_size": 4}}
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
    # eval_steps 2 of 4 steps, then LLaMA-Factory's do_eval pass at the end.
    assert [e["step"] for e in evaluated] == [2, 4, 4] and all(e["split"] == "eval" for e in evaluated)
    assert all(e["metrics"]["eval_loss"] > 0 for e in evaluated)
    shown = job["evaluation"]["eval"]
    assert shown["step"] == 4 and shown["eval_loss"] == evaluated[-1]["metrics"]["eval_loss"]


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
