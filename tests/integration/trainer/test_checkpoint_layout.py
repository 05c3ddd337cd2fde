"""checkpoints.py, batch_geometry.py, events.py, launch.py: the pure parts of the contract."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from worker.trainer import checkpoints
from worker.trainer.batch_geometry import BatchGeometryError, plan_batch
from worker.trainer.events import EventWriter, read_events
from worker.trainer.exit_codes import ExitCode
from worker.trainer.interpreter import trainer_python
from worker.trainer.launch import combine_exit_codes

REPO = Path(__file__).resolve().parents[3]


def stage(output_dir, step: int, files=("model.safetensors", "trainer_state.json")):
    staged = checkpoints.staging_root(output_dir) / checkpoints.checkpoint_name(step)
    staged.mkdir(parents=True)
    for name in files:
        (staged / name).write_text(name)
    return staged


def test_publish_makes_a_complete_checkpoint_appear_in_one_rename(tmp_path):
    staged = stage(tmp_path, 5)
    assert checkpoints.latest_complete_checkpoint(tmp_path) is None
    final = checkpoints.publish(staged, tmp_path, {"step": 5, "global_batch_size": 8})
    assert final == tmp_path / "checkpoint-5" and not staged.exists()
    assert checkpoints.is_complete(final)
    assert checkpoints.read_manifest(final) == {"step": 5, "global_batch_size": 8}
    assert (final / "model.safetensors").read_text() == "model.safetensors"


def test_incomplete_folders_are_never_picked(tmp_path):
    checkpoints.publish(stage(tmp_path, 3), tmp_path, {"step": 3})
    (tmp_path / "checkpoint-9").mkdir()  # written in place by something else: no manifest
    stage(tmp_path, 12)  # still staging
    (tmp_path / "checkpoint-x").mkdir()
    assert checkpoints.latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-3"
    checkpoints.clear_staging(tmp_path)
    assert not checkpoints.staging_root(tmp_path).exists()


def test_republishing_a_step_replaces_the_old_folder(tmp_path):
    checkpoints.publish(stage(tmp_path, 4, files=("old",)), tmp_path, {"step": 4, "run": 1})
    checkpoints.publish(stage(tmp_path, 4, files=("new",)), tmp_path, {"step": 4, "run": 2})
    final = tmp_path / "checkpoint-4"
    assert (final / "new").exists() and not (final / "old").exists()
    assert checkpoints.read_manifest(final)["run"] == 2


def test_prune_keeps_the_newest_and_the_protected(tmp_path):
    for step in (2, 4, 6, 8):
        checkpoints.publish(stage(tmp_path, step), tmp_path, {"step": step})
    removed = checkpoints.prune(tmp_path, keep=2, protect={tmp_path / "checkpoint-2"})
    assert [p.name for p in removed] == ["checkpoint-4"]
    assert [p.name for p in checkpoints.complete_checkpoints(tmp_path)] == [
        "checkpoint-2",
        "checkpoint-6",
        "checkpoint-8",
    ]
    assert checkpoints.prune(tmp_path, keep=None) == []


SPEC = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "max_steps": -1,
    "adc_global_batch_size": None,
}


@pytest.mark.parametrize(
    ("world", "manifest", "extra", "expected_ga", "source"),
    [
        (1, None, {}, 4, "spec"),
        (2, None, {}, 4, "spec"),  # as written: global batch grows with the world
        (2, {"global_batch_size": 8}, {}, 2, "checkpoint"),
        (4, {"global_batch_size": 8}, {}, 1, "checkpoint"),
        (1, {"global_batch_size": 16}, {}, 8, "checkpoint"),
        (2, None, {"adc_global_batch_size": 32}, 8, "adc_global_batch_size"),
        (2, {"global_batch_size": 8}, {"adc_global_batch_size": 32}, 2, "checkpoint"),
    ],
)
def test_gradient_accumulation_keeps_the_global_batch(world, manifest, extra, expected_ga, source):
    plan = plan_batch({**SPEC, **extra}, world, manifest)
    assert (plan.gradient_accumulation_steps, plan.source) == (expected_ga, source)
    assert plan.global_batch == plan.per_device * plan.gradient_accumulation_steps * world


def test_resume_keeps_the_checkpoint_schedule_unless_max_steps_is_given():
    assert plan_batch(SPEC, 1, {"global_batch_size": 8, "max_steps": 40}).max_steps == 40
    assert plan_batch({**SPEC, "max_steps": 50}, 1, {"global_batch_size": 8, "max_steps": 40}).max_steps == 50


def test_a_global_batch_that_cannot_be_split_is_refused_with_the_numbers():
    with pytest.raises(BatchGeometryError) as caught:
        plan_batch(SPEC, 3, {"global_batch_size": 8})
    assert caught.value.key == "resume_from_checkpoint"
    assert "global batch 8" in str(caught.value) and "multiple of 6" in str(caught.value)


def test_events_are_whole_json_lines_from_rank_zero_and_failures_from_any(tmp_path):
    path = tmp_path / "events.jsonl"
    rank0, rank1 = EventWriter(path, rank=0), EventWriter(path, rank=1)
    rank0.emit("progress", step=1, loss=float("nan"))
    rank1.emit("progress", step=1, loss=1.0)  # not rank 0: dropped
    rank1.emit_from_any_rank("oom", error="boom", last_checkpoint=None)
    with open(path, "a") as torn:
        torn.write('{"event": "prog')  # a writer killed mid-line
    events = read_events(path)
    assert [e["event"] for e in events] == ["progress", "oom"]
    assert events[0]["loss"] is None and isinstance(events[0]["ts"], float)
    assert events[1]["rank"] == 1
    assert all(line.endswith("}") for line in path.read_text().splitlines()[:2])


def test_exit_codes_are_the_documented_numbers():
    assert {c.name: int(c) for c in ExitCode} == {
        "SUCCEEDED": 0,
        "FAILED": 1,
        "CONFIG_ERROR": 2,
        "STOPPED_AFTER_CHECKPOINT": 75,
        "OUT_OF_MEMORY": 76,
    }
    assert ExitCode.describe(75) == "STOPPED_AFTER_CHECKPOINT" and ExitCode.describe(-9) == "KILLED_BY_SIGNAL_9"


@pytest.mark.parametrize(
    ("codes", "combined"),
    [
        ([0, 0], 0),
        ([75, 75], 75),
        ([75, 0], 75),
        ([76, -15], 76),
        ([2, 2], 2),
        ([1, 75], 1),
        ([-9, 0], 1),
    ],
)
def test_launcher_combines_rank_exit_codes(codes, combined):
    assert combine_exit_codes(codes) == combined


def test_manifest_is_plain_json(tmp_path):
    final = checkpoints.publish(stage(tmp_path, 1), tmp_path, {"step": 1})
    assert json.loads((final / checkpoints.MANIFEST_NAME).read_text()) == {"step": 1}
    assert not any(name.endswith(".tmp") for name in os.listdir(final))


def test_keys_a_cpu_node_cannot_honour_are_refused_by_name():
    from worker.trainer.device_limits import refusals

    args = {
        "fp16": True,
        "fp8": True,
        "quantization_bit": 4,
        "quantization_method": "hqq",
        "flash_attn": "fa3",
        "predict_with_generate": True,
        "use_galore": True,
        "bf16": True,
    }
    errors = {
        e["loc"][-1]: e["msg"]
        for e in refusals(args, cuda=False, bf16_gpu=False, installed=lambda name: name == "nltk")
    }
    assert set(errors) == {"fp16", "fp8", "quantization_method", "flash_attn", "predict_with_generate", "use_galore"}
    assert "jieba, rouge-chinese" in errors["predict_with_generate"] and "nltk" not in errors["predict_with_generate"]
    assert (
        refusals(
            {"quantization_bit": 4, "bf16": True, "flash_attn": "fa2"},
            cuda=False,
            bf16_gpu=False,
            installed=lambda name: False,
        )
        == []
    )  # bitsandbytes 4-bit and bf16 run on CPU; fa2 falls back to the default attention, as in LLaMA-Factory


def test_keys_that_cannot_run_here_say_why():
    from worker.trainer.device_limits import refusals

    def errors(args, cuda=False, installed=lambda name: False):
        return {e["loc"][-1]: e["msg"] for e in refusals(args, cuda=cuda, bf16_gpu=cuda, installed=installed)}

    assert "needs a CUDA GPU" in errors({"use_kt": True})["use_kt"]  # KTransformers: CPU experts beside a GPU
    assert "transformers-kt" in errors({"use_kt": True}, cuda=True)["use_kt"]
    assert errors({"use_kt": True}, cuda=True, installed=lambda name: True) == {}
    assert "TRANSFORMERS_CACHE" in errors({"mixture_of_depths": "convert"})["mixture_of_depths"]
    # LLaMA-Factory's optimizer extras are in the trainer environment (requirements.txt): nothing to refuse.
    check = (
        "from worker.trainer.device_limits import refusals; from worker.trainer.training_run import _installed; "
        "print(refusals({'use_galore': 1, 'use_apollo': 1, 'use_badam': 1, 'use_adam_mini': 1}, False, False, "
        "_installed))"
    )
    done = subprocess.run(
        [trainer_python(), "-c", check],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_llamafactorys_internal_names_are_mapped_to_the_key():
    from worker.trainer.training_run import _config_error

    message = "ValueError: `num_layers` 2 should be divisible by `num_layer_trainable` 8."
    error = _config_error(message, {"use_llama_pro": True, "freeze_trainable_layers": 8})
    assert error.errors[0]["loc"] == ["train", "freeze_trainable_layers"]
    assert str(error).startswith("freeze_trainable_layers: ValueError")


def test_a_refusal_quoting_a_keys_value_names_that_key():
    from worker.trainer.training_run import _located

    message = "ValueError: Can't find 'adapter_config.json' at '/data/saves/llama3-8b/lora/sft'."
    args = {"stage": "sft", "adapter_name_or_path": "/data/saves/llama3-8b/lora/sft", "template": "llama3"}
    assert [e["loc"] for e in _located(message, args)] == [["train", "adapter_name_or_path"]]
    assert [e["loc"] for e in _located("something else broke", args)] == [["train"]]
    from worker.trainer.training_run import _config_error

    assert str(_config_error(message, args)).startswith("adapter_name_or_path: ValueError")  # the job's reason
