"""Model loading for each finetuning_type, quantization and precision rules (in process, tiny model)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from shared.train_spec import defaults
from worker.trainer.model_setup import ModelSetupError, Precision, check_precision, load_model

CPU = torch.device("cpu")
FP32 = Precision(bf16=False, fp16=False)


def settings_for(model_dir, **overrides) -> dict:
    return {**defaults(), "model_name_or_path": str(model_dir), "gradient_checkpointing": False, **overrides}


def trainable(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_lora_all_targets_every_linear_layer_but_the_head(tiny_model_dir):
    model = load_model(settings_for(tiny_model_dir, lora_rank=4), FP32, CPU)
    names = trainable(model)
    assert names and all("lora_" in n for n in names)
    targeted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert model.peft_config["default"].lora_alpha == 8  # LLaMA-Factory's default: twice the rank


def test_lora_named_targets_and_unknown_target(tiny_model_dir):
    model = load_model(settings_for(tiny_model_dir, lora_target=["q_proj", "v_proj"]), FP32, CPU)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable(model)} == {"q_proj", "v_proj"}
    with pytest.raises(ModelSetupError) as caught:
        load_model(settings_for(tiny_model_dir, lora_target=["no_such_proj"]), FP32, CPU)
    assert caught.value.key == "lora_target"


def test_freeze_trains_the_chosen_layers_and_modules(tiny_model_dir):
    first = load_model(settings_for(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=-1,
                                    freeze_trainable_modules=["mlp"], freeze_extra_modules=["model.norm"]),
                       FP32, CPU)
    names = trainable(first)
    assert names == {n for n, _ in first.named_parameters()
                     if n.startswith("model.layers.0.mlp.") or n.startswith("model.norm")}
    with pytest.raises(ModelSetupError) as caught:
        load_model(settings_for(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=5), FP32, CPU)
    assert caught.value.key == "freeze_trainable_layers"


def test_full_trains_everything_in_fp32(tiny_model_dir):
    model = load_model(settings_for(tiny_model_dir, finetuning_type="full"), FP32, CPU)
    assert trainable(model) == {n for n, _ in model.named_parameters()}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_gradient_checkpointing_follows_llamafactory_default(tiny_model_dir):
    on = load_model({**settings_for(tiny_model_dir), "gradient_checkpointing": None}, FP32, CPU)
    off = load_model({**settings_for(tiny_model_dir), "gradient_checkpointing": None,
                      "disable_gradient_checkpointing": True}, FP32, CPU)
    assert on.base_model.model.is_activation_checkpointing and not off.base_model.model.is_activation_checkpointing


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
@pytest.mark.parametrize(("bits", "layer_class"), [(4, "Linear4bit"), (8, "Linear8bitLt")])
def test_qlora_quantizes_the_base_with_bitsandbytes(tiny_model_dir, bits, layer_class):
    model = load_model(settings_for(tiny_model_dir, quantization_bit=bits), FP32, CPU)
    classes = {type(m).__name__ for m in model.modules()}
    assert layer_class in classes
    assert all("lora_" in n for n in trainable(model))


def test_precision_rules_on_cpu():
    assert check_precision({"bf16": True, "fp16": False}, CPU).compute_dtype == torch.bfloat16
    with pytest.raises(ModelSetupError) as caught:
        check_precision({"bf16": False, "fp16": True}, CPU)
    assert caught.value.key == "fp16"


def test_tiny_model_builder_is_idempotent_and_loads_as_a_standard_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.trainer.tiny_model import MARKER, build_tiny_llama

    stamp = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_llama(tiny_model_dir) == tiny_model_dir
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tokenizer) and tokenizer.chat_template
    info = json.loads((tiny_model_dir / MARKER).read_text())
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    # Fixed seed: a second build gives the same weights.
    again = AutoModelForCausalLM.from_pretrained(build_tiny_llama(tmp_path / "again"))
    assert all(a.equal(b) for a, b in zip(model.parameters(), again.parameters()))
