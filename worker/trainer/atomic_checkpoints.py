"""Checkpoints that appear atomically, for every LLaMA-Factory trainer.

transformers' Trainer writes `checkpoint-N` in place, file by file; a job killed mid-save leaves a
folder that looks like a checkpoint and is not one (and LLaMA-Factory would resume from it by
itself). LLaMA-Factory builds its own Trainer subclass per stage (SFT, DPO, KTO, RM, PT), all of
which save through `Trainer._save_checkpoint`, so ADC wraps that one method in the trainer
process, once, before `run_exp`:

- every rank writes into `output_dir/.staging/checkpoint-N` (through `_get_output_dir`);
- all ranks meet at a barrier; rank 0 writes the manifest and renames the folder into place;
- `save_total_limit` prunes published checkpoints, never the one the run resumed from;
- both only while the job's fence names this attempt (fence.py): a trainer whose attempt was
  superseded (its node was declared lost and the job restarted elsewhere) publishes nothing and stops;
- then, and only then, the `checkpointed` event is sent.

LLaMA-Factory's reward-model trainer rewrites each checkpoint in its `on_save` callback (it splits
the value head into `value_head.safetensors` and re-saves the decoder or adapter), which would run
on the published folder, after the manifest. ADC takes that callback off the trainer and runs the
same function (`fix_valuehead_checkpoint`) on the staged folder, before the rename.

Nothing in site-packages is changed; the wrap lives only in the trainer's process.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from worker.trainer import checkpoints, fence
from worker.trainer.events import EventWriter


class CheckpointPublisher:
    """What the wrapped `_save_checkpoint` needs to know about the run."""

    def __init__(self, events: EventWriter, manifest: dict, resumed_from: str | None) -> None:
        self.events = events
        self.manifest = manifest
        self.resumed_from = Path(resumed_from) if resumed_from else None
        self.last_checkpoint: Path | None = None
        self.fence = fence.from_environment()

    def install(self) -> None:
        from transformers import Trainer

        publisher = self
        original_save = Trainer._save_checkpoint
        original_output_dir = Trainer._get_output_dir

        def _get_output_dir(trainer, trial):
            if getattr(trainer, "_adc_writing_to_staging", False):
                return str(checkpoints.staging_root(trainer.args.output_dir))
            return original_output_dir(trainer, trial)

        def _save_checkpoint(trainer, model, trial):
            publisher._save(trainer, lambda: original_save(trainer, model, trial))

        Trainer._get_output_dir = _get_output_dir
        Trainer._save_checkpoint = _save_checkpoint

    def _save(self, trainer, save) -> None:
        began = time.monotonic()  # the save's cost to the step, in the `checkpointed` event
        step = trainer.state.global_step
        output_dir = Path(trainer.args.output_dir)
        staged = checkpoints.staging_root(output_dir) / checkpoints.checkpoint_name(step)
        if trainer.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # debris of a killed run at the same step
        trainer.accelerator.wait_for_everyone()
        trainer._adc_writing_to_staging = True
        try:
            save()
        finally:
            trainer._adc_writing_to_staging = False
        trainer.accelerator.wait_for_everyone()  # every rank's files (RNG, shards) are in `staged`
        final = output_dir / checkpoints.checkpoint_name(step)
        superseded: fence.Superseded | None = None
        if trainer.args.should_save:
            _fix_value_head_in_staging(trainer, staged)
            manifest = {**self.manifest, "step": step, "max_steps": trainer.state.max_steps, "saved_at": time.time()}
            try:
                with fence.holding(*self.fence):
                    checkpoints.publish(staged, output_dir, manifest)
                    protect = {self.resumed_from, final} if self.resumed_from else {final}
                    checkpoints.prune(output_dir, trainer.args.save_total_limit, protect=protect)
            except fence.Superseded as err:
                shutil.rmtree(staged, ignore_errors=True)
                superseded = err
        trainer.accelerator.wait_for_everyone()  # nobody reports or resumes before the rename
        if superseded is not None:
            raise superseded
        self.last_checkpoint = final
        self.events.emit("checkpointed", step=step, path=str(final), save_s=round(time.monotonic() - began, 3))


def _fix_value_head_in_staging(trainer, staged: Path) -> None:
    """What LLaMA-Factory's FixValueHeadModelCallback does on save, done before the checkpoint is published."""
    if not getattr(trainer, "_adc_fixes_value_head", False):
        if "FixValueHeadModelCallback" not in {type(cb).__name__ for cb in trainer.callback_handler.callbacks}:
            return
        from llamafactory.train.callbacks import FixValueHeadModelCallback

        trainer.remove_callback(FixValueHeadModelCallback)  # it would rewrite the published folder
        trainer._adc_fixes_value_head = True
    from llamafactory.train.callbacks import fix_valuehead_checkpoint

    fix_valuehead_checkpoint(trainer.model, str(staged), getattr(trainer.args, "save_safetensors", True))
