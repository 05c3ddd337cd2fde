"""LLaMA-Factory's results files as `llamafactory-cli train` writes them, under ADC's `disable_tqdm`.

With `disable_tqdm: true` (which ADC sets: a trainer log of progress bars helps nobody) transformers
prints logs through its `PrinterCallback`, whose `on_log` pops `total_flos` from the very dict the
Trainer then returns as the run's metrics: `train_results.json` and `all_results.json` lost the key
that LLaMA-Factory's own run (progress bars on) writes. The printer is given a copy instead.

The files are made readable by the team at the end: safetensors files are written 0600, which under
per-job uids would keep the next job of a pipeline (`job://`) and the team's people out of the model.
"""

from __future__ import annotations

import os
from pathlib import Path


def keep_total_flos() -> None:
    """PrinterCallback prints (and pops from) a copy of the logs; the Trainer's metrics keep total_flos."""
    from transformers import trainer_callback

    printer = trainer_callback.PrinterCallback
    if getattr(printer.on_log, "adc_copies_logs", False):
        return
    original = printer.on_log

    def on_log(self, args, state, control, logs=None, **kwargs):
        return original(self, args, state, control, logs=dict(logs) if logs is not None else None, **kwargs)

    on_log.adc_copies_logs = True
    printer.on_log = on_log


def readable_by_team(folder: Path) -> None:
    """Files group- and world-readable, folders traversable: the model is the team's, whatever uid wrote it
    (safetensors and tokenizer files are written 0600 through temporary files)."""
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            path = Path(root) / name
            path.chmod(path.stat().st_mode | 0o055)
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o044)
