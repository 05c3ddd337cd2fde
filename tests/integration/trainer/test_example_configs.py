"""The api's validator accepts every LLaMA-Factory example YAML in ../shared/llamafactory/examples as it
is written there (only the model, the dataset folder, a step cap and bf16 changed). That they then
train to success through POST /v1/jobs: tests/e2e/test_llamafactory_examples.py (a representative
set, in CI) and bench/llamafactory_examples.py (every example, one stack)."""

from __future__ import annotations

import pytest
import yaml

from shared.specs.train_spec import validate_train_spec
from tests.integration.trainer.trainer_process import EXAMPLES, adapted_example, example_names

FOUND = example_names()
pytestmark = pytest.mark.skipif(not FOUND, reason=f"LLaMA-Factory examples not found at {EXAMPLES}")


def test_the_examples_cover_every_stage_and_method():
    configs = [yaml.safe_load((EXAMPLES / e).read_text()) for e in FOUND]
    assert {c["stage"] for c in configs} >= {"sft", "pt", "dpo", "kto", "rm"}
    assert {c["finetuning_type"] for c in configs} >= {"lora", "full"}
    assert any(c.get("quantization_bit") for c in configs) and any(c.get("deepspeed") for c in configs)


@pytest.mark.parametrize("example", FOUND)
def test_example_is_accepted_as_written(example, tiny_model_dir):
    train = adapted_example(example, tiny_model_dir)
    checked = validate_train_spec(train)  # what POST /v1/jobs checks first
    assert checked["stage"] == train["stage"] and checked["max_steps"] == 2
