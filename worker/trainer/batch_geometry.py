"""How many samples make one optimizer step, and how that survives a change of world size.

global batch = per_device_train_batch_size x gradient_accumulation_steps x world size.

The global batch, not gradient_accumulation_steps, is what must stay fixed for a run to mean
the same thing (same samples per step, same learning-rate schedule). So the target global
batch is chosen first, by the first rule that applies:

1. resuming from a checkpoint whose manifest records a global batch: that one (a job moved
   from 4 GPUs to 2 keeps its batch; gradient accumulation doubles);
2. `adc_global_batch_size` in the train section: that one (lets a job be started at any size);
3. otherwise per_device x gradient_accumulation_steps x world size, as written.

Then gradient_accumulation_steps = global batch / (per_device x world size), which must be a
whole number >= 1, else the job is refused naming the numbers. On resume with no max_steps
in the spec, the checkpoint's max_steps is kept so the learning-rate schedule is unchanged.

Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


class BatchGeometryError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class BatchPlan:
    per_device: int
    gradient_accumulation_steps: int
    world_size: int
    global_batch: int
    source: str  # "checkpoint" | "adc_global_batch_size" | "spec"
    max_steps: int  # -1: from num_train_epochs

    def as_manifest(self) -> dict:
        return {
            "per_device_train_batch_size": self.per_device,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "world_size": self.world_size,
            "global_batch_size": self.global_batch,
        }


def plan_batch(settings: dict, world_size: int, manifest: dict | None = None) -> BatchPlan:
    per_device = settings["per_device_train_batch_size"]
    max_steps = settings["max_steps"]
    if manifest and manifest.get("global_batch_size"):
        target, source = int(manifest["global_batch_size"]), "checkpoint"
        if max_steps <= 0 and manifest.get("max_steps"):
            max_steps = int(manifest["max_steps"])
    elif settings.get("adc_global_batch_size"):
        target, source = int(settings["adc_global_batch_size"]), "adc_global_batch_size"
    else:
        target = per_device * settings["gradient_accumulation_steps"] * world_size
        source = "spec"
    per_step = per_device * world_size
    if target % per_step or target < per_step:
        origin = {"checkpoint": "recorded in the checkpoint", "adc_global_batch_size": "adc_global_batch_size"}
        key = {"checkpoint": "resume_from_checkpoint", "adc_global_batch_size": "adc_global_batch_size"}
        raise BatchGeometryError(
            key.get(source, "per_device_train_batch_size"),
            f"global batch {target} ({origin.get(source, 'requested')}) cannot be split over {world_size} rank(s) "
            f"x per_device_train_batch_size {per_device}: it must be a multiple of {per_step}",
        )
    return BatchPlan(
        per_device=per_device,
        gradient_accumulation_steps=target // per_step,
        world_size=world_size,
        global_batch=target,
        source=source,
        max_steps=max_steps,
    )
