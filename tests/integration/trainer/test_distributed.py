"""Several ranks on CPU (gloo): resize on resume, stop agreement, DeepSpeed ZeRO under torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.trainer.trainer_process import (
    REFERENCE_LLAMAFACTORY,
    TrainerProcess,
    base_settings,
    max_abs_diff,
    run_trainer,
)
from worker.trainer.exit_codes import ExitCode

# The loss of a step is the mean over the same samples at any world size; only the order of
# floating-point sums may differ. Stated tolerance: 1e-4 relative (measured: 0.0 on CPU).
LOSS_TOLERANCE = 1e-4


def test_resume_one_rank_checkpoint_on_two_ranks_then_back_on_one(lora_runs, tmp_path):
    settings, reference, stopped = lora_runs.settings, lora_runs.reference, lora_runs.stopped
    max_steps = settings["max_steps"]
    stop = stopped.one("stopped")
    reference_loss = {e["step"]: e["loss"] for e in reference.of("progress")}

    # 1 -> 2 ranks, through the launcher, stopped again by SIGUSR1 sent to the launcher.
    two_ranks = TrainerProcess(
        tmp_path / "two-ranks", {**settings, "resume_from_checkpoint": stop["checkpoint"]}, nproc=2
    ).wait(stop_after_step=stop["step"] + 2, stop_by="signal")
    assert two_ranks.returncode == ExitCode.STOPPED_AFTER_CHECKPOINT, two_ranks.log_tail()
    started = two_ranks.one("started")
    assert started["world_size"] == 2 and started["step"] == stop["step"]
    # Global batch kept (2 per device x 2 accumulation x 1 rank = 4): accumulation halves.
    assert started["global_batch_size"] == 4 and started["gradient_accumulation_steps"] == 1
    assert started["batch_source"] == "checkpoint"
    second_stop = two_ranks.one("stopped")
    assert two_ranks.progress_steps() == list(range(stop["step"] + 1, second_stop["step"] + 1))
    for event in two_ranks.of("progress"):
        expected = reference_loss[event["step"]]
        assert abs(event["loss"] - expected) <= LOSS_TOLERANCE * abs(expected), (event["step"], event["loss"], expected)
        # Each rank's communication latency (the per-step all-reduce), for the comm_jitter rule.
        assert len(event["comm_latency_us"]) == 2 and all(v > 0 for v in event["comm_latency_us"]), event
    assert (two_ranks.output_dir / f"checkpoint-{second_stop['step']}" / "rng_state_1.pth").is_file()
    # Non-padding tokens seen: every rank's count added up at the log points (token_count.py), the
    # same samples per step at any world size, so the same numbers as the one-rank run at every step.
    reference_tokens = _tokens_by_step(reference.output_dir / "trainer_state.json")
    two_rank_tokens = _tokens_by_step(two_ranks.output_dir / f"checkpoint-{second_stop['step']}" / "trainer_state.json")
    assert set(range(stop["step"] + 1, second_stop["step"] + 1)) <= set(two_rank_tokens)
    assert all(two_rank_tokens[s] == reference_tokens[s] for s in two_rank_tokens), (two_rank_tokens, reference_tokens)

    # 2 -> 1 rank: back to accumulation 2, finish, and land on the reference weights.
    finish = run_trainer(tmp_path / "one-rank", {**settings, "resume_from_checkpoint": second_stop["checkpoint"]})
    assert finish.returncode == ExitCode.SUCCEEDED, finish.log_tail()
    assert finish.one("started")["gradient_accumulation_steps"] == 2
    assert all("comm_latency_us" not in e for e in finish.of("progress"))  # one rank: nothing to measure
    assert finish.progress_steps() == list(range(second_stop["step"] + 1, max_steps + 1))
    for event in finish.of("progress"):
        expected = reference_loss[event["step"]]
        assert abs(event["loss"] - expected) <= LOSS_TOLERANCE * abs(expected)
    diff = max_abs_diff(
        reference.output_dir / "adapter_model.safetensors", finish.output_dir / "adapter_model.safetensors"
    )
    assert diff <= 1e-6


def _tokens_by_step(trainer_state: Path) -> dict[int, int]:
    history = json.loads(trainer_state.read_text())["log_history"]
    return {e["step"]: e["num_input_tokens_seen"] for e in history if "loss" in e and "num_input_tokens_seen" in e}


def test_resize_that_cannot_keep_the_global_batch_is_refused(lora_runs, tmp_path):
    # Global batch 4 cannot be split over 1 rank x 3 per device.
    run = run_trainer(
        tmp_path / "bad",
        {**lora_runs.settings, "per_device_train_batch_size": 3, "resume_from_checkpoint": lora_runs.checkpoint},
    )
    assert run.returncode == ExitCode.CONFIG_ERROR
    failed = run.one("failed")
    assert failed["errors"][0]["loc"] == ["train", "resume_from_checkpoint"]
    assert "global batch 4" in failed["error"] and "multiple of 3" in failed["error"]


ZERO_RUNS = {  # (DeepSpeed config, fine-tuning method, launcher)
    "zero3-full": ("ds_z3_config.json", "full", "torchrun"),  # LLaMA-Factory's qwen3_full_sft.yaml setup
    "zero2-lora": ("ds_z2_config.json", "lora", "launch"),
}


@pytest.fixture(scope="module")
def zero_runs(tiny_model_dir, tmp_path_factory):
    """Both DeepSpeed runs (2 ranks each, 2 steps), one after the other: four ranks at once on two
    cores once aborted a ZeRO-3 rank (SIGABRT) in CI."""
    configs = REFERENCE_LLAMAFACTORY.resolve() / "examples" / "deepspeed"
    if not configs.is_dir():
        pytest.skip(f"LLaMA-Factory's DeepSpeed configs not found in {configs}")
    root = tmp_path_factory.mktemp("zero")

    def run(name: str):
        zero_config, method, launcher = ZERO_RUNS[name]
        settings = base_settings(
            tiny_model_dir,
            finetuning_type=method,
            learning_rate=1.0e-4,
            max_steps=2,
            deepspeed=str(configs / zero_config),
        )
        return lambda: run_trainer(root / name, settings, nproc=2, launcher=launcher, timeout=600)

    return {name: run(name)() for name in ZERO_RUNS}


@pytest.mark.parametrize("name", ZERO_RUNS)
def test_deepspeed_zero_on_two_ranks(zero_runs, tiny_model_dir, name):
    method = ZERO_RUNS[name][1]
    run = zero_runs[name]
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    assert run.one("started")["world_size"] == 2
    assert run.one("succeeded")["step"] == 2
    checkpoint = run.output_dir / "checkpoint-2"
    assert (checkpoint / "global_step2").is_dir(), "DeepSpeed's partitioned state is missing from the checkpoint"

    from safetensors.torch import load_file

    weights = "model.safetensors" if method == "full" else "adapter_model.safetensors"
    trained = load_file(run.output_dir / weights)
    if method == "full":
        base = load_file(tiny_model_dir / "model.safetensors")
        assert any(not trained[key].equal(base[key]) for key in base), "ZeRO-3 saved untrained weights"
    else:
        # LoRA's B matrices start at zero; training moved them.
        assert any(t.abs().max() > 0 for key, t in trained.items() if "lora_B" in key)
