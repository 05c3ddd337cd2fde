"""shared/train_spec.py: what the API refuses before a job is queued (pure, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.train_spec import (
    KEYS,
    NO_EFFECT_KEYS,
    SUPPORTED_TEMPLATES,
    TrainSpecError,
    defaults,
    validate_train_spec,
)
from tests.integration.trainer.trainer_process import EXAMPLE_DATA


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def minimal(model_dir: Path, **extra) -> dict:
    return {"model_name_or_path": str(model_dir), "dataset": "alpaca_en_demo", "dataset_dir": str(EXAMPLE_DATA), **extra}


def errors_of(train: dict, base_dir=None) -> dict[str, str]:
    with pytest.raises(TrainSpecError) as caught:
        validate_train_spec(train, base_dir=base_dir)
    for error in caught.value.errors:
        assert error["loc"][0] == "train" and isinstance(error["msg"], str) and error["msg"]
    return {"/".join(map(str, e["loc"][1:])): e["msg"] for e in caught.value.errors}


def test_minimal_spec_is_normalized(model_dir):
    spec = validate_train_spec(minimal(model_dir, dataset="identity, alpaca_en_demo", learning_rate="1e-4",
                                       num_train_epochs=3, bf16="true"))
    assert spec["dataset"] == ["identity", "alpaca_en_demo"]
    assert spec["learning_rate"] == pytest.approx(1e-4) and isinstance(spec["num_train_epochs"], float)
    assert spec["bf16"] is True
    assert "lora_rank" not in spec  # defaults are not written into the user's spec


def test_all_problems_are_reported_at_once_each_naming_its_key(model_dir):
    errors = errors_of(minimal(
        model_dir, lora_rank="abc", learning_rate=[1], stage="dpo", finetuning_type="adapter", frobnicate=1,
        val_size=0.1, pref_beta=0.1, template="vicuna", cutoff_len=0, bf16=True, fp16=True, report_to="wandb",
    ))
    assert set(errors) == {
        "lora_rank", "learning_rate", "stage", "finetuning_type", "frobnicate", "val_size", "pref_beta",
        "template", "cutoff_len", "fp16", "report_to",
    }
    assert errors["lora_rank"] == "expected an integer, got str 'abc'"
    assert errors["stage"] == "stage 'dpo' is not supported by ADC's trainer; supported: pt, sft"
    assert "supported: freeze, full, lora" in errors["finetuning_type"]
    assert "unknown key 'frobnicate'" in errors["frobnicate"]
    assert "evaluation is not supported" in errors["val_size"]
    assert "preference training" in errors["pref_beta"]
    assert errors["template"].endswith("supported: " + ", ".join(SUPPORTED_TEMPLATES))


def test_unknown_key_suggests_a_close_known_one(model_dir):
    assert "did you mean 'lora_rank'?" in errors_of(minimal(model_dir, lora_rnak=8))["lora_rnak"]


def test_no_effect_keys_are_accepted(model_dir):
    values = {
        "plot_loss": True, "overwrite_output_dir": True, "overwrite_cache": True, "preprocessing_num_workers": 16,
        "dataloader_num_workers": 4, "trust_remote_code": True, "quantization_method": "bnb", "report_to": "none",
        "do_train": True, "save_only_model": False, "ddp_timeout": 180000000,
    }
    assert set(NO_EFFECT_KEYS) <= set(values)
    spec = validate_train_spec(minimal(model_dir, **values))
    assert spec["preprocessing_num_workers"] == 16


def test_values_that_would_break_adc_are_refused_with_the_reason(model_dir):
    errors = errors_of(minimal(model_dir, save_only_model=True, do_train=False))
    assert "resume exactly" in errors["save_only_model"]
    assert "only trains" in errors["do_train"]


def test_quantization_needs_lora_and_no_deepspeed(model_dir, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    errors = errors_of(minimal(model_dir, quantization_bit=4, finetuning_type="full"))
    assert "needs finetuning_type: lora" in errors["quantization_bit"]
    errors = errors_of(minimal(model_dir, quantization_bit=4, deepspeed=str(ds)))
    assert "deepspeed" in errors["quantization_bit"]
    assert "supported: 4, 8" in errors_of(minimal(model_dir, quantization_bit=3))["quantization_bit"]


def test_model_must_be_a_local_folder_with_config(tmp_path):
    errors = errors_of({"model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "dataset": "alpaca_en_demo",
                        "dataset_dir": str(EXAMPLE_DATA)})
    assert "models cannot be downloaded" in errors["model_name_or_path"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in errors_of(minimal(empty))["model_name_or_path"]


def test_relative_paths_resolve_against_base_dir(model_dir, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    spec = validate_train_spec(
        {"model_name_or_path": "model", "dataset": "alpaca_en_demo", "dataset_dir": str(EXAMPLE_DATA),
         "deepspeed": "ds/z2.json", "output_dir": "out"},
        base_dir=tmp_path,
    )
    assert spec["model_name_or_path"] == str(model_dir)
    assert spec["deepspeed"] == str(tmp_path / "ds" / "z2.json")
    assert spec["output_dir"] == str(tmp_path / "out")


def test_deepspeed_config_must_exist_and_name_a_zero_stage(model_dir, tmp_path):
    assert "does not exist" in errors_of(minimal(model_dir, deepspeed=str(tmp_path / "nope.json")))["deepspeed"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 5}}))
    assert "stage must be 0, 1, 2 or 3" in errors_of(minimal(model_dir, deepspeed=str(bad)))["deepspeed"]


def test_datasets_are_checked_against_the_registry(model_dir, tmp_path):
    registry = {
        "local": {"file_name": "local.json"},
        "missing_file": {"file_name": "gone.json"},
        "hub_only": {"hf_hub_url": "someone/data"},
        "prefs": {"file_name": "local.json", "ranking": True, "formatting": "sharegpt"},
        "odd": {"file_name": "local.json", "formatting": "openai"},
        "table": {"file_name": "table.csv"},
    }
    (tmp_path / "dataset_info.json").write_text(json.dumps(registry))
    (tmp_path / "local.json").write_text("[]")
    (tmp_path / "table.csv").write_text("a,b\n")
    spec = validate_train_spec(minimal(model_dir, dataset="local", dataset_dir=str(tmp_path)))
    assert spec["dataset"] == ["local"]
    with pytest.raises(TrainSpecError) as caught:
        validate_train_spec(minimal(model_dir, dataset="missing_file,hub_only,prefs,odd,nowhere,table",
                                    dataset_dir=str(tmp_path)))
    messages = [e["msg"] for e in caught.value.errors if e["loc"] == ["train", "dataset"]]
    assert len(messages) == 6
    joined = "\n".join(messages)
    for fragment in ("does not exist", "cannot be downloaded", "preference (ranking)", "supported: alpaca, sharegpt",
                     "'nowhere' is not registered", "file type '.csv' is not supported"):
        assert fragment in joined


def test_missing_registry_and_required_keys(tmp_path):
    errors = errors_of({"dataset_dir": str(tmp_path)})
    assert errors["model_name_or_path"] == "is required" and errors["dataset"] == "is required"


def test_global_batch_must_split_into_per_device_batches(model_dir):
    errors = errors_of(minimal(model_dir, per_device_train_batch_size=3, adc_global_batch_size=8))
    assert "multiple of per_device_train_batch_size (3)" in errors["adc_global_batch_size"]


def test_every_key_has_a_default_of_its_kind():
    table = defaults()
    assert set(table) == set(KEYS)
    for name, key in KEYS.items():
        if table[name] is None:
            assert key.nullable or key.required, name


def test_spec_module_stays_free_of_torch():
    import subprocess
    import sys

    code = "import sys, shared.train_spec, worker.trainer, worker.trainer.exit_codes, worker.trainer.checkpoints, " \
           "worker.trainer.events, worker.trainer.batch_geometry, worker.trainer.launch; " \
           "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"
