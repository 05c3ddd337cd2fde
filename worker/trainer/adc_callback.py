"""The ADC TrainerCallback: progress events, and the checkpoint-then-stop request.

- on_train_begin: the `started` event (max_steps, world size, step resumed at).
- on_step_end (every optimizer step, all ranks): ask `StopRequest` whether any rank saw a stop
  request; if so, and this is not the last step anyway, ask the trainer to save now and stop.
  The save is the trainer's own checkpoint path, made atomic by `ADCTrainer`.
- on_log (every logging_steps, all ranks): a `progress` event with loss, learning rate,
  tokens/s, samples/s, mean step time and peak memory over the logging window.

Cost per step: one stat() of the stop file, plus one tiny all-reduce when there are several
ranks; bench/trainer_overhead.py measures it.
"""

from __future__ import annotations

import resource
import time

import torch
from transformers import TrainerCallback

from worker.trainer.events import EventWriter
from worker.trainer.sample_encoding import PaddingCollator
from worker.trainer.stop_request import StopRequest


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class ADCCallback(TrainerCallback):
    def __init__(
        self,
        events: EventWriter,
        stop_request: StopRequest,
        collator: PaddingCollator,
        world_size: int,
        device: torch.device,
        resumed_from: str | None,
        run_facts: dict | None = None,
    ) -> None:
        self.events = events
        self.stop_request = stop_request
        self.collator = collator
        self.world_size = world_size
        self.device = device
        self.resumed_from = resumed_from
        self.run_facts = run_facts or {}
        self.stop_step: int | None = None
        self.last_loss: float | None = None
        self._window_start = time.perf_counter()
        self._window_step = 0
        self._window_tokens = 0
        self._window_samples = 0

    def _open_window(self, step: int) -> None:
        self._window_start = time.perf_counter()
        self._window_step = step
        self._window_tokens = self.collator.tokens_seen
        self._window_samples = self.collator.samples_seen

    def on_train_begin(self, args, state, control, **kwargs):
        self._open_window(state.global_step)
        self.events.emit(
            "started",
            max_steps=state.max_steps,
            world_size=self.world_size,
            resumed_from=self.resumed_from,
            step=state.global_step,
            **self.run_facts,
        )
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_step is None and self.stop_request.agreed(self.world_size, self.device):
            # At the last step the run ends anyway (and saves): report success, not a stop.
            if state.global_step < state.max_steps:
                self.stop_step = state.global_step
                control.should_save = True
                control.should_training_stop = True
        return control

    def _window_counts(self) -> tuple[float, float, int]:
        tokens = self.collator.tokens_seen - self._window_tokens
        samples = self.collator.samples_seen - self._window_samples
        peak = peak_memory_bytes(self.device)
        if self.world_size > 1:
            import torch.distributed as dist

            totals = torch.tensor([tokens, samples], dtype=torch.float64, device=self.device)
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
            tokens, samples = totals.tolist()
            peak_tensor = torch.tensor([peak], dtype=torch.int64, device=self.device)
            dist.all_reduce(peak_tensor, op=dist.ReduceOp.MAX)
            peak = int(peak_tensor.item())
        return tokens, samples, peak

    def _comm_latency_us(self, rounds: int = 3) -> list[float] | None:
        """Each rank's round-trip time of a tiny all-reduce, in microseconds, once per log.

        The first all-reduce lines the ranks up, so the timed ones measure communication,
        not a slow rank's compute.
        """
        if self.world_size <= 1:
            return None
        import torch.distributed as dist

        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        dist.all_reduce(probe)
        if self.device.type == "cuda":  # obs (issue 14): NCCL collectives are asynchronous: time the
            torch.cuda.synchronize(self.device)  # collective itself, not its launch
        started = time.perf_counter()
        for _ in range(rounds):
            dist.all_reduce(probe)
        if self.device.type == "cuda":  # obs (issue 14)
            torch.cuda.synchronize(self.device)
        mean_us = (time.perf_counter() - started) * 1e6 / rounds
        per_rank = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
        per_rank[dist.get_rank()] = mean_us
        dist.all_reduce(per_rank, op=dist.ReduceOp.SUM)
        return [round(v, 1) for v in per_rank.tolist()]

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The trainer also logs end-of-run metrics (train_loss, runtime); only step logs are progress.
        if not logs or "loss" not in logs:
            return control
        steps = max(state.global_step - self._window_step, 1)
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        tokens, samples, peak = self._window_counts()
        comm = self._comm_latency_us()
        self.last_loss = float(logs["loss"])
        self.events.emit(
            "progress",
            step=state.global_step,
            max_steps=state.max_steps,
            epoch=round(float(state.epoch or 0.0), 6),
            loss=self.last_loss,
            learning_rate=float(logs.get("learning_rate", 0.0)),
            grad_norm=float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
            tokens_per_s=tokens / elapsed,
            samples_per_s=samples / elapsed,
            step_time_s=elapsed / steps,
            peak_memory_bytes=peak,
            **({"comm_latency_us": comm} if comm is not None else {}),
        )
        self._open_window(state.global_step)
        return control
