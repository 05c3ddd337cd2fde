"""Export through LLaMA-Factory's export: a trained LoRA job becomes a standard model folder that
AutoModelForCausalLM loads alone, with the same outputs as base + adapter."""

from __future__ import annotations

import subprocess

import torch

from tests.integration.trainer.trainer_process import REPO
from worker.trainer.interpreter import trainer_python


def export(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([trainer_python(), "-m", "worker.trainer.export", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_lora_adapter_is_merged_into_a_standalone_model(lora_runs, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = lora_runs.reference
    out = tmp_path / "exported"
    done = export("--job-output", str(reference.output_dir), "--out", str(out), "--template", "qwen3_nothink",
                  "--dtype", "float32")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    assert (out / "Modelfile").is_file()  # LLaMA-Factory's Ollama file, from the template

    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name in merged.state_dict())
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), reference.output_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokens = AutoTokenizer.from_pretrained(out)("Give three tips for staying healthy.", return_tensors="pt")
    with torch.no_grad():
        merged_logits = merged(**tokens).logits
        assert torch.allclose(merged_logits, adapted(**tokens).logits, atol=1e-5)
        assert not torch.allclose(merged_logits, base(**tokens).logits, atol=1e-4)  # the adapter did something


def test_export_refuses_a_folder_without_adapter_or_model(tmp_path):
    done = export("--job-output", str(tmp_path), "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "neither a LoRA adapter" in done.stderr
