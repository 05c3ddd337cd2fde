"""LLaMA-Factory's methods, data formats, outputs and evaluation through ADC's trainer, and the
failure outcomes (hardware refusals, LLaMA-Factory's own refusals, out of memory)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.integration.trainer.trainer_process import base_settings, in_parallel, run_trainer
from worker.trainer.exit_codes import ExitCode


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict:
    """The module's independent trainer runs, all at once."""
    root = tmp_path_factory.mktemp("features")
    settings = {
        "freeze-pt": base_settings(
            tiny_model_dir,
            stage="pt",
            dataset="c4_demo",
            finetuning_type="freeze",
            freeze_trainable_layers=1,
            max_steps=3,
            learning_rate=1.0e-3,
            cutoff_len=128,
            template=None,
        ),
        "mix": base_settings(
            tiny_model_dir,
            dataset="identity,alpaca_en_demo,glaive_toolcall_en_demo",
            max_samples=8,
            template="qwen3_nothink",
            bf16=True,
            max_steps=4,
            cutoff_len=96,
            plot_loss=True,
            val_size=0.25,
            do_eval=True,
            eval_strategy="steps",
            eval_steps=2,
            per_device_eval_batch_size=2,
        ),
        "unknown-keys": base_settings(tiny_model_dir, lora_rnk=8, eval_stepz=10),
        # A ranking-free dataset for DPO: LLaMA-Factory refuses it while loading data, before step 1.
        "dpo-on-sft-data": base_settings(tiny_model_dir, stage="dpo"),
        "fp16-fp8": base_settings(tiny_model_dir, fp16=True, fp8=True),
        # LLaMA-Factory's nlg_eval example: generations scored with BLEU and ROUGE (its metrics extra).
        "predict-generate": {
            **base_settings(
                tiny_model_dir,
                do_train=False,
                do_predict=True,
                predict_with_generate=True,
                eval_dataset="alpaca_en_demo",
                max_samples=4,
                per_device_eval_batch_size=2,
                max_new_tokens=8,
            ),
            "dataset": None,
        },
    }
    return dict(
        zip(
            settings,
            in_parallel(*(lambda name=name: run_trainer(root / name, settings[name]) for name in settings)),
            strict=True,
        )
    )


def test_freeze_pretraining_on_c4(runs, tiny_model_dir):
    run = runs["freeze-pt"]
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    started = run.one("started")
    # LLaMA-Factory packs pt texts into blocks of cutoff_len tokens: more blocks than the 64 records.
    assert started["samples"] > 64

    from safetensors.torch import load_file

    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    trained = load_file(run.output_dir / "model.safetensors")
    changed = {name for name in base if not base[name].equal(trained[name])}
    # Only the last of the two decoder layers was trainable.
    assert changed and all(name.startswith("model.layers.1.") for name in changed), changed


def test_sharegpt_tools_and_alpaca_with_eval_give_every_llamafactory_output(runs):
    run = runs["mix"]
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    assert run.one("started")["samples"] == 18  # 24 records, a quarter held out for evaluation
    progress = run.of("progress")
    assert [e["step"] for e in progress] == [1, 2, 3, 4]
    for event in progress:
        assert math.isfinite(event["loss"]) and event["tokens_per_s"] > 0 and event["samples_per_s"] > 0
        assert event["step_time_s"] > 0 and event["peak_memory_bytes"] > 0 and event["max_steps"] == 4
    evaluated = run.of("evaluated")
    assert [e["step"] for e in evaluated][:2] == [2, 4] and all(
        math.isfinite(e["metrics"]["eval_loss"]) for e in evaluated
    )

    out = run.output_dir
    for name in (
        "adapter_model.safetensors",
        "trainer_log.jsonl",
        "all_results.json",
        "train_results.json",
        "eval_results.json",
        "trainer_state.json",
        "training_loss.png",
    ):
        assert (out / name).is_file(), name
    assert "eval_loss" in json.loads((out / "all_results.json").read_text())
    logged = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert [r["current_steps"] for r in logged if "loss" in r] == [1, 2, 3, 4]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)  # saved with LLaMA-Factory's template as chat template
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") or "<|im_start|>assistant" in text


def test_fp16_on_cpu_is_refused_naming_the_key(runs):
    run = runs["fp16-fp8"]
    assert run.returncode == ExitCode.CONFIG_ERROR
    failed = run.one("failed")
    assert {tuple(e["loc"]) for e in failed["errors"]} == {("train", "fp16"), ("train", "fp8")}
    assert "needs a CUDA GPU" in failed["error"] and "bf16" in failed["error"]


def test_llamafactorys_own_refusals_are_configuration_errors_naming_the_keys(runs):
    run = runs["unknown-keys"]
    assert run.returncode == ExitCode.CONFIG_ERROR, run.log_tail()
    assert {tuple(e["loc"]) for e in run.one("failed")["errors"]} == {("train", "lora_rnk"), ("train", "eval_stepz")}
    run = runs["dpo-on-sft-data"]
    assert run.returncode == ExitCode.CONFIG_ERROR, run.log_tail()
    assert "not applicable in the current training stage" in run.one("failed")["error"]


def test_predict_with_generate_scores_the_generations(runs):
    run = runs["predict-generate"]
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    predicted = run.one("evaluated")
    assert predicted["split"] == "predict"
    for metric in ("predict_bleu-4", "predict_rouge-1", "predict_rouge-l"):
        assert math.isfinite(predicted["metrics"][metric]), predicted
    rows = [json.loads(line) for line in (run.output_dir / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all({"prompt", "predict", "label"} <= set(r) for r in rows)


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.skipif(
    Path("/proc/sys/vm/overcommit_memory").exists()
    and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
    reason="with vm.overcommit_memory=1 the kernel kills instead of refusing an allocation",
)
def test_out_of_memory_exits_76_with_the_last_checkpoint(lora_runs, tmp_path):
    settings, checkpoint = lora_runs.settings, lora_runs.checkpoint
    # One packed sequence so long that eager attention's L x L mask exceeds twice this host's RAM:
    # the allocator refuses at once (a real out-of-memory, no fault injection).
    length = int(math.sqrt(2 * _ram_bytes())) + 1
    data = tmp_path / "data"
    data.mkdir()
    (data / "long.jsonl").write_text(json.dumps({"text": " ".join(["fox"] * length)}) + "\n")
    (data / "dataset_info.json").write_text(
        json.dumps({"long": {"file_name": "long.jsonl", "columns": {"prompt": "text"}}})
    )
    run = run_trainer(
        tmp_path / "oom",
        {
            **settings,
            "stage": "pt",
            "dataset": "long",
            "dataset_dir": str(data),
            "cutoff_len": length,
            "flash_attn": "disabled",
            "per_device_train_batch_size": 1,
            "max_steps": 20,
            "template": None,
            "resume_from_checkpoint": checkpoint,
        },
    )
    assert run.returncode == ExitCode.OUT_OF_MEMORY, run.log_tail()
    oom = run.one("oom")
    assert oom["last_checkpoint"] == checkpoint
    assert "allocate" in oom["error"]
