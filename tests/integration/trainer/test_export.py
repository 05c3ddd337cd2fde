"""Export through LLaMA-Factory's export, from the command line. That a trained LoRA job becomes a
standard model folder with the outputs of base + adapter is shown through the whole stack (a worker
runs the export job): tests/e2e/test_llamafactory_examples.py."""

from __future__ import annotations

import json
import subprocess

from tests.integration.trainer.trainer_process import REPO, run_trainer
from worker.trainer.interpreter import trainer_python


def export(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [trainer_python(), "-m", "worker.trainer.export", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_export_refuses_a_folder_without_adapter_or_model(tmp_path):
    done = export("--job-output", str(tmp_path), "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "neither a LoRA adapter" in done.stderr


def test_an_export_config_saves_a_full_model_as_llamafactory_export_does(tmp_path, tiny_model_dir):
    """A job whose train section is LLaMA-Factory's export config (`llamafactory-cli export`): a full
    model saved again with LLaMA-Factory's keys (export_legacy_format is accepted; transformers 5 writes
    safetensors whatever it says, as under `llamafactory-cli export`); quantization, which needs GPTQ on
    a CUDA GPU, refused on this node by name."""
    config = {
        "model_name_or_path": str(tiny_model_dir),
        "finetuning_type": "full",
        "template": "qwen3_nothink",
        "export_dir": "merged",
        "export_size": 1,
        "export_legacy_format": True,
    }
    run = run_trainer(tmp_path / "job", config)
    assert run.returncode == 0, run.log_tail()
    assert [e["event"] for e in run.events] == ["started", "succeeded"]
    files = {p.name: p for p in run.output_dir.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "Modelfile"} <= files.keys(), files
    assert ".exporting" not in files
    quantized = run_trainer(tmp_path / "quantized", {**config, "export_quantization_bit": 4})
    assert quantized.returncode == 2
    [failed] = quantized.of("failed")
    assert failed["errors"][0]["loc"] == ["train", "export_quantization_bit"] and "GPTQ" in failed["error"]


_ADAPTER = """
import sys
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = get_peft_model(AutoModelForCausalLM.from_pretrained(sys.argv[1]), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
model.save_pretrained(sys.argv[2])
"""


def test_the_apis_export_of_a_lora_job_merges_its_adapter(tmp_path, tiny_model_dir):
    """What `POST /v1/jobs/{id}/export` queues (`adc_export_of` and LLaMA-Factory's export keys), run by
    the trainer: the adapter merged into its base, in the dtype asked for."""
    adapter = tmp_path / "adapter"
    made = subprocess.run(
        [trainer_python(), "-c", _ADAPTER, str(tiny_model_dir), str(adapter)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    train = {
        "adc_export_of": "jsource",
        "model_name_or_path": str(tiny_model_dir),
        "adapter_name_or_path": str(adapter),
        "template": "qwen3_nothink",
        "finetuning_type": "lora",
        "infer_dtype": "bfloat16",
        "export_size": 5,
        "export_legacy_format": False,
    }
    run = run_trainer(tmp_path / "job", train)
    assert run.returncode == 0, run.log_tail()
    assert run.one("succeeded")["export_of"] == "jsource"
    config = json.loads((run.output_dir / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert not (run.output_dir / "adapter_config.json").exists()
