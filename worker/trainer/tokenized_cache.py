"""Tokenized datasets kept in the job's cache, so a restart (a move, a resize, a requeue) never
tokenizes again: LLaMA-Factory's own `tokenized_path` (it saves the tokenized dataset there, and
loads it from there when the folder is not empty).

The worker names the cache folder (ADC_TOKENIZED_CACHE, inside the job's `cache/`, which only this
job's trainers write): a job's trainers read only what a trainer of the same job wrote. Each entry
is named by a hash of everything that changes the tokens: every train key except those that
change only how training runs (TRAINING_ONLY), the LLaMA-Factory version, and the name, size and
modification time of the dataset files the job uses and of the model folder's files other than
weights (the tokenizer). A change to any of them is a new entry. LLaMA-Factory writes the entry
into a staging folder of this process (rank 0's: only it saves); it is renamed into place once the dataset is built, so a
trainer killed while saving leaves no half entry to load. A job that names its own
`tokenized_path`, or streams its data, is left as it is. No torch here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import uuid
from pathlib import Path

CACHE_ENV = "ADC_TOKENIZED_CACHE"
# Keys that change how the model trains or is saved, never which tokens the dataset holds.
TRAINING_ONLY = frozenset(
    {
        "output_dir", "overwrite_output_dir", "resume_from_checkpoint", "max_steps", "num_train_epochs",
        "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
        "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "optim",
        "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
        "adc_global_batch_size", "logging_steps", "save_steps", "save_strategy", "save_total_limit",
        "save_only_model", "eval_steps", "eval_strategy", "plot_loss", "report_to", "run_name",
        "logging_dir", "disable_tqdm", "include_num_input_tokens_seen", "use_cpu", "ddp_backend",
        "ddp_timeout", "bf16", "fp16", "pure_bf16", "deepspeed", "flash_attn", "gradient_checkpointing",
        "disable_gradient_checkpointing", "dataloader_num_workers", "preprocessing_num_workers",
        "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "quantization_bit",
        "tokenized_path",
    }
)  # fmt: skip
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
MAX_FILES = 10_000  # a dataset folder larger than this is fingerprinted no further: no cache


def _files(path: Path) -> list[Path] | None:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return None
    found = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        found += [Path(root) / n for n in sorted(names)]
        if len(found) > MAX_FILES:
            return None
    return found


def _fingerprint(paths: list[Path]) -> list[list]:
    out = []
    for p in paths:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _dataset_files(args: dict) -> list[Path] | None:
    """dataset_info.json and the files of the datasets the job names; None if they cannot be told."""
    folder = Path(str(args.get("dataset_dir") or "data"))
    info_path = folder / "dataset_info.json"
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        return None
    files = [info_path]
    for key in ("dataset", "eval_dataset"):
        names = args.get(key) or []
        for name in [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names):
            entry = info.get(name) if isinstance(info, dict) else None
            if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
                return None  # a hub or script dataset: nothing local to fingerprint
            found = _files(folder / entry["file_name"])
            if found is None:
                return None
            files += found
    return files


def _llamafactory_version() -> str:
    try:
        return importlib.metadata.version("llamafactory")
    except importlib.metadata.PackageNotFoundError:  # outside the trainer's environment
        return "none"


def cache_key(args: dict) -> str | None:
    """The entry's name for these arguments, or None when the dataset's files cannot be fingerprinted."""
    data = _dataset_files(args)
    model = Path(str(args.get("model_name_or_path") or ""))
    if data is None or not model.is_dir():
        return None
    tokenizer = [p for p in sorted(model.iterdir()) if p.is_file() and not p.name.endswith(_WEIGHTS)]
    keyed = {
        "args": {k: v for k, v in sorted(args.items()) if k not in TRAINING_ONLY},
        "llamafactory": _llamafactory_version(),
        "data": _fingerprint(data),
        "tokenizer": _fingerprint(tokenizer),
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:32]


class TokenizedCache:
    """This run's entry: where LLaMA-Factory loads it from, or saves it to and it is then published."""

    def __init__(self, final: Path, staging: Path | None) -> None:
        self.final = final
        self.staging = staging

    @classmethod
    def for_run(cls, args: dict) -> TokenizedCache | None:
        root = os.environ.get(CACHE_ENV)
        if not root or args.get("tokenized_path") or args.get("streaming"):
            return None
        key = cache_key(args)
        if key is None:
            return None
        final = Path(root) / key
        if final.is_dir() and any(final.iterdir()):
            return cls(final, None)
        # A name of this process's own: pids repeat across sandboxes (each has its own pid namespace).
        return cls(final, Path(root) / f".staging-{uuid.uuid4().hex}" / key)

    @property
    def tokenized_path(self) -> str:
        return str(self.staging or self.final)

    def publish(self) -> None:
        """The staged entry into place (rank 0 saved it; others have nothing staged)."""
        if self.staging is None or not self.staging.is_dir():
            return
        try:
            os.rename(self.staging, self.final)  # another trainer of the job may have been first
        except OSError:
            pass
        shutil.rmtree(self.staging.parent, ignore_errors=True)
