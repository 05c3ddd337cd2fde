from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.trainer.trainer_process import TrainerProcess, TrainerRun, base_settings


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from worker.trainer.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@dataclass
class LoraRuns:
    settings: dict
    reference: TrainerRun  # uninterrupted
    stopped: TrainerRun  # the same run stopped through the stop file after step 3
    resumed: TrainerProcess  # resumed from the stop checkpoint (save_total_limit 2): started, not awaited

    @property
    def checkpoint(self) -> str:
        return self.stopped.one("stopped")["checkpoint"]


@pytest.fixture(scope="session")
def lora_runs(tmp_path_factory, tiny_model_dir) -> LoraRuns:
    """An uninterrupted LoRA run and the same run stopped through the stop file, side by side; the
    resume from the stop is started at once and left running for the test that checks it. Shared by
    the bit-exact resume, the 1 -> 2 -> 1 rank resume and the out-of-memory tests."""
    root = tmp_path_factory.mktemp("lora")
    settings = base_settings(tiny_model_dir)
    reference = TrainerProcess(root / "reference", settings)
    stopped = TrainerProcess(root / "stopped", settings).wait(stop_after_step=3, stop_by="file")
    resumed = None
    if stopped.of("stopped"):
        resumed = TrainerProcess(
            root / "resumed",
            {**settings, "save_total_limit": 2, "resume_from_checkpoint": stopped.one("stopped")["checkpoint"]},
        )
    return LoraRuns(settings, reference.wait(), stopped, resumed)
