"""The token ids and labels an ADC job trains on are LLaMA-Factory's own: for several templates, for
alpaca and sharegpt tool-call data (sft) and for preference pairs (dpo), the tokenized dataset the
job saved (`tokenized_path`) equals what LLaMA-Factory's preprocessing builds with no ADC code."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.trainer.trainer_process import REFERENCE_LLAMAFACTORY, REPO, base_settings, run_trainer
from worker.trainer.exit_codes import ExitCode
from worker.trainer.interpreter import trainer_python

DATA = REFERENCE_LLAMAFACTORY.resolve() / "data"
pytestmark = pytest.mark.skipif(not (DATA / "dpo_en_demo.json").is_file(), reason=f"LLaMA-Factory data not in {DATA}")


@pytest.mark.parametrize(("template", "stage", "dataset"), [
    ("qwen3_nothink", "sft", "alpaca_en_demo,glaive_toolcall_en_demo"),
    ("llama3", "sft", "identity,glaive_toolcall_en_demo"),
    ("default", "dpo", "dpo_en_demo"),
])
def test_job_trains_on_llamafactorys_own_encoding(tiny_model_dir, tmp_path, template, stage, dataset):
    settings = base_settings(tiny_model_dir, template=template, stage=stage, dataset=dataset, dataset_dir=str(DATA),
                             max_samples=12, cutoff_len=256, max_steps=1, tokenized_path=str(tmp_path / "tokenized"))
    run = run_trainer(tmp_path / "job", settings)
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    (tmp_path / "train.json").write_text(json.dumps(settings))
    done = subprocess.run([trainer_python(), str(REPO / "tests/integration/trainer/llamafactory_reference.py"),
                           str(tmp_path / "train.json"), str(tmp_path / "tokenized")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] == result["adc_rows"] > 0 and result["mismatched_rows"] == []
    expected = {"input_ids", "labels"} if stage == "sft" else {"chosen_input_ids", "chosen_labels",
                                                                "rejected_input_ids", "rejected_labels"}
    assert expected <= set(result["columns"])
