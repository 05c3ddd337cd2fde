"""The attempt fence holds for the final model too, on a real trainer (heavy: run it under the shared lock).

A node is declared lost, the job's attempt 2 runs elsewhere on the same shared folder and finishes:
its final adapter and trainer_state.json are in `output/`. The partitioned attempt 1 then finishes
its own training: its final save is refused (it fails, saying it was superseded) and attempt 2's
files stay byte for byte.
"""

from __future__ import annotations

import hashlib

from tests.integration.trainer.trainer_process import base_settings, run_trainer
from worker.trainer.exit_codes import ExitCode
from worker.trainer.fence import raise_fence

FINAL_FILES = ("adapter_model.safetensors", "adapter_config.json", "trainer_state.json")


def _digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FINAL_FILES}


def test_a_superseded_attempt_cannot_overwrite_the_final_model(tiny_model, tmp_path, monkeypatch):
    job = tmp_path / "job"
    output = job / "out"
    output.mkdir(parents=True)
    fence_file = job / "fence"
    # Attempt 2's final model, as it left it (written here, not trained: the stale run is the one under test).
    (output / "adapter_model.safetensors").write_bytes(b"attempt 2's adapter weights")
    (output / "adapter_config.json").write_text('{"attempt": 2}')
    (output / "trainer_state.json").write_text('{"global_step": 3, "attempt": 2}')
    before = _digests(output)
    raise_fence(fence_file, 2)

    monkeypatch.setenv("ADC_FENCE_FILE", str(fence_file))
    monkeypatch.setenv("ADC_ATTEMPT", "1")
    # No checkpoint at all (transformers would save one at the last step, and the checkpoint fence would
    # refuse that first), so only the final save writes into output/.
    stale = run_trainer(
        job, base_settings(tiny_model, max_steps=3, save_strategy="no", overwrite_output_dir=True, template="default")
    )

    assert stale.returncode != ExitCode.SUCCEEDED, stale.log_tail()
    assert stale.of("progress"), stale.log_tail()  # it trained: the refusal came at its final save
    assert not stale.of("succeeded"), stale.events[-3:]
    assert "superseded by attempt 2" in stale.of("failed")[-1]["error"], stale.events[-3:]
    assert _digests(output) == before, "a superseded attempt overwrote the job's final model"
    assert not list(output.glob("checkpoint-*"))
