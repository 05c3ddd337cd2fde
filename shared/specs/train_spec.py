"""Validation of a job's `train` section against LLaMA-Factory's own argument definitions.

The api calls `validate_train_spec` before anything is queued and answers 422 with
`TrainSpecError.errors`, each naming its key. What is accepted is what `llamafactory-cli train`
parses, read from the schema that scripts/install.sh exports from LLaMA-Factory itself
(`worker/trainer/schema_export.py`: its argument dataclasses with types and choices, its template
registry, its dataset registry's formats): an unknown key, a wrong type, a value outside the
choices, an unknown template, an unregistered or remote dataset and a dataset that does not fit
the stage are refused. ADC adds only what its cluster and its contract need: models and data are
local folders (nothing is downloaded), checkpoints keep optimizer and RNG state (exact resume).

Pure Python: the api imports this, so neither torch nor LLaMA-Factory is imported here.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

from shared.infra.config import SpecLimits
from shared.specs.spec_bounds import INT64, printable_key
from shared.specs.tenant_paths import (
    CHECKPOINT_KEY,
    Refused,
    TenantRoots,
    custom_code,
    interpolations,
    path_keys,
    read_json_file,
    read_small_file,
    real,
    relative_inside,
    within,
)

SCHEMA_ENV = "ADC_LLAMAFACTORY_SCHEMA"
DEFAULT_SCHEMA = Path(__file__).resolve().parents[2] / ".venv-trainer" / "adc_llamafactory_schema.json"
# ADC's own keys (worker/trainer/job_config.py takes them out before LLaMA-Factory parses).
ADC_KEYS = {
    "adc_global_batch_size": {"kind": "int", "nullable": True, "default": None},
    # A serving job (the spec's `serve: true`, shared/specs/job_spec.py): LLaMA-Factory's inference keys, served.
    "adc_serve": {"kind": "bool", "default": False},
}
SERVE_KEY = "adc_serve"
# What a serving job may not ask for: it runs LLaMA-Factory's chat model, it trains, evaluates and exports nothing.
NOT_SERVED = ("do_train", "do_eval", "do_predict", "export_dir")
SERVE_BACKENDS = ("huggingface",)  # vLLM and SGLang are not in ADC's trainer environment
DEFAULT_MAX_FILE_BYTES = 16 * 2**20  # a file read while checking, without tenancy (offline checks)
# LLaMA-Factory builds preference pairs (ranking datasets) for these stages: its loader refuses a
# ranking dataset anywhere else and a non-ranking one here (data/loader.py, `_get_merged_dataset`;
# dpo loads its data as stage "rm").
RANKING_STAGES = ("rm", "dpo")
REMOTE_DATASET_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
REPORTERS = ("none", "tensorboard")  # the rest send data to outside services
GALORE_OPTIMS = ("adamw_torch", "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adafactor")
APOLLO_OPTIMS = ("adamw_torch",)
# Near-miss suggestions ("did you mean") cost a fuzzy match against every argument: only so many per spec,
# and only for names of a sensible length.
MAX_SUGGESTIONS = 20
MAX_SUGGESTED_CHARS = 64
MAX_DATASETS = 64  # names in one `dataset` / `eval_dataset`
TRUST_KEY = "trust_remote_code"


class TrainSpecError(ValueError):
    """All problems of a train section; `errors` is a list of {"loc": [...], "msg": str}."""

    def __init__(self, errors: list[dict]) -> None:
        self.errors = errors
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        super().__init__(f"invalid train section: {lines}")


def schema_path() -> Path:
    return Path(os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA)


@functools.lru_cache(maxsize=4)
def _load_schema(path: str, mtime_ns: int) -> dict:  # noqa: ARG001 - mtime keys the cache
    return json.loads(Path(path).read_text())


def load_schema() -> dict:
    """LLaMA-Factory's exported argument schema (raises TrainSpecError if it is missing)."""
    path = schema_path()
    try:
        return _load_schema(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise TrainSpecError(
            [
                {
                    "loc": ["train"],
                    "msg": f"LLaMA-Factory's argument schema {str(path)!r} is not "
                    f"readable ({exc}); run scripts/install.sh",
                }
            ]
        ) from None


class _Checker:
    def __init__(self, base_dir: Path | None, schema: dict, roots: TenantRoots | None, limits: SpecLimits) -> None:
        self.base_dir = base_dir
        self.schema = schema
        self.roots = roots
        self.limits = limits
        self.max_file_bytes = roots.max_file_bytes if roots else DEFAULT_MAX_FILE_BYTES
        self.errors: list[dict] = []
        self.model_folders: list[tuple[str, Path]] = []  # (key, resolved folder) of every model the job loads
        self.suggestions_left = MAX_SUGGESTIONS

    def close_matches(self, word: str, candidates, n: int = 1) -> list[str]:
        """difflib's near misses, while this spec's budget of suggestions lasts."""
        if self.suggestions_left <= 0 or len(word) > MAX_SUGGESTED_CHARS:
            return []
        self.suggestions_left -= 1
        return difflib.get_close_matches(word, list(candidates), n=n)

    def fail(self, msg: str, *loc: Any) -> None:
        self.errors.append({"loc": ["train", *loc], "msg": msg})

    def resolve(self, value: str) -> Path:
        path = Path(value) if self.roots is not None else Path(value).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path

    def guard(self, check, *args):
        """check(*args), its Refused recorded as this key's error (None then)."""
        try:
            return check(*args)
        except Refused as refused:
            self.fail(refused.msg, refused.field)
            return None

    def path(self, name: str, value: str) -> Path | None:
        """`value` resolved; with tenant roots, only if it lies inside them (else the error is recorded)."""
        if self.roots is None:
            return self.resolve(value)
        return self.guard(self.roots.confine, name, value, self.base_dir)

    def awaited(self, path: Path) -> bool:
        """The output of an earlier job this one waits for (`after`), not written yet: checked at launch."""
        return self.roots is not None and within(path, self.roots.awaited)

    def checkpoint_path(self, value: str) -> Path | None:
        """A checkpoint to resume from: the team's own folders or a job's output folder. Which team that job
        belongs to is the caller's to check (`TenantRoots.checkpoint_job`); the worker checks it again."""
        if self.roots is None:
            return self.resolve(value)
        path = real(self.resolve(value))
        if self.roots.in_own(path) or self.roots.checkpoint_job(path):
            return path
        allowed = self.roots.own + ((self.roots.jobs_root,) if self.roots.jobs_root else ())
        self.fail(self.roots.outside(CHECKPOINT_KEY, value, allowed, "resume from").msg, CHECKPOINT_KEY)
        return None

    def coerce(self, name: str, field: dict, value: Any) -> tuple[bool, Any]:
        """(ok, normalized value) for one key, by the kind LLaMA-Factory declares."""
        if value is None:
            if field.get("nullable") or field.get("default") is None:
                return True, None
            return self._type_error(name, f"a value (default {field.get('default')!r})", value)
        kind = field["kind"]
        if kind == "bool":
            return (True, value) if isinstance(value, bool) else self._type_error(name, "true or false", value)
        if kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                if not INT64[0] <= value <= INT64[1]:
                    self.fail(f"{value.bit_length()}-bit integer is outside 64 bits", name)
                    return False, None
                return True, value
            return self._type_error(name, "an integer", value)
        if kind == "float":
            number = None
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**1023:
                return True, value  # kept as written (`save_steps: 500`), as LLaMA-Factory's own parse keeps it
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                number = float(value) if abs(value) < 2**1023 else math.inf
            elif isinstance(value, str) and len(value) <= 64:
                # PyYAML reads `1e-4` (no dot) as a string; LLaMA-Factory's YAML reader reads a number.
                try:
                    number = float(value)
                except ValueError:
                    pass
            if number is None:
                return self._type_error(name, "a number", value)
            if not math.isfinite(number):  # "1e400" reads as infinity, "nan" as not a number
                self.fail(f"{str(value)[:64]!r} is not a finite number", name)
                return False, None
            return True, number
        if kind == "str":
            if isinstance(value, str):
                return True, value
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                return True, ",".join(value)  # LLaMA-Factory splits comma-separated names itself
            return self._type_error(name, "a string", value)
        if kind == "choice":
            choices = field.get("choices", [])
            if value in choices and not isinstance(value, bool):
                return True, value
            listed = ", ".join(str(c) for c in choices)
            self.fail(f"unsupported value {value!r}; LLaMA-Factory accepts: {listed}", name)
            return False, None
        if kind == "list" and not isinstance(value, (list, str)):
            return self._type_error(name, "a list or a comma-separated string", value)
        if kind == "dict" and not isinstance(value, (dict, str)):
            return self._type_error(name, "a mapping or a JSON string", value)
        return True, value

    def _type_error(self, name: str, expected: str, value: Any) -> tuple[bool, None]:
        self.fail(f"expected {expected}, got {type(value).__name__} {value!r}", name)
        return False, None


def _unknown_key_message(name: str, checker: _Checker, version: str) -> str:
    close = checker.close_matches(name, [*checker.schema["fields"], *ADC_KEYS])
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {printable_key(name)!r}: not an argument of LLaMA-Factory {version}{hint}"


def validate_train_spec(
    train: dict, base_dir: str | Path | None = None, roots: TenantRoots | None = None, limits: SpecLimits | None = None
) -> dict:
    """Check a train section and return it normalized (numbers written as strings read as numbers,
    relative paths resolved against base_dir). With `roots` (the api and the worker always give them),
    every path must lie inside the folders the job's team may read (shared/specs/tenant_paths.py), and
    `trust_remote_code` is allowed only for models inside the trusted code roots.
    Raises TrainSpecError listing every problem."""
    if not isinstance(train, dict):
        raise TrainSpecError([{"loc": ["train"], "msg": f"expected a mapping of keys, got {type(train).__name__}"}])
    limits = limits or SpecLimits()
    if len(train) > limits.max_keys:  # before any per-key work (the api has bounded the whole document)
        raise TrainSpecError(
            [{"loc": ["train"], "msg": f"{len(train)} keys; at most {limits.max_keys} (api.spec_limits.max_keys)"}]
        )
    schema = load_schema()
    fields = schema["fields"]
    base = Path(base_dir).expanduser().resolve() if base_dir is not None else None
    checker = _Checker(base, schema, roots, limits)
    if hits := interpolations(train):
        for loc in hits:
            checker.fail(
                "interpolation (${...}) is not allowed: the trainer's config reader would resolve it "
                "(e.g. ${oc.env:NAME} reads the trainer's environment)",
                *loc,
            )
        raise TrainSpecError(checker.errors)

    normalized: dict[str, Any] = {}
    for name, value in train.items():
        if not isinstance(name, str):
            checker.fail(f"keys must be strings, got {name!r}", str(name))
            continue
        field = fields.get(name) or ADC_KEYS.get(name)
        if field is None:
            checker.fail(
                _unknown_key_message(name, checker, schema.get("llamafactory_version", "")), printable_key(name)
            )
            continue
        ok, coerced = checker.coerce(name, field, value)
        if ok:
            normalized[name] = coerced
    if "model_name_or_path" not in train:
        checker.fail("is required", "model_name_or_path")

    _check_values(normalized, checker)
    _check_paths(normalized, checker)
    _check_trusted_code(normalized, checker)
    if checker.errors:
        raise TrainSpecError(checker.errors)
    return normalized


def _setting(spec: dict, checker: _Checker, name: str) -> Any:
    field = checker.schema["fields"].get(name) or ADC_KEYS.get(name) or {}
    return spec.get(name, field.get("default"))


def _check_values(spec: dict, checker: _Checker) -> None:
    get = functools.partial(_setting, spec, checker)
    told = any(k in spec for k in ("do_train", "do_eval", "do_predict"))
    if spec.get(SERVE_KEY):
        _check_serving(spec, checker)
    training = get("do_train") or not (told or is_export(spec) or spec.get(SERVE_KEY))
    if training and not get("dataset"):
        checker.fail("is required to train (do_train)", "dataset")
    max_steps = spec.get("max_steps")
    if isinstance(max_steps, int) and not -1 <= max_steps <= checker.limits.max_steps:
        checker.fail(
            f"{max_steps} is outside -1 (train for num_train_epochs) to {checker.limits.max_steps} "
            "(api.spec_limits.max_steps)",
            "max_steps",
        )
    template = spec.get("template")
    if template is not None and template not in checker.schema["templates"]:
        close = checker.close_matches(template, checker.schema["templates"], n=3)
        hint = f"; close: {', '.join(close)}" if close else ""
        checker.fail(f"unknown template {template!r}: not in LLaMA-Factory's template registry{hint}", "template")
    if spec.get("save_only_model") is True:
        checker.fail(
            "save_only_model: true would drop optimizer and RNG state from checkpoints, so a stopped job "
            "could not resume exactly; remove it or set it to false",
            "save_only_model",
        )
    report_to = spec.get("report_to")
    reporters = report_to.split(",") if isinstance(report_to, str) else report_to or []
    outside = [r.strip() for r in reporters if r.strip() not in REPORTERS]
    if outside:
        checker.fail(
            f"{', '.join(outside)} would send data off the cluster; supported: {', '.join(REPORTERS)}", "report_to"
        )
    if get("bf16") and get("fp16"):
        checker.fail("bf16 and fp16 are both true; choose one", "fp16")
    for switch, optims in (("use_galore", GALORE_OPTIMS), ("use_apollo", APOLLO_OPTIMS)):
        # LLaMA-Factory's own rule (train/trainer_utils.py raises NotImplementedError on any other optim);
        # with no `optim` the trainer picks adamw_torch.
        if get(switch) and spec.get("optim") is not None and spec["optim"] not in optims:
            checker.fail(
                f"{switch} builds its optimizer for optim {', '.join(optims)} only, not {spec['optim']!r}", "optim"
            )
    if spec.get("quantization_bit") is not None and get("finetuning_type") not in ("lora", "oft"):
        # LLaMA-Factory's own rule (hparams/parser.py, _verify_model_args), said before queueing.
        checker.fail(
            f"quantization_bit needs finetuning_type lora or oft, got {get('finetuning_type')!r}", "quantization_bit"
        )
    global_batch, per_device = get("adc_global_batch_size"), get("per_device_train_batch_size")
    if global_batch is not None and isinstance(per_device, int) and per_device > 0 and global_batch % per_device:
        checker.fail(f"must be a multiple of per_device_train_batch_size ({per_device})", "adc_global_batch_size")


def _check_serving(spec: dict, checker: _Checker) -> None:
    """A serving job runs LLaMA-Factory's chat model (`llamafactory-cli api`): nothing to train or write."""
    for key in NOT_SERVED:
        if spec.get(key):
            checker.fail("a serving job (serve: true) trains, evaluates and exports nothing; remove it", key)
    backend = spec.get("infer_backend")
    if backend is not None and backend not in SERVE_BACKENDS:
        checker.fail(
            f"{backend!r} is not installed in ADC's trainer environment; serving jobs use: {', '.join(SERVE_BACKENDS)}",
            "infer_backend",
        )


def _check_paths(spec: dict, checker: _Checker) -> None:
    """Every path-valued key: inside the team's folders (when `roots` is given), then there and readable."""
    # Only the keys the spec sets, in the schema's order: classifying all of LLaMA-Factory's arguments on
    # every submission was the largest part of checking one.
    for name, how in path_keys(name for name in checker.schema["fields"] if name in spec).items():
        value = spec.get(name)
        if name == "deepspeed" and isinstance(value, dict):
            _check_deepspeed(value, checker)  # written inline: the same rules as its file
            continue
        if not isinstance(value, str) or not value or name == "dataset_dir":
            continue  # dataset_dir below, with its registry; inline DeepSpeed/FSDP mappings are not paths
        if name == "output_dir" and checker.roots is not None:
            continue  # ADC sets it to the job's own folder
        if how == "write" or (how == "tokenized" and not Path(value).is_absolute()):
            if checker.roots is None:
                spec[name] = str(checker.resolve(value))
            else:
                checker.guard(relative_inside, name, value)
        elif how == "tokenized":  # absolute: read only, so it must exist; one to write goes in the job folder
            if (path := checker.path(name, value)) is not None:
                if checker.roots is not None and not path.is_dir():
                    checker.fail(
                        f"{value!r} is not a tokenized dataset folder; for LLaMA-Factory to write one, give "
                        "a relative path (it is placed under the job's output folder)",
                        name,
                    )
                else:
                    spec[name] = str(path)
        elif how == "models":
            parts = [part.strip() for part in value.split(",") if part.strip()]
            paths = [checker.path(name, part) for part in parts]
            for raw, path in zip(parts, paths) if all(paths) else ():  # a path refused as outside: that alone
                if not (path / "adapter_config.json").is_file() and not checker.awaited(path):
                    why = "no such folder" if not path.is_dir() else "no adapter_config.json in it"
                    checker.fail(
                        f"{raw!r} is not a local adapter folder ({why}); adapters are not downloaded on "
                        "this cluster: give a folder with adapter_config.json (a LoRA job's output)",
                        name,
                    )
            if checker.roots is not None and all(paths):
                spec[name] = ",".join(str(p) for p in paths)
        elif how == "checkpoint":
            if (path := checker.checkpoint_path(value)) is not None:
                spec[name] = str(path)
        elif (path := checker.path(name, value)) is not None:
            spec[name] = str(path)
            if how == "model" and (checker.awaited(path) or _lora_reward_model(spec, name, path, checker)):
                pass  # an earlier job's output: checked when that job has written it (the worker checks again)
            elif how == "model":
                checker.model_folders.append((name, path))
                _check_model(name, value, path, checker)
                if name == "model_name_or_path" and (path / "config.json").is_file():
                    _check_llama_pro(spec, path, checker)
                    _check_processor(spec, path, checker)
            elif how == "config" and name != "new_special_tokens_config":
                _check_config_file(name, path, checker)
            elif how == "config":
                checker.guard(read_small_file, path, name, checker.max_file_bytes)
    if "dataset_dir" not in spec and not (spec.get("dataset") or spec.get("eval_dataset")):
        return  # nothing is read from the default dataset folder (an export config, say)
    dataset_dir = checker.path("dataset_dir", spec.get("dataset_dir", "data"))
    if dataset_dir is None:
        return
    if checker.base_dir is not None or "dataset_dir" in spec:
        spec["dataset_dir"] = str(dataset_dir)
    stage = _setting(spec, checker, "stage")
    for key in ("dataset", "eval_dataset"):
        if spec.get(key):
            names = [n.strip() for n in spec[key].split(",") if n.strip()]
            if len(names) > MAX_DATASETS:
                checker.fail(f"{len(names)} datasets; at most {MAX_DATASETS}", key)
                continue
            _check_datasets(key, names, dataset_dir, stage, checker)


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def _check_processor(spec: dict, path: Path, checker: _Checker) -> None:
    """A multimodal template on a model folder without a processor: LLaMA-Factory's plugin for it stops at
    the first sample ("Processor was not found"), text-only data or not, so it is said at submission."""
    template = spec.get("template")
    if template not in checker.schema.get("processor_templates", ()):
        return
    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        checker.fail(
            f"template {template!r} is multimodal: LLaMA-Factory needs the model's processor for it, and "
            f"{str(path)!r} has none ({' or '.join(PROCESSOR_FILES)}); use the model's text template or a "
            "multimodal model",
            "template",
        )


def is_export(spec: dict) -> bool:
    """A LLaMA-Factory export config (`llamafactory-cli export`: merge, re-save, quantize): `export_dir` set
    and nothing to train, evaluate or predict."""
    return bool(spec.get("export_dir")) and not any(spec.get(k) for k in ("do_train", "do_eval", "do_predict"))


def _lora_reward_model(spec: dict, name: str, path: Path, checker: _Checker) -> bool:
    """A reward model that is an earlier job's LoRA adapter (no config.json): LLaMA-Factory loads it onto
    the policy's base model when `reward_model_type` is lora (its default)."""
    if name != "reward_model" or checker.roots is None or not within(path, checker.roots.granted):
        return False
    if (path / "config.json").is_file() or not (path / "adapter_config.json").is_file():
        return False
    if (kind := _setting(spec, checker, "reward_model_type")) != "lora":
        checker.fail(f"{str(path)!r} is a LoRA adapter, which loads as reward_model_type lora, not {kind!r}", name)
    return True


def _check_llama_pro(spec: dict, path: Path, checker: _Checker) -> None:
    """LLaMA-Factory's own rule for use_llama_pro (model/adapter.py, model_utils/misc.py), said before
    queueing: it trains every (layers / freeze_trainable_layers)-th layer of a model that its
    llama_pro script expanded, so the model's layer count must be a multiple of freeze_trainable_layers."""
    if not _setting(spec, checker, "use_llama_pro"):
        return
    trainable = _setting(spec, checker, "freeze_trainable_layers")
    try:
        config = read_json_file(path / "config.json", "model_name_or_path", checker.max_file_bytes)
    except Refused:
        return  # the model check names it
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    layers = (
        next((config.get(k) for k in ("num_hidden_layers", "num_layers", "n_layer") if config.get(k)), None)
        if isinstance(config, dict)
        else None
    )
    if isinstance(layers, int) and isinstance(trainable, int) and trainable and layers % trainable:
        checker.fail(
            f"use_llama_pro trains every (layers / freeze_trainable_layers)-th layer of a model expanded by "
            f"LLaMA-Factory's llama_pro script: the model has {layers} layers, which is not a multiple of "
            f"freeze_trainable_layers {trainable}",
            "freeze_trainable_layers",
        )


def _check_model(name: str, raw: str, path: Path, checker: _Checker) -> None:
    if not path.is_dir():
        hub_like = not raw.startswith(("/", ".", "~")) and raw.count("/") == 1
        why = "a hub id? models cannot be downloaded on this cluster" if hub_like else "no such folder"
        checker.fail(f"{raw!r} does not exist as a local folder ({why}); give a folder with config.json", name)
    elif not (path / "config.json").is_file():
        checker.fail(f"{str(path)!r} has no config.json", name)
    elif checker.roots is not None and (unreadable := checker.roots.unreadable_by_trainer(path)):
        checker.fail(f"{unreadable}; it would fail to load", name)
    elif checker.roots is not None and (marker := custom_code(path, checker.max_file_bytes)):
        if not within(path, checker.roots.trusted_code):
            checker.fail(
                f"model {raw!r} has its own Python code (auto_map in {marker}), which runs only from a "
                f"folder an admin trusts (tenancy.trusted_code_roots: "
                f"{checker.roots.describe(checker.roots.trusted_code)})",
                name,
            )


def _check_config_file(name: str, path: Path, checker: _Checker) -> None:
    try:
        config = read_json_file(path, name, checker.max_file_bytes)
    except Refused as refused:
        checker.fail(f"{'DeepSpeed config ' if name == 'deepspeed' else ''}{refused.msg}", name)
        return
    if name == "deepspeed":
        _check_deepspeed(config, checker)


def _check_deepspeed(config: Any, checker: _Checker) -> None:
    """A DeepSpeed config, from its file or written inline in the spec: a mapping with a ZeRO stage it has."""
    if not isinstance(config, dict):
        checker.fail(f"a DeepSpeed config is a mapping, got {type(config).__name__}", "deepspeed")
        return
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        checker.fail(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}", "deepspeed")


def _check_trusted_code(spec: dict, checker: _Checker) -> None:
    """`trust_remote_code: true` lets transformers import Python from a model's folder, from wherever it
    looks (an auto_map in any of its configs, custom_generate/, a future one): allowed only when every model
    the job loads lies in a folder an admin trusts, whatever the folder holds today."""
    if not spec.get(TRUST_KEY) or checker.roots is None:
        return
    trusted = checker.roots.trusted_code
    outside = [(key, path) for key, path in checker.model_folders if not within(path, trusted)]
    if outside:
        names = ", ".join(f"{key} {str(path)!r}" for key, path in outside)
        checker.fail(
            f"true lets a model's own Python run, which only models in a folder an admin trusts may do "
            f"(tenancy.trusted_code_roots: {checker.roots.describe(trusted)}); {names} is outside them: "
            "remove trust_remote_code or set it to false",
            TRUST_KEY,
        )


def load_dataset_registry(dataset_dir: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> dict:
    """dataset_info.json of a dataset folder (raises FileNotFoundError / ValueError)."""
    path = dataset_dir / "dataset_info.json"
    try:
        registry = read_json_file(path, "dataset_dir", max_bytes)
    except Refused as refused:
        if not path.exists():
            raise FileNotFoundError(str(path)) from None
        raise ValueError(refused.msg) from None
    if not isinstance(registry, dict):
        raise ValueError("dataset_info.json must hold an object of dataset entries")
    return registry


def _check_datasets(key: str, names: list[str], dataset_dir: Path, stage: str, checker: _Checker) -> None:
    try:
        registry = load_dataset_registry(dataset_dir, checker.max_file_bytes)
    except FileNotFoundError:
        checker.fail(f"{str(dataset_dir)!r} has no dataset_info.json", "dataset_dir")
        return
    except (OSError, ValueError) as exc:
        checker.fail(f"dataset_info.json in {str(dataset_dir)!r} is unreadable: {exc}", "dataset_dir")
        return
    formats = checker.schema["dataset"]["formatting"]
    for name in names:
        entry = registry.get(name)
        if not isinstance(entry, dict):
            close = checker.close_matches(name, registry, n=3)
            hint = f"; close: {', '.join(close)}" if close else ""
            checker.fail(f"dataset {name!r} is not registered in {dataset_dir / 'dataset_info.json'}{hint}", key)
            continue
        if "file_name" not in entry:
            remote = [k for k in REMOTE_DATASET_KEYS if k in entry]
            checker.fail(
                f"dataset {name!r} has no local file_name (it names {', '.join(remote) or 'no file'}); "
                "datasets cannot be downloaded on this cluster",
                key,
            )
            continue
        ranking = bool(entry.get("ranking", False))
        if ranking and stage not in RANKING_STAGES:
            checker.fail(
                f"dataset {name!r} is a preference (ranking) dataset: it fits stage "
                f"{' or '.join(RANKING_STAGES)}, not {stage!r}",
                key,
            )
        elif not ranking and stage in RANKING_STAGES:
            checker.fail(f"stage {stage!r} needs a preference (ranking: true) dataset; {name!r} is not one", key)
        if stage == "kto" and "kto_tag" not in (entry.get("columns") or {}):
            checker.fail(f"stage 'kto' needs a kto_tag column; dataset {name!r} maps none", key)
        formatting = entry.get("formatting", "alpaca")
        if formatting not in formats:
            checker.fail(
                f"dataset {name!r} has formatting {formatting!r}; LLaMA-Factory reads: {', '.join(formats)}", key
            )
        unknown = [c for c in entry.get("columns") or {} if c not in checker.schema["dataset"]["columns"]]
        unknown += [t for t in entry.get("tags") or {} if t not in checker.schema["dataset"]["tags"]]
        if unknown:
            checker.fail(f"dataset {name!r} maps unknown columns or tags: {', '.join(unknown)}", key)
        file_name = entry["file_name"]
        if not isinstance(file_name, str) or not file_name:
            checker.fail(f"dataset {name!r}: file_name must be a path", key)
            continue
        if checker.roots is not None:
            try:  # LLaMA-Factory joins it to dataset_dir: an absolute or ../ name escapes it
                path = checker.roots.confine(key, str(dataset_dir / file_name), None)
            except Refused:
                checker.fail(
                    f"dataset {name!r}: file_name {file_name!r} is outside the folders team "
                    f"{checker.roots.team!r} may read: {checker.roots.describe()}",
                    key,
                )
                continue
        else:
            path = dataset_dir / file_name
        if not path.exists():
            checker.fail(f"dataset {name!r}: file {str(path)!r} does not exist", key)
