"""LLaMA-Factory's example YAMLs: accepted unchanged except model_name_or_path, or refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shared.train_spec import TrainSpecError, validate_train_spec
from tests.integration.trainer.trainer_process import REFERENCE_LLAMAFACTORY

EXAMPLES = REFERENCE_LLAMAFACTORY / "examples"
pytestmark = pytest.mark.skipif(
    not EXAMPLES.is_dir(), reason=f"LLaMA-Factory reference folder not found at {REFERENCE_LLAMAFACTORY.resolve()}"
)

# example -> None when accepted, else {key: fragment of the message}
EXPECTED = {
    "train_full/qwen3_full_sft.yaml": None,
    "train_lora/qwen3_lora_sft.yaml": None,
    "train_lora/qwen3_lora_sft_ds3.yaml": None,
    "train_lora/qwen3_lora_pretrain.yaml": None,
    "train_qlora/qwen3_lora_sft_otfq.yaml": None,
    "train_lora/qwen3_lora_dpo.yaml": {
        "stage": "stage 'dpo' is not supported by ADC's trainer; supported: pt, sft",
        "pref_beta": "preference training",
        "pref_loss": "preference training",
        "dataset": "'dpo_en_demo' is a preference (ranking) dataset",
    },
}


def test_every_example_is_covered():
    found = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_yaml(example, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = yaml.safe_load((EXAMPLES / example).read_text())
    train["model_name_or_path"] = str(model)
    expected = EXPECTED[example]
    base_dir = REFERENCE_LLAMAFACTORY.resolve()
    if expected is None:
        spec = validate_train_spec(train, base_dir=base_dir)
        assert spec["dataset_dir"] == str(base_dir / "data")
        if "deepspeed" in train:
            assert Path(spec["deepspeed"]) == base_dir / "examples" / "deepspeed" / "ds_z3_config.json"
        assert set(spec) == set(train) | {"dataset_dir"}  # nothing dropped
        return
    with pytest.raises(TrainSpecError) as caught:
        validate_train_spec(train, base_dir=base_dir)
    messages = {e["loc"][1]: e["msg"] for e in caught.value.errors}
    assert set(messages) == set(expected)
    for key, fragment in expected.items():
        assert fragment in messages[key]
