"""LLaMA-Factory's results files as `llamafactory-cli train` writes them, under ADC's `disable_tqdm`.

With `disable_tqdm: true` (which ADC sets: a trainer log of progress bars helps nobody) transformers
prints logs through its `PrinterCallback`, whose `on_log` pops `total_flos` from the very dict the
Trainer then returns as the run's metrics: `train_results.json` and `all_results.json` lost the key
that LLaMA-Factory's own run (progress bars on) writes. The printer is given a copy instead.
"""

from __future__ import annotations


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
