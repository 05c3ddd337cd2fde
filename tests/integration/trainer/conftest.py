from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.trainer.trainer_process import TrainerProcess, base_settings


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from worker.trainer.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def lora_reference_and_stopped(tmp_path_factory, tiny_model_dir):
    """An uninterrupted LoRA run and the same run stopped through the stop file, run side by side.
    Shared by the bit-exact resume test and the 1 -> 2 rank resume test."""
    root = tmp_path_factory.mktemp("lora")
    settings = base_settings(tiny_model_dir)
    reference = TrainerProcess(root / "reference", settings)
    stopped = TrainerProcess(root / "stopped", settings)
    stopped_run = stopped.wait(stop_after_step=3, stop_by="file")
    reference_run = reference.wait()
    return settings, reference_run, stopped_run
