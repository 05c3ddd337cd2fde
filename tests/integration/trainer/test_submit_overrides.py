"""`adc submit FILE key=value ...` overrides keys as `llamafactory-cli train FILE key=value` does:
the same train section as LLaMA-Factory's own `read_args` builds from the same file and arguments
(run in the trainer's environment, one process for every case)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from cli.job_commands import OverrideError, apply_overrides, flags_as_overrides
from shared.specs.job_spec import wrap_bare_llamafactory
from tests.integration.trainer.trainer_process import REPO
from worker.trainer.interpreter import trainer_python

CONFIG = {
    "model_name_or_path": "/models/base",
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "lora_target": "all",
    "dataset": "identity,alpaca_en_demo",
    "template": "qwen3_nothink",
    "learning_rate": 1.0e-4,
    "bf16": True,
    "max_samples": 1000,
    "output_dir": "saves/x",
}
CASES = [
    ["model_name_or_path=/models/mine", "dataset_dir=/data/my folder", "max_steps=200"],
    ["learning_rate=5e-5", "bf16=false", "lora_target=[q_proj,v_proj]", "num_train_epochs=3.0"],
    ['template="3"', "max_samples=", "lora_rank=null", "eval_steps=0x10"],
    ["do_train=True", "cutoff_len=1_024", "dataset=a,b", "lr_scheduler_kwargs={min_lr: 1e-6}"],
    ["learning_rate=1e-4", "learning_rate=2e-4"],  # the last one wins
]

# LLaMA-Factory's read_args with sys.argv as `llamafactory-cli train FILE ...` leaves it.
_LLAMAFACTORY = """
import json, sys
from llamafactory.hparams.parser import read_args
out = []
for case in json.loads(sys.argv[2]):
    sys.argv = ["llamafactory-cli", sys.argv[1], *case]
    out.append(read_args())
print(json.dumps(out))
"""


def test_overrides_give_the_train_section_llamafactory_cli_builds(tmp_path):
    config = tmp_path / "qwen3_lora_sft.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = subprocess.run(
        [trainer_python(), "-c", _LLAMAFACTORY, str(config), json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for case, expected in zip(CASES, theirs, strict=True):
        ours = apply_overrides(wrap_bare_llamafactory(dict(CONFIG), name="x"), case)
        assert ours == {"name": "x", "train": expected}, case
    assert theirs[1]["lora_target"] == ["q_proj", "v_proj"] and theirs[1]["bf16"] is False
    assert theirs[2]["template"] == "3" and theirs[2]["max_samples"] is None


def test_spec_fields_set_the_spec_and_other_keys_the_train_section():
    doc = {"name": "job", "gpus": 1, "train": {"stage": "sft", "max_steps": 10, "lora_target": ["q_proj"]}}
    out = apply_overrides(
        doc, ["gpus=2", "priority=high", "train.max_steps=5", "cutoff_len=128", "lora_target=[k_proj]"]
    )
    assert out == {
        "name": "job",
        "gpus": 2,
        "priority": "high",
        "train": {"stage": "sft", "max_steps": 5, "lora_target": ["k_proj"], "cutoff_len": 128},
    }
    assert doc["train"]["max_steps"] == 10  # the file's document is not changed in place


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("output_dir=${oc.env:HOME}", "output_dir: interpolation"),
        ("max_steps", "'max_steps' is not key=value"),
        ("=3", "is not key=value"),
    ],
)
def test_bad_overrides_are_refused_naming_them(override, message):
    with pytest.raises(OverrideError, match=message.replace("(", r"\(").replace("$", r"\$")):
        apply_overrides({"name": "x", "train": {}}, [override])


def test_cli_submit_refuses_an_interpolation_before_calling_the_api(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = subprocess.run(
        [sys.executable, "-m", "cli", "submit", str(config), "dataset_dir=${x}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "ADC_API_URL": "http://127.0.0.1:9"},
    )
    assert done.returncode == 2 and "dataset_dir: interpolation" in done.stderr


def test_llamafactory_flags_are_overrides_like_key_value():
    """`--key value`, `--key=value` and a bare `--flag` (HfArgumentParser's true) read as key=value; submit's
    own options keep their meaning wherever they stand."""
    argv = ["submit", "c.yaml", "--learning_rate", "1e-4", "--wait", "--do_eval", "--name", "x", "--bf16=false"]
    argv += ["-o", "json", "--lora_target", "q_proj,v_proj", "--plot_loss"]
    assert flags_as_overrides(argv) == [
        "submit",
        "c.yaml",
        "learning_rate=1e-4",
        "--wait",
        "do_eval=true",
        "--name",
        "x",
        "bf16=false",
        "-o",
        "json",
        "lora_target=q_proj,v_proj",
        "plot_loss=true",
    ]
    overrides = [item for item in flags_as_overrides(argv) if "=" in item]
    train = apply_overrides(wrap_bare_llamafactory(dict(CONFIG), name="x"), overrides)["train"]
    assert (train["learning_rate"], train["do_eval"], train["bf16"], train["plot_loss"]) == (1e-4, True, False, True)
    assert train["lora_target"] == "q_proj,v_proj"
    assert flags_as_overrides(["jobs", "--status", "x"]) == ["jobs", "--status", "x"]  # other verbs untouched


def test_cli_submit_of_several_files_asks_for_a_chain(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = subprocess.run(
        [sys.executable, "-m", "cli", "submit", str(config), str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "ADC_API_URL": "http://127.0.0.1:9"},
    )
    assert done.returncode == 2 and "add --chain" in done.stderr
