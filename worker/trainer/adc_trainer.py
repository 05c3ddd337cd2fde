"""Hugging Face's Trainer with checkpoints that appear atomically.

The stock Trainer writes `checkpoint-N` in place, file by file; a job killed mid-save leaves
a folder that looks like a checkpoint and is not one. Here every rank writes into
`.staging/checkpoint-N` (the Trainer is pointed there through `_get_output_dir`), all ranks
meet at a barrier, rank 0 writes the manifest and renames the folder into place, and only
then is the `checkpointed` event sent. Rotation (save_total_limit) works on published
checkpoints and never deletes the one the run resumed from.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from transformers import Trainer

from worker.trainer import checkpoints
from worker.trainer.events import EventWriter


class ADCTrainer(Trainer):
    def __init__(
        self,
        *args,
        events: EventWriter,
        manifest: dict,
        save_total_limit: int | None = None,
        resumed_from: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.events = events
        self.manifest = manifest
        self.keep_checkpoints = save_total_limit
        self.resumed_from = Path(resumed_from) if resumed_from else None
        self.last_checkpoint: Path | None = None
        self._writing_to_staging = False

    def _get_output_dir(self, trial) -> str:
        if self._writing_to_staging:
            return str(checkpoints.staging_root(self.args.output_dir))
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        step = self.state.global_step
        output_dir = Path(self.args.output_dir)
        staged = checkpoints.staging_root(output_dir) / checkpoints.checkpoint_name(step)
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # debris of a killed run at the same step
        self.accelerator.wait_for_everyone()
        self._writing_to_staging = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._writing_to_staging = False
        self.accelerator.wait_for_everyone()  # every rank's files (RNG, shards) are in `staged`
        final = output_dir / checkpoints.checkpoint_name(step)
        if self.args.should_save:
            manifest = {**self.manifest, "step": step, "max_steps": self.state.max_steps, "saved_at": time.time()}
            checkpoints.publish(staged, output_dir, manifest)
            protect = {self.resumed_from} if self.resumed_from else set()
            checkpoints.prune(output_dir, self.keep_checkpoints, protect=protect | {final})
        self.accelerator.wait_for_everyone()  # nobody reports or resumes before the rename
        self.last_checkpoint = final
        self.events.emit("checkpointed", step=step, path=str(final))
