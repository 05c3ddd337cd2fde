"""Loading the model and tokenizer and making the right parameters trainable.

finetuning_type:
- lora: peft adapters on `lora_target` (all = every linear layer except the output head);
  with quantization_bit 4|8 the base is loaded through bitsandbytes first (QLoRA).
- freeze: only `freeze_trainable_layers` decoder layers train (positive: the last n,
  negative: the first n), restricted to `freeze_trainable_modules`, plus `freeze_extra_modules`.
- full: every parameter trains.

Mixed precision: bf16/fp16 run as autocast over fp32 master weights (the trainer's `bf16` /
`fp16` arguments). For LoRA the frozen base is loaded in the half type to save memory, the
adapters stay fp32. The device must support the type: fp16 needs CUDA; bf16 needs CUDA with
bf16 support or the CPU (torch runs bf16 on CPU). An unsupported request is a config error,
never a silent change of numerics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


class ModelSetupError(ValueError):
    """A configuration the model or device cannot honour; `key` is the train key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Precision:
    bf16: bool
    fp16: bool

    @property
    def half_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else None

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.half_dtype or torch.float32


def check_precision(settings: dict, device: torch.device) -> Precision:
    bf16, fp16 = bool(settings["bf16"]), bool(settings["fp16"])
    if fp16 and device.type != "cuda":
        raise ModelSetupError(
            "fp16",
            f"fp16: float16 mixed precision needs a CUDA GPU, this rank runs on {device.type}; "
            "use bf16: true (supported on CPU) or fp16: false"
        )
    if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ModelSetupError("bf16", f"bf16: {name} does not support bfloat16; use fp16: true or bf16: false")
    return Precision(bf16=bf16, fp16=fp16)


def load_tokenizer(settings: dict):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        settings["model_name_or_path"], trust_remote_code=settings["trust_remote_code"]
    )
    if tokenizer.pad_token_id is None:
        # Padding positions are masked out of attention and loss, so any id will do.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


_ATTENTION = {"auto": None, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}


def _quantization_config(settings: dict, precision: Precision):
    from transformers import BitsAndBytesConfig

    if settings["quantization_bit"] == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=settings["quantization_type"],
        bnb_4bit_use_double_quant=settings["double_quantization"],
        bnb_4bit_compute_dtype=precision.compute_dtype,
    )


def gradient_checkpointing_wanted(settings: dict) -> bool:
    # LLaMA-Factory checkpoints activations unless told not to; an explicit
    # gradient_checkpointing key wins over disable_gradient_checkpointing.
    if settings["gradient_checkpointing"] is not None:
        return bool(settings["gradient_checkpointing"])
    return not settings["disable_gradient_checkpointing"]


def load_model(settings: dict, precision: Precision, device: torch.device):
    from transformers import AutoModelForCausalLM

    kwargs: dict = {"trust_remote_code": settings["trust_remote_code"]}
    attention = _ATTENTION[settings["flash_attn"]]
    if attention:
        kwargs["attn_implementation"] = attention
    quantized = settings["quantization_bit"] is not None
    if quantized:
        kwargs["quantization_config"] = _quantization_config(settings, precision)
        kwargs["device_map"] = {"": device}
        kwargs["dtype"] = precision.compute_dtype
    elif settings["finetuning_type"] == "lora" and precision.half_dtype is not None:
        kwargs["dtype"] = precision.half_dtype
    else:
        kwargs["dtype"] = torch.float32
    model = AutoModelForCausalLM.from_pretrained(settings["model_name_or_path"], **kwargs)
    model.config.use_cache = False  # the KV cache is for generation; training only wastes memory on it

    checkpointing = gradient_checkpointing_wanted(settings)
    if quantized:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    method = settings["finetuning_type"]
    if method == "lora":
        model = _apply_lora(model, settings)
    elif method == "freeze":
        _apply_freeze(model, settings)
    else:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelSetupError("finetuning_type", f"finetuning_type {method!r}: the settings leave no parameter to train")
    return model


def _apply_lora(model, settings: dict):
    from peft import LoraConfig, get_peft_model

    targets = settings["lora_target"]
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=settings["lora_rank"],
        lora_alpha=settings["lora_alpha"] or settings["lora_rank"] * 2,
        lora_dropout=settings["lora_dropout"],
        target_modules="all-linear" if targets == ["all"] else targets,
        modules_to_save=settings["additional_target"],
        use_rslora=settings["use_rslora"],
        use_dora=settings["use_dora"],
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ModelSetupError("lora_target", f"lora_target {','.join(targets)!r}: {exc}") from exc


def _layer_index(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def _apply_freeze(model, settings: dict) -> None:
    total = model.config.num_hidden_layers
    count = settings["freeze_trainable_layers"]
    if abs(count) > total:
        raise ModelSetupError("freeze_trainable_layers", f"freeze_trainable_layers is {count} but the model has {total} layers")
    layers = set(range(total - count, total)) if count > 0 else set(range(-count))
    modules = settings["freeze_trainable_modules"]
    extra = settings["freeze_extra_modules"] or []
    names = [name for name, _ in model.named_parameters()]
    for name, parameter in model.named_parameters():
        index = _layer_index(name)
        in_layer = index in layers and (modules == ["all"] or any(f".{m}." in name for m in modules))
        in_extra = any(f"{m}." in name or name.startswith(m) for m in extra)
        parameter.requires_grad_(in_layer or in_extra)
    unmatched = [m for m in extra if not any(m in n for n in names)]
    if unmatched:
        raise ModelSetupError("freeze_extra_modules", f"freeze_extra_modules: no parameter matches {', '.join(unmatched)}")
