"""transformers' token count (`include_num_input_tokens_seen`) without a collective and a host sync per micro-batch.

ADC's `progress` events report tokens/s, so the trainer turns the count on (`non_padding`) when the
config does not. transformers 5.6.0 counts in `Trainer._track_num_input_tokens`, once per
micro-batch: it gathers the batch's count from every rank and reads it back to the host
(`.item()`), which is an all-gather per micro-batch with several ranks and a device sync per
micro-batch on a GPU. LLaMA-Factory's own runs (its examples leave the count off) pay neither.

Here the per-batch count stays on the device and is summed locally; the sum of all ranks is
added to `state.num_input_tokens_seen` (one all-reduce, one read-back) only when something reads
that number: before a log, an evaluation or a save, at the end of an epoch and of training
(`TokenCount.flush`, called by ADC's callback at those points, which every rank reaches at the same
step). What transformers logs and saves in `trainer_state.json` is the same number as with its own
count; only when it is added up differs.

The count itself is transformers 5.6.0's rule (attention mask, else tokens unlike the pad token,
else every token; `all`: every token).
"""

from __future__ import annotations

import torch


class TokenCount:
    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None  # this rank's tokens since the last flush, on the device

    def install(self) -> None:
        """Replace transformers' per-micro-batch count by the deferred one (this process only)."""
        from transformers import Trainer

        counter = self

        def _track_num_input_tokens(trainer, inputs):
            counter.add(trainer, inputs)

        Trainer._track_num_input_tokens = _track_num_input_tokens

    def add(self, trainer, inputs) -> None:
        mode = trainer.args.include_num_input_tokens_seen
        if mode == "no":
            return
        main_input_name = getattr(trainer.model, "main_input_name", "input_ids")
        if main_input_name not in inputs:
            return  # transformers warns and counts nothing
        pad_token_id = getattr(trainer.processing_class, "pad_token_id", None)
        if mode == "non_padding" and "attention_mask" in inputs:
            tokens = inputs["attention_mask"].sum()
        elif mode == "non_padding" and pad_token_id is not None:
            tokens = (inputs[main_input_name] != pad_token_id).sum()
        else:
            tokens = torch.as_tensor(inputs[main_input_name].numel())
        tokens = tokens.to(device=trainer.args.device, dtype=torch.int64)
        self.pending = tokens if self.pending is None else self.pending + tokens

    def flush(self, state, device, world_size: int) -> None:
        """Add every rank's pending count to `state.num_input_tokens_seen`. Collective with several
        ranks: every rank calls it at the same point (even a rank that counted nothing)."""
        pending, self.pending = self.pending, None
        if world_size > 1:
            import torch.distributed as dist

            if pending is None:
                pending = torch.zeros((), dtype=torch.int64, device=device)
            dist.all_reduce(pending, op=dist.ReduceOp.SUM)
        if pending is not None:
            state.num_input_tokens_seen += int(pending.item())
