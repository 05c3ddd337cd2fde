"""What the ADC callback costs per training step, measured inside one training run.

    .venv/bin/python bench/trainer_overhead.py [--size 13m] [--steps 40]

Builds the ~13M-parameter tiny Llama (once, in a cache folder) and trains LoRA SFT on the
alpaca fixture with ADC's trainer. The ADC callback (stop-file check and stop agreement every
step, a progress event every step here: logging_steps 1, its worst case) is switched on for
odd steps and off for even ones, so both kinds of step share the same process, model, data
and machine load; the step times of the two kinds are printed side by side. The time spent
inside the callback itself is also measured directly, which stays exact on a noisy machine.
ADC's target: overhead <= 1% of a step.

A figure to read, not a test: nothing here asserts on wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _instruments(adc_callback):
    """A step timer, and a wrapper that runs the ADC callback on odd steps only and times it."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[tuple[int, float]] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append((state.global_step, time.perf_counter()))
            return control

    class EveryOtherStep(TrainerCallback):
        def __init__(self) -> None:
            self.active = True
            self.seconds_in = {"on_step_end": 0.0, "on_log": 0.0}
            self.active_steps = 0

        @property
        def seconds_inside(self) -> float:
            return sum(self.seconds_in.values())

        def _forward(self, name, args, state, control, **kwargs):
            begin = time.perf_counter()
            control = getattr(adc_callback, name)(args, state, control, **kwargs)
            self.seconds_in[name] += time.perf_counter() - begin
            return control

        def on_train_begin(self, args, state, control, **kwargs):
            return adc_callback.on_train_begin(args, state, control, **kwargs)

        def on_step_end(self, args, state, control, **kwargs):
            self.active = state.global_step % 2 == 1
            if not self.active:
                return control
            self.active_steps += 1
            return self._forward("on_step_end", args, state, control, **kwargs)

        def on_log(self, args, state, control, **kwargs):
            if not self.active:
                return control
            return self._forward("on_log", args, state, control, **kwargs)

    return StepTimer(), EveryOtherStep()


def _dataset(settings: dict, tokenizer):
    from worker.trainer.dataset_loading import load_datasets
    from worker.trainer.prompt_templates import select_renderer
    from worker.trainer.sample_encoding import EncodedDataset, encode_sft

    data = load_datasets(settings["dataset"], settings["dataset_dir"], "sft", settings["max_samples"])
    renderer = select_renderer(None, tokenizer)
    return EncodedDataset(encode_sft(data, renderer, tokenizer, settings["cutoff_len"], False))


def measure(model_dir: Path, steps: int, warmup: int, work_dir: Path):
    import torch
    from transformers import TrainingArguments, set_seed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from shared.train_spec import defaults
    from worker.trainer.adc_callback import ADCCallback
    from worker.trainer.adc_trainer import ADCTrainer
    from worker.trainer.events import EventWriter
    from worker.trainer.model_setup import Precision, load_model, load_tokenizer
    from worker.trainer.sample_encoding import PaddingCollator
    from worker.trainer.stop_request import StopRequest

    settings = {
        **defaults(), "model_name_or_path": str(model_dir), "dataset": ["alpaca_en_demo"],
        "dataset_dir": str(REPO / "examples" / "data"), "max_samples": 64, "cutoff_len": 128,
        "lora_rank": 8, "gradient_checkpointing": False,
    }
    set_seed(0)
    tokenizer = load_tokenizer(settings)
    dataset = _dataset(settings, tokenizer)
    model = load_model(settings, Precision(bf16=False, fp16=False), torch.device("cpu"))
    arguments = TrainingArguments(
        output_dir=str(work_dir / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_steps=warmup + steps, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, optim="adamw_torch", dataloader_pin_memory=False,
        remove_unused_columns=False, seed=0,
    )
    collator = PaddingCollator(tokenizer.pad_token_id)
    events = EventWriter(work_dir / "events.jsonl")
    adc_callback = ADCCallback(events, StopRequest(work_dir / "STOP-never-created"), collator, 1,
                               torch.device("cpu"), None)
    timer, every_other = _instruments(adc_callback)
    trainer = ADCTrainer(
        model=model, args=arguments, train_dataset=dataset, data_collator=collator, processing_class=tokenizer,
        callbacks=[timer, every_other], events=events, manifest={},
    )
    # The stock printers write every log line to stdout; keep the table readable.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()

    with_adc: list[float] = []
    without: list[float] = []
    for (step, begin), (_, end) in zip(timer.marks, timer.marks[1:]):
        if step <= warmup:
            continue
        # The callback's work for `step` runs right after the timer's mark, so it lands in this interval.
        (with_adc if step % 2 == 1 else without).append(end - begin)
    steps_with = max(every_other.active_steps, 1)
    per_step = {name: seconds / steps_with for name, seconds in every_other.seconds_in.items()}
    return without, with_adc, per_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="13m", choices=("tiny", "13m"))
    parser.add_argument("--steps", type=int, default=40, help="timed steps (half with, half without the callback)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start")
    parser.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "adc-bench-models"))
    args = parser.parse_args(argv)

    from worker.trainer.tiny_model import SIZES, build_tiny_llama

    model_dir = build_tiny_llama(Path(args.model_cache) / f"llama-{args.size}", SIZES[args.size])
    with tempfile.TemporaryDirectory() as work:
        without, with_adc, inside = measure(model_dir, args.steps, args.warmup, Path(work))
    per_step_inside = sum(inside.values())

    def row(name: str, values: list[float]) -> str:
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        return (f"{name:<26}{statistics.median(values) * 1e3:>12.2f}{statistics.fmean(values) * 1e3:>12.2f}"
                f"{p90 * 1e3:>12.2f}{len(values):>8}")

    median_step = statistics.median(without)
    print(f"\nLoRA SFT, tiny Llama '{args.size}', batch 2 x cutoff 128, CPU, {os.cpu_count()} cores, "
          "progress event every step")
    print(f"{'':<26}{'median ms':>12}{'mean ms':>12}{'p90 ms':>12}{'steps':>8}")
    print(row("without ADC callback", without))
    print(row("with ADC callback", with_adc))
    print(f"step-time difference (medians): {(statistics.median(with_adc) / median_step - 1) * 100:+.2f}%  "
          "(noisy on a shared machine)")
    print(f"time inside the ADC callback: {per_step_inside * 1e6:.0f} us per step = "
          f"{per_step_inside / median_step * 100:.3f}% of a step   (target <= 1%)")
    print(f"  of which stop check (every step): {inside['on_step_end'] * 1e6:.0f} us, "
          f"progress event (every logging step, here every step): {inside['on_log'] * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
