"""Training methods, data formats, precision and failure outcomes, each through a real run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.integration.trainer.trainer_process import base_settings, run_trainer
from worker.trainer.exit_codes import ExitCode


def test_freeze_pretraining_on_c4_with_gradient_checkpointing(tiny_model_dir, tmp_path):
    settings = base_settings(
        tiny_model_dir, stage="pt", dataset="c4_demo", finetuning_type="freeze", freeze_trainable_layers=1,
        gradient_checkpointing=True, max_steps=3, learning_rate=1.0e-3, cutoff_len=128,
    )
    run = run_trainer(tmp_path / "freeze-pt", settings)
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    started = run.one("started")
    # c4 texts are packed into blocks of cutoff_len tokens: many more blocks than the 64 records.
    assert started["samples"] > 64

    from safetensors.torch import load_file

    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    trained = load_file(run.output_dir / "model.safetensors")
    changed = {name for name in base if not base[name].equal(trained[name])}
    # Only the last of the two decoder layers was trainable.
    assert changed and all(name.startswith("model.layers.1.") for name in changed), changed
    assert started["trainable_parameters"] == sum(base[n].numel() for n in base if n.startswith("model.layers.1."))


def test_sharegpt_and_alpaca_mixed_with_named_template_in_bf16(tiny_model_dir, tmp_path):
    settings = base_settings(
        tiny_model_dir, dataset="identity,alpaca_en_demo,glaive_toolcall_en_demo", max_samples=8,
        template="qwen3_nothink", bf16=True, max_steps=2, cutoff_len=96,
    )
    run = run_trainer(tmp_path / "mix", settings)
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    started = run.one("started")
    assert started["samples"] == 24 and started["dropped_records"] == {}
    progress = run.of("progress")
    assert [e["step"] for e in progress] == [1, 2]
    for event in progress:
        assert math.isfinite(event["loss"]) and event["tokens_per_s"] > 0 and event["samples_per_s"] > 0
        assert event["step_time_s"] > 0 and event["peak_memory_bytes"] > 0 and event["max_steps"] == 2
    assert (run.output_dir / "adapter_model.safetensors").is_file()


def test_fp16_on_cpu_is_refused_naming_the_key(tiny_model_dir, tmp_path):
    run = run_trainer(tmp_path / "fp16", base_settings(tiny_model_dir, fp16=True))
    assert run.returncode == ExitCode.CONFIG_ERROR
    failed = run.one("failed")
    assert failed["errors"] == [{"loc": ["train", "fp16"], "msg": failed["errors"][0]["msg"]}]
    assert "needs a CUDA GPU" in failed["error"] and "bf16" in failed["error"]


def test_invalid_train_section_reports_every_problem(tiny_model_dir, tmp_path):
    settings = base_settings(tiny_model_dir, stage="dpo", lora_rank="eight", eval_steps=10)
    run = run_trainer(tmp_path / "invalid", settings)
    assert run.returncode == ExitCode.CONFIG_ERROR
    locations = {tuple(error["loc"]) for error in run.one("failed")["errors"]}
    assert locations == {("train", "stage"), ("train", "lora_rank"), ("train", "eval_steps")}


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.skipif(Path("/proc/sys/vm/overcommit_memory").exists()
                    and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
                    reason="with vm.overcommit_memory=1 the kernel kills instead of refusing an allocation")
def test_out_of_memory_exits_76_with_the_last_checkpoint(lora_reference_and_stopped, tmp_path):
    settings, _, stopped = lora_reference_and_stopped
    checkpoint = stopped.one("stopped")["checkpoint"]
    # One packed sequence so long that eager attention's L x L mask exceeds twice this host's RAM:
    # the allocator refuses at once (a real out-of-memory, no fault injection).
    length = int(math.sqrt(2 * _ram_bytes())) + 1
    data = tmp_path / "data"
    data.mkdir()
    words = " ".join(["fox"] * length)
    (data / "long.jsonl").write_text(json.dumps({"text": words}) + "\n")
    (data / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.jsonl", "columns": {"prompt": "text"}}}))
    run = run_trainer(tmp_path / "oom", {
        **settings, "stage": "pt", "dataset": "long", "dataset_dir": str(data), "cutoff_len": length,
        "flash_attn": "disabled", "per_device_train_batch_size": 1, "max_steps": -1,
        "resume_from_checkpoint": checkpoint,
    })
    assert run.returncode == ExitCode.OUT_OF_MEMORY, run.log_tail()
    oom = run.one("oom")
    assert oom["last_checkpoint"] == checkpoint
    assert "allocate" in oom["error"]
