"""The TrainerCallback ADC adds to LLaMA-Factory's `run_exp`: events and the checkpoint-then-stop.

- on_train_begin: the `started` event (max_steps, world size, step resumed at, batch geometry).
- on_step_end (every optimizer step, all ranks): ask `StopRequest` whether any rank saw a stop
  request; if so, and this is not the last step anyway, ask the trainer to save now and stop.
  The save is the trainer's own checkpoint path, made atomic by `CheckpointPublisher`.
- on_train_end: after a stop, raise `StoppedAfterCheckpoint` so that LLaMA-Factory's end-of-run
  work (final model, metrics, plots) is skipped: the job is not finished, only paused.
- on_log (every logging_steps, all ranks): a `progress` event with loss, learning rate,
  tokens/s, samples/s, mean step time and peak memory over the logging window, and with
  several ranks each rank's all-reduce latency.
- on_evaluate / on_predict: an `evaluated` event with LLaMA-Factory's metrics (`split` eval or
  predict: do_eval with eval_strategy/val_size/eval_dataset, and do_predict).

Cost per step: one stat() of the stop file, plus one tiny all-reduce when there are several
ranks; the token count for tokens/s is added up only at log, evaluation and save points
(token_count.py). bench/trainer_vs_llamafactory.py measures it against plain `llamafactory-cli train`.
"""

from __future__ import annotations

import math
import resource
import time

import torch
from transformers import TrainerCallback

from worker.trainer.events import EventWriter
from worker.trainer.stop_request import StopRequest
from worker.trainer.token_count import TokenCount


class StoppedAfterCheckpoint(Exception):
    """Raised out of `trainer.train()` after the stop checkpoint is published."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped after the checkpoint of step {step}")
        self.step = step


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class ADCCallback(TrainerCallback):
    def __init__(
        self,
        events: EventWriter,
        stop_request: StopRequest,
        world_size: int,
        run_facts: dict,
        tokens: TokenCount | None = None,
    ) -> None:
        self.events = events
        self.tokens = tokens
        self.stop_request = stop_request
        self.world_size = world_size
        self.run_facts = run_facts
        self.global_batch = int(run_facts["global_batch_size"])
        self.device = torch.device("cpu")
        self.started = False
        self.stop_step: int | None = None
        self.final_step: int | None = None
        self.last_loss: float | None = None
        self._window_start = time.perf_counter()
        self._window_step = 0
        self._window_tokens = 0

    def _open_window(self, state) -> None:
        self._window_start = time.perf_counter()
        self._window_step = state.global_step
        self._window_tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self.device = args.device
        self.started = True
        self._open_window(state)
        facts = dict(self.run_facts)
        if train_dataloader is not None and hasattr(train_dataloader, "dataset"):
            try:
                facts["samples"] = len(train_dataloader.dataset)
            except TypeError:  # a streaming dataset has no length
                pass
        if model is not None:
            facts["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.events.emit(
            "started",
            max_steps=state.max_steps,
            world_size=self.world_size,
            resumed_from=args.resume_from_checkpoint,
            step=state.global_step,
            **facts,
        )
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_step is None and self.stop_request.agreed(self.world_size, self.device):
            # At the last step the run ends anyway (and saves): report success, not a stop.
            if state.global_step < state.max_steps:
                self.stop_step = state.global_step
                control.should_save = True
                control.should_training_stop = True
        if control.should_log or control.should_save or control.should_evaluate or control.should_training_stop:
            self._flush_tokens(args, state)  # what the trainer logs, evaluates or saves next reads the count
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        self._flush_tokens(args, state)  # the epoch's last log, save or evaluation follows
        return control

    def _flush_tokens(self, args, state) -> None:
        if self.tokens is not None and args.include_num_input_tokens_seen != "no":
            self.tokens.flush(state, self.device, self.world_size)

    def on_train_end(self, args, state, control, **kwargs):
        self._flush_tokens(args, state)
        self.final_step = state.global_step
        if self.stop_step is not None:
            raise StoppedAfterCheckpoint(self.stop_step)
        return control

    def _window_counts(self, state) -> tuple[int, int]:
        # Trainer gathers the token count over ranks itself (include_num_input_tokens_seen).
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0) - self._window_tokens
        peak = peak_memory_bytes(self.device)
        if self.world_size > 1:
            import torch.distributed as dist

            peak_tensor = torch.tensor([peak], dtype=torch.int64, device=self.device)
            dist.all_reduce(peak_tensor, op=dist.ReduceOp.MAX)
            peak = int(peak_tensor.item())
        return tokens, peak

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
        if self.device.type == "cuda":  # NCCL collectives are asynchronous: time the
            torch.cuda.synchronize(self.device)  # collective itself, not its launch
        started = time.perf_counter()
        for _ in range(rounds):
            dist.all_reduce(probe)
        if self.device.type == "cuda":  # the same for the timed rounds
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
        tokens, peak = self._window_counts(state)
        comm = self._comm_latency_us()
        self.last_loss = _number(logs["loss"])
        self.events.emit(
            "progress",
            step=state.global_step,
            max_steps=state.max_steps,
            epoch=round(float(state.epoch or 0.0), 6),
            loss=self.last_loss,
            learning_rate=_number(logs.get("learning_rate")) or 0.0,
            grad_norm=_number(logs.get("grad_norm")),
            tokens_per_s=tokens / elapsed if tokens > 0 else None,
            samples_per_s=steps * self.global_batch / elapsed,
            step_time_s=elapsed / steps,
            peak_memory_bytes=peak,
            **({"comm_latency_us": comm} if comm is not None else {}),
        )
        self._open_window(state)
        return control

    def _evaluated(self, split: str, state, metrics) -> None:
        if metrics:
            self.events.emit(
                "evaluated",
                split=split,
                step=state.global_step,
                metrics={k: _number(v) for k, v in metrics.items() if _number(v) is not None},
            )

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._evaluated("eval", state, metrics)
        return control

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._evaluated("predict", state, metrics)
        return control
