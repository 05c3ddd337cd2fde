"""shared/specs/train_spec.py: what the api refuses before a job is queued, from LLaMA-Factory's own schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.specs.train_spec import TrainSpecError, load_schema, validate_train_spec
from tests.integration.trainer.trainer_process import EXAMPLE_DATA, REFERENCE_LLAMAFACTORY

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def minimal(model_dir: Path, **extra) -> dict:
    return {
        "model_name_or_path": str(model_dir),
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(EXAMPLE_DATA),
        **extra,
    }


def errors_of(train: dict, base_dir=None) -> dict[str, str]:
    with pytest.raises(TrainSpecError) as caught:
        validate_train_spec(train, base_dir=base_dir)
    for error in caught.value.errors:
        assert error["loc"][0] == "train" and isinstance(error["msg"], str) and error["msg"]
    return {"/".join(map(str, e["loc"][1:])): e["msg"] for e in caught.value.errors}


def test_schema_is_llamafactorys_own_argument_set():
    schema = load_schema()
    assert schema["llamafactory_version"] == "0.9.5"
    fields = schema["fields"]
    # Keys of each of LLaMA-Factory's argument groups, with the types and choices it declares.
    assert fields["stage"]["choices"] == ["pt", "sft", "rm", "ppo", "dpo", "kto"]
    assert fields["finetuning_type"]["choices"] == ["lora", "oft", "freeze", "full"]
    assert fields["lora_rank"]["kind"] == "int" and fields["pref_beta"]["kind"] == "float"
    assert {"val_size", "eval_dataset", "do_predict", "predict_with_generate", "tokenized_path"} <= set(fields)
    assert len(schema["templates"]) > 100 and {"qwen3_nothink", "llama3", "alpaca", "default"} <= set(
        schema["templates"]
    )


def test_minimal_spec_is_normalized(model_dir):
    spec = validate_train_spec(
        minimal(model_dir, dataset="identity,alpaca_en_demo", learning_rate="1e-4", num_train_epochs=3)
    )
    assert spec["dataset"] == "identity,alpaca_en_demo"  # LLaMA-Factory's own comma-separated form
    assert spec["learning_rate"] == pytest.approx(1e-4)  # PyYAML's string "1e-4" read as the number it is
    # A float key written as an integer stays as written (`save_steps: 500`, not 500.0), as LLaMA-Factory's
    # own parse leaves it: train.yaml then says what the user said.
    assert spec["num_train_epochs"] == 3 and isinstance(spec["num_train_epochs"], int)
    assert "lora_rank" not in spec  # defaults are not written into the user's spec


def test_all_problems_are_reported_at_once_each_naming_its_key(model_dir):
    errors = errors_of(
        minimal(
            model_dir,
            lora_rank="abc",
            learning_rate=[1],
            stage="dpo",
            finetuning_type="adapter",
            frobnicate=1,
            template="vicunaa",
            bf16=True,
            fp16=True,
            report_to="wandb",
            pref_beta="strong",
        )
    )
    assert set(errors) == {
        "lora_rank",
        "learning_rate",
        "dataset",
        "finetuning_type",
        "frobnicate",
        "template",
        "fp16",
        "report_to",
        "pref_beta",
    }
    assert errors["lora_rank"] == "expected an integer, got str 'abc'"
    assert "LLaMA-Factory accepts: lora, oft, freeze, full" in errors["finetuning_type"]
    assert "unknown key 'frobnicate': not an argument of LLaMA-Factory 0.9.5" in errors["frobnicate"]
    assert "not in LLaMA-Factory's template registry; close: vicuna" in errors["template"]
    assert "stage 'dpo' needs a preference (ranking: true) dataset" in errors["dataset"]
    assert "expected a number" in errors["pref_beta"]


def test_every_stage_eval_and_preference_key_is_accepted(model_dir):
    spec = validate_train_spec(
        minimal(
            model_dir,
            stage="dpo",
            dataset="dpo_en_demo",
            dataset_dir=str(REFERENCE_LLAMAFACTORY / "data"),
            pref_beta=0.1,
            pref_loss="sigmoid",
            do_eval=True,
            val_size=0.1,
            eval_strategy="steps",
            eval_steps=5,
            per_device_eval_batch_size=1,
            finetuning_type="oft",
            plot_loss=True,
            preprocessing_num_workers=2,
        )
    )
    assert spec["stage"] == "dpo" and spec["val_size"] == 0.1
    assert (
        validate_train_spec(
            minimal(model_dir, stage="kto", dataset="kto_en_demo", dataset_dir=str(REFERENCE_LLAMAFACTORY / "data"))
        )["stage"]
        == "kto"
    )


def test_unknown_key_suggests_a_close_known_one(model_dir):
    assert "did you mean 'lora_rank'?" in errors_of(minimal(model_dir, lora_rnak=8))["lora_rnak"]


def test_choices_come_from_transformers_enums_too(model_dir):
    assert "LLaMA-Factory accepts" in errors_of(minimal(model_dir, lr_scheduler_type="cosinus"))["lr_scheduler_type"]
    assert validate_train_spec(minimal(model_dir, lr_scheduler_type="cosine"))["lr_scheduler_type"] == "cosine"


def test_resume_safety_and_reporting_rules(model_dir):
    errors = errors_of(minimal(model_dir, save_only_model=True, report_to="none,mlflow"))
    assert "could not resume exactly" in errors["save_only_model"]
    assert "mlflow would send data off the cluster" in errors["report_to"]
    errors = errors_of(minimal(model_dir, quantization_bit=4, finetuning_type="full"))
    assert "needs finetuning_type lora or oft" in errors["quantization_bit"]


def test_llamafactorys_own_method_rules_are_said_at_submission(tmp_path):
    """LLaMA-Factory refuses these only after loading the model (llama_pro) or when building the optimizer
    (GaLore, APOLLO: NotImplementedError): said before queueing, naming the key to change."""
    model = tmp_path / "two-layers"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    llama_pro = minimal(model, finetuning_type="freeze", use_llama_pro=True, freeze_trainable_layers=8)
    error = errors_of(llama_pro)["freeze_trainable_layers"]
    assert "2 layers" in error and "not a multiple of freeze_trainable_layers 8" in error
    validate_train_spec({**llama_pro, "freeze_trainable_layers": 2})  # every layer of two: accepted
    validate_train_spec({**llama_pro, "use_llama_pro": False})  # the last 8 of 2 layers: LLaMA-Factory's rule
    assert "adamw_torch only" in errors_of(minimal(model, use_apollo=True, optim="adamw_torch_fused"))["optim"]
    assert "'adamw_torch_fused'" in errors_of(minimal(model, use_galore=True, optim="adamw_torch_fused"))["optim"]
    validate_train_spec(minimal(model, use_galore=True))  # no optim: the trainer picks adamw_torch
    validate_train_spec(minimal(model, use_galore=True, optim="adafactor"))


def test_a_multimodal_template_needs_a_model_with_a_processor(model_dir):
    """LLaMA-Factory stops at the first sample with "Processor was not found" (its example
    ascend/qwen3_5_full_sft_fsdp2.yaml on a text model): said at submission, naming the template."""
    assert {"qwen3_5", "qwen2_vl"} <= set(load_schema()["processor_templates"])
    assert "qwen3_nothink" not in load_schema()["processor_templates"]
    error = errors_of(minimal(model_dir, template="qwen3_5"))["template"]
    assert "'qwen3_5' is multimodal" in error and "processor_config.json or preprocessor_config.json" in error
    validate_train_spec(minimal(model_dir, template="qwen3_nothink"))  # a text template: accepted
    (model_dir / "preprocessor_config.json").write_text("{}")
    validate_train_spec(minimal(model_dir, template="qwen3_5"))  # the model has a processor: accepted


def test_an_adapter_must_be_a_local_adapter_folder(model_dir, tmp_path):
    # LLaMA-Factory's nlg_eval example predicts with the adapter a previous example trained (a relative path).
    error = errors_of(minimal(model_dir, adapter_name_or_path="saves/llama3-8b/lora/sft"), base_dir=tmp_path)
    assert "'saves/llama3-8b/lora/sft' is not a local adapter folder (no such folder)" in error["adapter_name_or_path"]
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    assert (
        "no adapter_config.json"
        in errors_of(minimal(model_dir, adapter_name_or_path=str(adapter)))["adapter_name_or_path"]
    )
    (adapter / "adapter_config.json").write_text("{}")
    assert validate_train_spec(minimal(model_dir, adapter_name_or_path=str(adapter)))["adapter_name_or_path"] == str(
        adapter
    )


def test_model_must_be_a_local_folder_with_config(tmp_path):
    errors = errors_of(
        {
            "model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(EXAMPLE_DATA),
        }
    )
    assert "models cannot be downloaded" in errors["model_name_or_path"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in errors_of(minimal(empty))["model_name_or_path"]


def test_relative_paths_resolve_against_base_dir(model_dir, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    spec = validate_train_spec(
        {
            "model_name_or_path": "model",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(EXAMPLE_DATA),
            "deepspeed": "ds/z2.json",
            "output_dir": "out",
        },
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


def test_datasets_are_checked_against_the_registry_and_the_stage(model_dir, tmp_path):
    registry = {
        "local": {"file_name": "local.json"},
        "missing_file": {"file_name": "gone.json"},
        "hub_only": {"hf_hub_url": "someone/data"},
        "prefs": {"file_name": "local.json", "ranking": True, "formatting": "sharegpt"},
        "odd": {"file_name": "local.json", "formatting": "xml"},
        "typo": {"file_name": "local.json", "columns": {"promt": "q"}},
    }
    (tmp_path / "dataset_info.json").write_text(json.dumps(registry))
    (tmp_path / "local.json").write_text("[]")
    assert validate_train_spec(minimal(model_dir, dataset="local", dataset_dir=str(tmp_path)))["dataset"] == "local"
    with pytest.raises(TrainSpecError) as caught:
        validate_train_spec(
            minimal(model_dir, dataset="missing_file,hub_only,prefs,odd,nowhere,typo", dataset_dir=str(tmp_path))
        )
    messages = [e["msg"] for e in caught.value.errors if e["loc"] == ["train", "dataset"]]
    assert len(messages) == 6
    joined = "\n".join(messages)
    for fragment in (
        "does not exist",
        "cannot be downloaded",
        "preference (ranking) dataset: it fits stage rm or dpo",
        "LLaMA-Factory reads: alpaca, sharegpt, openai",
        "'nowhere' is not registered",
        "unknown columns or tags: promt",
    ):
        assert fragment in joined
    errors = errors_of(
        minimal(model_dir, stage="kto", eval_dataset="local", dataset="local", dataset_dir=str(tmp_path))
    )
    assert "needs a kto_tag column" in errors["dataset"] and "needs a kto_tag column" in errors["eval_dataset"]


def test_missing_registry_and_required_keys(tmp_path):
    errors = errors_of({"dataset_dir": str(tmp_path), "do_train": True})
    assert errors["model_name_or_path"] == "is required" and "is required to train" in errors["dataset"]


def test_global_batch_must_split_into_per_device_batches(model_dir):
    errors = errors_of(minimal(model_dir, per_device_train_batch_size=3, adc_global_batch_size=8))
    assert "multiple of per_device_train_batch_size (3)" in errors["adc_global_batch_size"]


def test_spec_module_stays_free_of_torch_and_llamafactory():
    code = (
        "import sys, shared.specs.train_spec, worker.trainer, worker.trainer.exit_codes, worker.trainer.checkpoints, "
        "worker.trainer.events, worker.trainer.batch_geometry, worker.trainer.launch, worker.trainer.interpreter; "
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'llamafactory') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
