"""Checkpoints are read as data, never run as code: DeepSpeed's resume made safe.

DeepSpeed (0.19) unpickles its checkpoints with `torch.load(..., weights_only=False)` (its checkpoint
engine, ZeRO and universal checkpoints), and a pickle can run any code. A run that resumes from a
checkpoint another job wrote (its team's) would then run whatever that job's trainer put there.
So a DeepSpeed trainer's `torch.load` always has `weights_only=True`: tensors, containers and
numbers only, plus the few DeepSpeed classes its checkpoints hold, which are plain records (loss
scaler settings, the ZeRO stage, a fragment's offset and size) with no code of their own to run when
rebuilt. Anything else in a checkpoint is refused (an UnpicklingError naming it), not executed.
transformers and PEFT load with `weights_only=True` already. Importable without torch.
"""

from __future__ import annotations

import importlib

# What DeepSpeed's ZeRO checkpoints (stages 1-3, fp32 and fp16) hold beyond tensors and containers.
DEEPSPEED_RECORDS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _records() -> list[type]:
    found = []
    for module, name in DEEPSPEED_RECORDS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed version: one record fewer, refused if met
            continue
    return found


def load_checkpoints_as_data() -> None:
    """From now on every `torch.load` in this process is weights_only, whatever its caller asks."""
    import torch

    if getattr(torch.load, "adc_weights_only", False):
        return
    original = torch.load
    records: list[type] | None = None

    def load(f, *args, weights_only=None, **kwargs):  # noqa: ARG001 - the caller's weights_only is overruled
        nonlocal records
        if records is None:
            records = _records()
        with torch.serialization.safe_globals(records):
            return original(f, *args, weights_only=True, **kwargs)

    load.adc_weights_only = True
    load.__doc__ = original.__doc__
    torch.load = load
