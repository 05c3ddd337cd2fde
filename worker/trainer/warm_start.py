"""A warm trainer: built up to loading the checkpoint, then waiting for the worker's go.

For a move, the worker launches the target's trainer before the source has stopped, with
ADC_GO_FILE naming a file in the worker's own attempt folder (the trainer can read it, never
create or replace it). The trainer imports everything, loads the tokenized dataset and builds the
model from the base weights as any run does, then, where transformers' `Trainer.train` would
load the checkpoint, says `prepared` and waits. Once the source has checkpoint-stopped, the worker
raises the job's fence to this attempt and writes the go file: `{"resume_from": <checkpoint or
null>}`. The trainer resumes from exactly that checkpoint; seeds, model, optimizer, scheduler and
data order are restored from it as in a cold resume, so the weights are the same.

What the go file names is checked again here against the run's batch plan (a checkpoint whose
manifest asks for another global batch or step count than the one this trainer was built for
ends the attempt with an error: the executor falls back to a cold start).

Nothing in site-packages is changed; the wrap lives only in the trainer's process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

GO_FILE_ENV = "ADC_GO_FILE"
POLL_S = 0.02  # how often the go file is looked for: a go costs at most this much
MAX_GO_BYTES = 64 << 10


class GoError(RuntimeError):
    """The go file is not what the worker writes."""


def go_file_from_environment() -> Path | None:
    value = os.environ.get(GO_FILE_ENV)
    return Path(value) if value else None


def wait_for_go(go_file: Path, poll_s: float = POLL_S) -> str | None:
    """Block until the go file exists; the checkpoint it names (None: from the start)."""
    while True:
        try:
            with open(go_file, "rb") as f:
                raw = f.read(MAX_GO_BYTES + 1)
            break
        except FileNotFoundError:
            time.sleep(poll_s)
    if len(raw) > MAX_GO_BYTES:
        raise GoError(f"{go_file} is larger than {MAX_GO_BYTES} bytes")
    try:
        go = json.loads(raw)
    except ValueError as exc:
        raise GoError(f"{go_file} is not JSON: {exc}") from None
    if not isinstance(go, dict):
        raise GoError(f"{go_file} is not a JSON object")
    resume = go.get("resume_from")
    if resume is not None and not isinstance(resume, str):
        raise GoError(f"{go_file}: resume_from must be a checkpoint path or null")
    return resume


def install_before_train(before: Callable[[object, str | None], str | None]) -> None:
    """Run `before(trainer, resume_from_checkpoint)` where the run's `Trainer.train` begins, once; it
    returns the checkpoint to resume from (LLaMA-Factory calls train once per run)."""
    from transformers import Trainer

    original = Trainer.train
    state = {"done": False}

    def train(trainer, resume_from_checkpoint=None, *args, **kwargs):
        if not state["done"]:
            state["done"] = True
            resume_from_checkpoint = before(trainer, resume_from_checkpoint)
        return original(trainer, resume_from_checkpoint, *args, **kwargs)

    Trainer.train = train
