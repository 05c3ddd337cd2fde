"""Every LLaMA-Factory example YAML in ../shared/llamafactory/examples trains to success through ADC's
trainer, with only the model, the dataset folder, a step cap and bf16 changed; the api's validator
accepts each one as it is written there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from shared.train_spec import validate_train_spec
from tests.integration.trainer.trainer_process import REFERENCE_LLAMAFACTORY, run_trainer
from worker.trainer.exit_codes import ExitCode

EXAMPLES = REFERENCE_LLAMAFACTORY.resolve() / "examples"
FOUND = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")) if EXAMPLES.is_dir() else []
pytestmark = pytest.mark.skipif(not FOUND, reason=f"LLaMA-Factory examples not found at {EXAMPLES}")
# Each example costs about a minute on CI's two cores (LLaMA-Factory's import, 16 preprocessing
# workers, its 2048-token cutoff): CI trains the canonical one, ADC_TRAIN_EXAMPLES=all trains them all.
CI_TRAINED = {"train_lora/qwen3_lora_sft.yaml"}
TRAIN_ALL = os.environ.get("ADC_TRAIN_EXAMPLES") == "all"


def adapted(example: str, model_dir: Path) -> dict:
    train = yaml.safe_load((EXAMPLES / example).read_text())
    train.update(model_name_or_path=str(model_dir), dataset_dir=str(REFERENCE_LLAMAFACTORY.resolve() / "data"),
                 max_steps=2, bf16=False)
    train.pop("output_dir")  # the worker gives every job its own output folder
    if isinstance(train.get("deepspeed"), str):  # relative to LLaMA-Factory's root, as its README runs them
        train["deepspeed"] = str(REFERENCE_LLAMAFACTORY.resolve() / train["deepspeed"])
    return train


def test_the_examples_cover_every_stage_and_method():
    configs = [yaml.safe_load((EXAMPLES / e).read_text()) for e in FOUND]
    assert {c["stage"] for c in configs} >= {"sft", "pt", "dpo", "kto", "rm"}
    assert {c["finetuning_type"] for c in configs} >= {"lora", "full"}
    assert any(c.get("quantization_bit") for c in configs) and any(c.get("deepspeed") for c in configs)


@pytest.mark.parametrize("example", FOUND)
def test_example_is_accepted_and_trains(example, tiny_model_dir, tmp_path):
    train = adapted(example, tiny_model_dir)
    validate_train_spec(train)  # what POST /v1/jobs checks first
    if example not in CI_TRAINED and not TRAIN_ALL:
        pytest.skip("trained with ADC_TRAIN_EXAMPLES=all")
    run = run_trainer(tmp_path / "job", train, timeout=600)
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail(60)
    assert run.one("succeeded")["step"] == 2
    assert (run.output_dir / "trainer_state.json").is_file() and (run.output_dir / "all_results.json").is_file()
