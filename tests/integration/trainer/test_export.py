"""Export: a trained LoRA job becomes a standard model folder that AutoModelForCausalLM loads alone."""

from __future__ import annotations

import pytest
import torch

from worker.trainer.export import ExportError, export_model
from worker.trainer.export import main as export_main


def test_lora_adapter_is_merged_into_a_standalone_model(lora_reference_and_stopped, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, reference, _ = lora_reference_and_stopped
    out = export_model(reference.output_dir, tmp_path / "exported")
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()

    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name in merged.state_dict())
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), reference.output_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokens = AutoTokenizer.from_pretrained(out)("Give three tips for staying healthy.", return_tensors="pt")
    with torch.no_grad():
        merged_logits = merged(**tokens).logits
        assert torch.allclose(merged_logits, adapted(**tokens).logits, atol=1e-5)
        assert not torch.allclose(merged_logits, base(**tokens).logits, atol=1e-4)  # the adapter did something


def test_export_command_line_and_its_refusal(lora_reference_and_stopped, tmp_path):
    _, reference, _ = lora_reference_and_stopped
    assert export_main(["--job-output", str(reference.output_dir), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "config.json").is_file()
    assert export_main(["--job-output", str(tmp_path / "cli" / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    with pytest.raises(ExportError, match="neither a LoRA adapter"):
        export_model(tmp_path, tmp_path / "nothing")
