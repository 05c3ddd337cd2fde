"""Validation of a job's `train` section: LLaMA-Factory's keys, checked before the job is queued.

The API calls `validate_train_spec` and answers 422 with `TrainSpecError.errors`; the trainer
calls it again on the train.yaml it is given, so both agree on what a key means. Every
problem is reported at once, each naming its key. A key ADC does not know is refused, never
ignored. Keys that LLaMA-Factory users write but that change nothing in ADC's trainer (plots,
loader worker counts, ...) are accepted and listed in `NO_EFFECT_KEYS` with the reason.

Pure Python: the API imports this, so no torch or transformers here.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Names the trainer's prompt templates are registered under (worker/trainer/prompt_templates.py
# registers exactly these; a test keeps the two lists equal).
SUPPORTED_TEMPLATES = ("alpaca", "default", "empty", "llama3", "qwen", "qwen3", "qwen3_nothink")
SUPPORTED_STAGES = ("pt", "sft")
UNSUPPORTED_STAGES = ("dpo", "kto", "ppo", "rm")
SCHEDULERS = (
    "constant", "constant_with_warmup", "cosine", "cosine_with_restarts", "inverse_sqrt", "linear", "polynomial",
)
OPTIMIZERS = ("adafactor", "adamw_torch", "adamw_torch_fused", "sgd")
DATASET_FORMATS = ("alpaca", "sharegpt")
DATASET_FILE_TYPES = (".json", ".jsonl")


@dataclass(frozen=True)
class Key:
    kind: str  # bool | int | float | str | path | names | choice
    default: Any = None
    choices: tuple = ()
    minimum: float | None = None
    nullable: bool = False
    required: bool = False


KEYS: dict[str, Key] = {
    # model
    "model_name_or_path": Key("path", required=True),
    "trust_remote_code": Key("bool", False),
    "quantization_bit": Key("choice", None, choices=(4, 8), nullable=True),
    "quantization_method": Key("choice", "bnb", choices=("bnb",)),
    "quantization_type": Key("choice", "nf4", choices=("fp4", "nf4")),
    "double_quantization": Key("bool", True),
    "flash_attn": Key("choice", "auto", choices=("auto", "disabled", "fa2", "sdpa")),
    # method
    "stage": Key("choice", "sft", choices=SUPPORTED_STAGES),
    "do_train": Key("bool", True),
    "finetuning_type": Key("choice", "lora", choices=("freeze", "full", "lora")),
    "lora_rank": Key("int", 8, minimum=1),
    "lora_alpha": Key("int", None, minimum=1, nullable=True),
    "lora_dropout": Key("float", 0.0, minimum=0.0),
    "lora_target": Key("names", ["all"]),
    "additional_target": Key("names", None, nullable=True),
    "use_rslora": Key("bool", False),
    "use_dora": Key("bool", False),
    "freeze_trainable_layers": Key("int", 2),
    "freeze_trainable_modules": Key("names", ["all"]),
    "freeze_extra_modules": Key("names", None, nullable=True),
    "deepspeed": Key("path", None, nullable=True),
    "gradient_checkpointing": Key("bool", None, nullable=True),
    "disable_gradient_checkpointing": Key("bool", False),
    # dataset
    "dataset": Key("names", required=True),
    "dataset_dir": Key("path", "data"),
    "template": Key("choice", None, choices=SUPPORTED_TEMPLATES, nullable=True),
    "cutoff_len": Key("int", 2048, minimum=1),
    "max_samples": Key("int", None, minimum=1, nullable=True),
    "train_on_prompt": Key("bool", False),
    # output
    "output_dir": Key("path", "saves"),
    "logging_steps": Key("int", 10, minimum=1),
    "save_steps": Key("int", 500, minimum=1),
    "save_total_limit": Key("int", None, minimum=1, nullable=True),
    "save_only_model": Key("bool", False),
    "report_to": Key("names", ["none"], nullable=True),
    # train
    "per_device_train_batch_size": Key("int", 8, minimum=1),
    "gradient_accumulation_steps": Key("int", 1, minimum=1),
    "adc_global_batch_size": Key("int", None, minimum=1, nullable=True),
    "learning_rate": Key("float", 5e-5, minimum=0.0),
    "num_train_epochs": Key("float", 3.0, minimum=0.0),
    "max_steps": Key("int", -1, minimum=-1),
    "lr_scheduler_type": Key("choice", "linear", choices=SCHEDULERS),
    "warmup_ratio": Key("float", 0.0, minimum=0.0),
    "warmup_steps": Key("int", 0, minimum=0),
    "weight_decay": Key("float", 0.0, minimum=0.0),
    "max_grad_norm": Key("float", 1.0, minimum=0.0),
    "adam_beta1": Key("float", 0.9, minimum=0.0),
    "adam_beta2": Key("float", 0.999, minimum=0.0),
    "adam_epsilon": Key("float", 1e-8, minimum=0.0),
    "optim": Key("choice", "adamw_torch", choices=OPTIMIZERS),
    "bf16": Key("bool", False),
    "fp16": Key("bool", False),
    "ddp_timeout": Key("int", 1800, minimum=1),
    "resume_from_checkpoint": Key("path", None, nullable=True),
    "seed": Key("int", 42, minimum=0),
    # accepted, no effect in ADC (see NO_EFFECT_KEYS)
    "plot_loss": Key("bool", False),
    "overwrite_output_dir": Key("bool", False),
    "overwrite_cache": Key("bool", False),
    "preprocessing_num_workers": Key("int", None, minimum=1, nullable=True),
    "dataloader_num_workers": Key("int", 0, minimum=0),
}

NO_EFFECT_KEYS = {
    "plot_loss": "ADC plots from its progress events",
    "overwrite_output_dir": "the worker gives every job its own output folder",
    "overwrite_cache": "data is tokenized in memory at start, there is no cache",
    "preprocessing_num_workers": "data is tokenized in memory at start",
    "dataloader_num_workers": "batches are built from tokenized data in memory",
    "trust_remote_code": "passed to transformers; models are local folders",
    "quantization_method": "bnb is the only method",
    "report_to": "ADC reports through its own events",
    "do_train": "the trainer only trains",
    "save_only_model": "checkpoints always hold optimizer and RNG state so a stop can resume exactly",
}

EVAL_KEYS = (
    "compute_accuracy", "do_eval", "do_predict", "eval_dataset", "eval_steps", "eval_strategy",
    "per_device_eval_batch_size", "predict_with_generate", "val_size",
)
PREFERENCE_KEYS = ("dpo_label_smoothing", "pref_beta", "pref_ftx", "pref_loss", "simpo_gamma", "kto_chosen_weight")
REMOTE_DATASET_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


class TrainSpecError(ValueError):
    """All problems of a train section; `errors` is a list of {"loc": [...], "msg": str}."""

    def __init__(self, errors: list[dict]) -> None:
        self.errors = errors
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        super().__init__(f"invalid train section: {lines}")


def defaults() -> dict[str, Any]:
    """Every known key with ADC's default (LLaMA-Factory's where it has one)."""
    return {name: (list(k.default) if isinstance(k.default, list) else k.default) for name, k in KEYS.items()}


class _Checker:
    def __init__(self, base_dir: Path | None) -> None:
        self.base_dir = base_dir
        self.errors: list[dict] = []

    def fail(self, msg: str, *loc: Any) -> None:
        self.errors.append({"loc": ["train", *loc], "msg": msg})

    def resolve(self, value: str) -> Path:
        path = Path(value).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path

    def coerce(self, name: str, key: Key, value: Any) -> tuple[bool, Any]:
        """(ok, normalized value) for one key."""
        if value is None:
            if key.nullable:
                return True, None
            self.fail(f"must not be empty (null); default is {key.default!r}", name)
            return False, None
        kind = key.kind
        if kind == "bool":
            if isinstance(value, bool):
                return True, value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return True, value.lower() == "true"
            return self._type_error(name, "true or false", value)
        if kind == "int" or (kind == "choice" and key.choices and isinstance(key.choices[0], int)):
            number = _as_int(value)
            if number is None:
                return self._type_error(name, "an integer", value)
            value = number
        elif kind == "float":
            number = _as_float(value)
            if number is None:
                return self._type_error(name, "a number", value)
            value = number
        elif kind in ("str", "path") or (kind == "choice"):
            if not isinstance(value, str) or not value.strip():
                return self._type_error(name, "a non-empty string", value)
            value = value.strip()
        elif kind == "names":
            names = _as_names(value)
            if names is None:
                return self._type_error(name, "a comma-separated string or a list of strings", value)
            value = names
        if key.minimum is not None and value < key.minimum:
            self.fail(f"must be at least {key.minimum:g}, got {value!r}", name)
            return False, None
        if kind == "choice" and value not in key.choices:
            return self._choice_error(name, value, key.choices)
        return True, value

    def _type_error(self, name: str, expected: str, value: Any) -> tuple[bool, None]:
        self.fail(f"expected {expected}, got {type(value).__name__} {value!r}", name)
        return False, None

    def _choice_error(self, name: str, value: Any, choices: tuple) -> tuple[bool, None]:
        listed = ", ".join(str(c) for c in choices)
        if name == "stage" and value in UNSUPPORTED_STAGES:
            self.fail(f"stage {value!r} is not supported by ADC's trainer; supported: {listed}", name)
        else:
            self.fail(f"unsupported value {value!r}; supported: {listed}", name)
        return False, None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if number.is_integer() else None
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        # PyYAML reads "1e-4" (no dot) as a string; LLaMA-Factory's argument parser accepts it.
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _as_names(value: Any) -> list[str] | None:
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",") if part.strip()]
        return names or None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value):
        return [v.strip() for v in value]
    return None


def _unknown_key_message(name: str) -> str:
    if name in EVAL_KEYS:
        return f"evaluation is not supported by ADC's trainer; remove {name!r}"
    if name in PREFERENCE_KEYS:
        return f"{name!r} belongs to preference training (stage dpo/kto), which ADC's trainer does not support"
    close = difflib.get_close_matches(name, KEYS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {name!r}: not a LLaMA-Factory key ADC's trainer supports{hint}"


def validate_train_spec(train: dict, base_dir: str | Path | None = None) -> dict:
    """Check a train section and return it normalized (types coerced, dataset names as a list,
    relative paths resolved against base_dir). Raises TrainSpecError listing every problem."""
    base = Path(base_dir).expanduser().resolve() if base_dir is not None else None
    checker = _Checker(base)
    if not isinstance(train, dict):
        raise TrainSpecError([{"loc": ["train"], "msg": f"expected a mapping of keys, got {type(train).__name__}"}])

    normalized: dict[str, Any] = {}
    for name, value in train.items():
        if not isinstance(name, str):
            checker.fail(f"keys must be strings, got {name!r}", str(name))
            continue
        key = KEYS.get(name)
        if key is None:
            checker.fail(_unknown_key_message(name), name)
            continue
        ok, coerced = checker.coerce(name, key, value)
        if ok:
            normalized[name] = coerced
    for name, key in KEYS.items():
        if key.required and name not in train:
            checker.fail("is required", name)

    _check_values(normalized, checker)
    _check_paths(normalized, checker)
    if checker.errors:
        raise TrainSpecError(checker.errors)
    return normalized


def _check_values(spec: dict, checker: _Checker) -> None:
    settings = {**defaults(), **spec}
    if spec.get("do_train") is False:
        checker.fail("do_train: false leaves nothing to run; ADC's trainer only trains", "do_train")
    if spec.get("save_only_model") is True:
        checker.fail(
            "save_only_model: true would drop optimizer and RNG state from checkpoints, so a stopped job "
            "could not resume exactly; remove it or set it to false", "save_only_model",
        )
    report_to = spec.get("report_to")
    if report_to and [r for r in report_to if r != "none"]:
        checker.fail("ADC reports through its own events; supported: none", "report_to")
    if settings["bf16"] and settings["fp16"]:
        checker.fail("bf16 and fp16 are both true; choose one", "fp16")
    if settings["quantization_bit"] is not None:
        if settings["finetuning_type"] != "lora":
            checker.fail(
                f"quantization_bit needs finetuning_type: lora (QLoRA), got {settings['finetuning_type']!r}",
                "quantization_bit",
            )
        if settings["deepspeed"]:
            checker.fail("quantization_bit cannot be combined with deepspeed in ADC's trainer", "quantization_bit")
    if settings["max_steps"] == 0 or (settings["max_steps"] < 0 and settings["num_train_epochs"] <= 0):
        checker.fail("set max_steps > 0 or num_train_epochs > 0", "max_steps")
    if settings["lora_dropout"] >= 1.0:
        checker.fail(f"must be below 1, got {settings['lora_dropout']!r}", "lora_dropout")
    if settings["warmup_ratio"] >= 1.0:
        checker.fail(f"must be below 1, got {settings['warmup_ratio']!r}", "warmup_ratio")
    if settings["freeze_trainable_layers"] == 0:
        checker.fail("must not be 0 (positive: last n layers, negative: first n)", "freeze_trainable_layers")
    if settings["adc_global_batch_size"] is not None and settings["adc_global_batch_size"] % settings[
        "per_device_train_batch_size"
    ]:
        checker.fail(
            "must be a multiple of per_device_train_batch_size "
            f"({settings['per_device_train_batch_size']})", "adc_global_batch_size",
        )
    for name in ("lora_target", "additional_target", "freeze_trainable_modules", "freeze_extra_modules"):
        for module in spec.get(name) or []:
            if not module.replace(".", "_").replace("-", "_").isidentifier():
                checker.fail(f"{module!r} is not a module name", name)


def _check_paths(spec: dict, checker: _Checker) -> None:
    if "model_name_or_path" in spec:
        raw = spec["model_name_or_path"]
        path = checker.resolve(raw)
        if not path.is_dir():
            hub_like = not raw.startswith(("/", ".", "~")) and raw.count("/") == 1
            why = " (a hub id? models cannot be downloaded on this cluster)" if hub_like else ""
            checker.fail(f"{raw!r} is not a local folder{why}; give a folder with config.json", "model_name_or_path")
        elif not (path / "config.json").is_file():
            checker.fail(f"{str(path)!r} has no config.json", "model_name_or_path")
        else:
            spec["model_name_or_path"] = str(path)

    if spec.get("deepspeed"):
        _check_deepspeed(spec, checker)
    if spec.get("resume_from_checkpoint"):
        spec["resume_from_checkpoint"] = str(checker.resolve(spec["resume_from_checkpoint"]))
    if "output_dir" in spec:
        spec["output_dir"] = str(checker.resolve(spec["output_dir"]))

    dataset_dir = checker.resolve(spec.get("dataset_dir", KEYS["dataset_dir"].default))
    if checker.base_dir is not None or "dataset_dir" in spec:
        spec["dataset_dir"] = str(dataset_dir)
    if "dataset" in spec:
        _check_datasets(spec["dataset"], dataset_dir, checker)


def _check_deepspeed(spec: dict, checker: _Checker) -> None:
    path = checker.resolve(spec["deepspeed"])
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        checker.fail(f"DeepSpeed config {str(path)!r} does not exist", "deepspeed")
        return
    except (OSError, json.JSONDecodeError) as exc:
        checker.fail(f"DeepSpeed config {str(path)!r} is not valid JSON: {exc}", "deepspeed")
        return
    stage = (config.get("zero_optimization") or {}).get("stage", 0) if isinstance(config, dict) else None
    if stage not in (0, 1, 2, 3):
        checker.fail(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}", "deepspeed")
        return
    spec["deepspeed"] = str(path)


def load_dataset_registry(dataset_dir: Path) -> dict:
    """dataset_info.json of a dataset folder (raises FileNotFoundError / ValueError)."""
    registry = json.loads((dataset_dir / "dataset_info.json").read_text())
    if not isinstance(registry, dict):
        raise ValueError("dataset_info.json must hold an object of dataset entries")
    return registry


def _check_datasets(names: list[str], dataset_dir: Path, checker: _Checker) -> None:
    try:
        registry = load_dataset_registry(dataset_dir)
    except FileNotFoundError:
        checker.fail(f"{str(dataset_dir)!r} has no dataset_info.json", "dataset_dir")
        return
    except (OSError, ValueError) as exc:
        checker.fail(f"dataset_info.json in {str(dataset_dir)!r} is unreadable: {exc}", "dataset_dir")
        return
    for name in names:
        entry = registry.get(name)
        if not isinstance(entry, dict):
            close = difflib.get_close_matches(name, registry, n=3)
            hint = f"; close: {', '.join(close)}" if close else ""
            checker.fail(f"dataset {name!r} is not registered in {dataset_dir / 'dataset_info.json'}{hint}", "dataset")
            continue
        if "file_name" not in entry:
            remote = [k for k in REMOTE_DATASET_KEYS if k in entry]
            checker.fail(
                f"dataset {name!r} has no local file_name (it names {', '.join(remote) or 'no file'}); "
                "datasets cannot be downloaded on this cluster", "dataset",
            )
            continue
        if entry.get("ranking"):
            checker.fail(
                f"dataset {name!r} is a preference (ranking) dataset; it needs stage dpo, "
                "which ADC's trainer does not support", "dataset",
            )
        formatting = entry.get("formatting", "alpaca")
        if formatting not in DATASET_FORMATS:
            checker.fail(
                f"dataset {name!r} has formatting {formatting!r}; supported: {', '.join(DATASET_FORMATS)}", "dataset"
            )
        path = dataset_dir / entry["file_name"]
        if not path.exists():
            checker.fail(f"dataset {name!r}: file {str(path)!r} does not exist", "dataset")
        elif path.is_file() and path.suffix not in DATASET_FILE_TYPES:
            checker.fail(
                f"dataset {name!r}: file type {path.suffix or '(none)'!r} is not supported; "
                f"supported: {', '.join(DATASET_FILE_TYPES)} (or a folder of them)", "dataset",
            )
