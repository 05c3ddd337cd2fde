"""Checkpoint-stop and exact resume: the trainer's reason to exist.

Each case runs the real trainer three times on the tiny model: uninterrupted, stopped by the
worker's request mid-training, and resumed from the stop checkpoint. The resumed run must end
with weights bit-identical to the uninterrupted one (max abs diff 0.0 on CPU), and no
optimizer step may be lost or repeated. The cases' runs overlap (one module fixture), so CI's
two cores stay busy while one run imports or loads.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.trainer.trainer_process import (
    REFERENCE_LLAMAFACTORY,
    base_settings,
    in_parallel,
    max_abs_diff,
    run_trainer,
)
from worker.trainer.checkpoints import MANIFEST_NAME, STAGING_FOLDER
from worker.trainer.exit_codes import ExitCode


def assert_stopped_cleanly(stopped, max_steps: int) -> tuple[int, str]:
    assert stopped.returncode == ExitCode.STOPPED_AFTER_CHECKPOINT, stopped.log_tail()
    stop = stopped.one("stopped")
    step, checkpoint = stop["step"], stop["checkpoint"]
    assert 0 < step < max_steps
    # The stop checkpoint was announced complete before the stop, at the same step.
    announced = [e for e in stopped.of("checkpointed") if e["path"] == checkpoint]
    assert announced and announced[0]["step"] == step
    names = [e["event"] for e in stopped.events]
    assert names.index("checkpointed", names.index("started")) < names.index("stopped") == len(names) - 1
    # The stopping run took exactly `step` optimizer steps, each reported once.
    assert stopped.progress_steps() == list(range(1, step + 1))
    folder = stopped.output_dir / f"checkpoint-{step}"
    assert str(folder) == checkpoint and (folder / MANIFEST_NAME).is_file()
    assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step
    assert not list((stopped.output_dir / STAGING_FOLDER).glob("checkpoint-*")), "staging left behind"
    return step, checkpoint


def assert_resumed_without_loss(resumed, step: int, checkpoint: str, max_steps: int) -> None:
    assert resumed.returncode == ExitCode.SUCCEEDED, resumed.log_tail()
    started = resumed.one("started")
    assert started["step"] == step and started["resumed_from"] == checkpoint
    # First step after the stop is step+1: nothing lost, nothing repeated.
    assert resumed.progress_steps() == list(range(step + 1, max_steps + 1))
    assert resumed.one("succeeded")["step"] == max_steps


def test_lora_stop_by_file_and_resume_is_bit_identical(lora_runs):
    settings, reference, stopped = lora_runs.settings, lora_runs.reference, lora_runs.stopped
    max_steps = settings["max_steps"]
    assert reference.returncode == ExitCode.SUCCEEDED, reference.log_tail()
    assert reference.progress_steps() == list(range(1, max_steps + 1))
    step, checkpoint = assert_stopped_cleanly(stopped, max_steps)

    # save_total_limit only prunes checkpoints; it must not disturb the result.
    resumed = lora_runs.resumed.wait()
    assert_resumed_without_loss(resumed, step, checkpoint, max_steps)
    kept = sorted(p.name for p in resumed.output_dir.glob("checkpoint-*"))
    assert kept == ["checkpoint-15", "checkpoint-16"]
    assert [e["step"] for e in resumed.of("checkpointed")][-2:] == [15, 16]
    # Same losses step for step after the resume, to the bit.
    reference_loss = {e["step"]: e["loss"] for e in reference.of("progress")}
    assert all(e["loss"] == reference_loss[e["step"]] for e in resumed.of("progress"))
    diff = max_abs_diff(
        reference.output_dir / "adapter_model.safetensors", resumed.output_dir / "adapter_model.safetensors"
    )
    assert diff == 0.0


def _cases(model_dir) -> dict:
    """name -> (settings, stop by, weights file). QLoRA and DPO share one case (a 4-bit base under
    DPO): one uninterrupted run and one stop-resume chain prove both, at the cost of one."""
    data = REFERENCE_LLAMAFACTORY.resolve() / "data"
    # 4-bit steps are slow on CPU (no fused kernels): short sequences, one micro-batch per step.
    qlora = dict(quantization_bit=4, cutoff_len=32, gradient_accumulation_steps=1, max_steps=6, save_steps=100)
    if (data / "dpo_en_demo.json").is_file():
        qlora |= dict(
            stage="dpo",
            dataset="dpo_en_demo",
            dataset_dir=str(data),
            pref_beta=0.1,
            pref_loss="sigmoid",
            max_samples=24,
        )
    return {
        "full-sigusr1": (
            base_settings(model_dir, finetuning_type="full", learning_rate=1.0e-4, max_steps=6),
            "signal",
            "model.safetensors",
        ),
        "qlora-4bit-dpo": (base_settings(model_dir, **qlora), "file", "adapter_model.safetensors"),
    }


@pytest.fixture(scope="module")
def stop_resume(tiny_model_dir, tmp_path_factory) -> dict:
    """name -> (settings, reference, stopped, resumed) for every case: the uninterrupted runs and the
    stop-then-resume chains of all cases share the cores, two at a time."""
    root = tmp_path_factory.mktemp("stop-resume")
    cases = _cases(tiny_model_dir)

    def reference(name: str):
        return lambda: run_trainer(root / name / "reference", cases[name][0])

    def stop_then_resume(name: str):
        def run():
            settings, stop_by, _ = cases[name]
            stopped = run_trainer(root / name / "stopped", settings, stop_after_step=2, stop_by=stop_by)
            resumed = None
            if stopped.of("stopped"):
                resumed = run_trainer(
                    root / name / "resumed",
                    {**settings, "resume_from_checkpoint": stopped.one("stopped")["checkpoint"]},
                )
            return stopped, resumed

        return run

    results = in_parallel(*(stop_then_resume(name) for name in cases), *(reference(name) for name in cases))
    chains, references = results[: len(cases)], results[len(cases) :]
    return {name: (cases[name][0], ref, *chain) for name, chain, ref in zip(cases, chains, references, strict=True)}


@pytest.mark.parametrize("name", ["full-sigusr1", "qlora-4bit-dpo"])
def test_stop_and_resume_is_bit_identical(stop_resume, tiny_model_dir, name):
    settings, reference, stopped, resumed = stop_resume[name]
    weights = _cases(tiny_model_dir)[name][2]
    assert reference.returncode == ExitCode.SUCCEEDED, reference.log_tail()
    step, checkpoint = assert_stopped_cleanly(stopped, settings["max_steps"])
    manifest = json.loads((stopped.output_dir / f"checkpoint-{step}" / MANIFEST_NAME).read_text())
    assert manifest["stage"] == settings["stage"] and manifest["quantization_bit"] == settings.get("quantization_bit")
    assert_resumed_without_loss(resumed, step, checkpoint, settings["max_steps"])
    assert max_abs_diff(reference.output_dir / weights, resumed.output_dir / weights) == 0.0
    # Tokens are counted from the batches LLaMA-Factory builds for every stage (dpo: chosen and rejected).
    assert all(e["tokens_per_s"] > 0 for e in reference.of("progress")), reference.of("progress")


def test_resuming_from_a_checkpoint_at_max_steps_trains_nothing(tiny_model_dir, tmp_path):
    # 5 steps is not a whole epoch (16 here): transformers alone would take a 6th step on resume.
    settings = base_settings(tiny_model_dir, max_steps=5, save_steps=5)
    finished = run_trainer(tmp_path / "finished", settings)
    assert finished.returncode == ExitCode.SUCCEEDED, finished.log_tail()
    assert finished.progress_steps() == [1, 2, 3, 4, 5]
    checkpoint = finished.output_dir / "checkpoint-5"
    final = finished.output_dir / "adapter_model.safetensors"
    weights, written = final.read_bytes(), final.stat().st_mtime_ns

    # The finished job's own folder, as a requeue of a job whose exit was never recorded resumes it.
    again = run_trainer(
        tmp_path / "again",
        {**settings, "output_dir": str(finished.output_dir), "resume_from_checkpoint": str(checkpoint)},
    )
    assert again.returncode == ExitCode.SUCCEEDED, again.log_tail()
    assert again.progress_steps() == [] and again.of("checkpointed") == []
    assert again.one("started")["step"] == 5 and again.one("succeeded")["step"] == 5
    assert sorted(p.name for p in finished.output_dir.glob("checkpoint-*")) == ["checkpoint-5"]
    assert final.read_bytes() == weights and final.stat().st_mtime_ns == written, "the finished model was replaced"

    # The same folder with no resume named: LLaMA-Factory would resume from its newest checkpoint by itself.
    implicit = run_trainer(tmp_path / "implicit", {**settings, "output_dir": str(finished.output_dir)})
    assert implicit.returncode == ExitCode.SUCCEEDED, implicit.log_tail()
    assert implicit.progress_steps() == [] and implicit.one("succeeded")["step"] == 5
    assert final.read_bytes() == weights, "the finished model was replaced"

    # A folder without the final model gets the checkpoint's weights, which are the finished run's.
    fresh = run_trainer(tmp_path / "fresh", {**settings, "resume_from_checkpoint": str(checkpoint)})
    assert fresh.returncode == ExitCode.SUCCEEDED, fresh.log_tail()
    assert fresh.progress_steps() == [] and fresh.one("succeeded")["step"] == 5
    assert max_abs_diff(final, fresh.output_dir / "adapter_model.safetensors") == 0.0
    assert not list(fresh.output_dir.glob("checkpoint-*"))
