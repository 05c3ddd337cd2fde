"""The token ids and labels an ADC job trains on are LLaMA-Factory's own: for several templates, for
alpaca and sharegpt tool-call data (sft) and for preference pairs (dpo), the tokenized dataset the
job saved (`tokenized_path`) equals what LLaMA-Factory's preprocessing builds with no ADC code.
The three jobs run at once; one LLaMA-Factory process then builds all three references."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.trainer.trainer_process import (
    REFERENCE_LLAMAFACTORY,
    REPO,
    base_settings,
    in_parallel,
    run_trainer,
)
from worker.trainer.exit_codes import ExitCode
from worker.trainer.interpreter import trainer_python

DATA = REFERENCE_LLAMAFACTORY.resolve() / "data"
pytestmark = pytest.mark.skipif(not (DATA / "dpo_en_demo.json").is_file(), reason=f"LLaMA-Factory data not in {DATA}")
CASES = [  # (template, stage, datasets)
    ("qwen3_nothink", "sft", "alpaca_en_demo,glaive_toolcall_en_demo"),
    ("llama3", "sft", "identity,glaive_toolcall_en_demo"),
    ("default", "dpo", "dpo_en_demo"),
]


@pytest.fixture(scope="module")
def compared(tiny_model_dir, tmp_path_factory) -> dict:
    """case -> (ADC's run, the comparison with LLaMA-Factory's own preprocessing)."""
    root = tmp_path_factory.mktemp("fidelity")
    settings = {
        case: base_settings(
            tiny_model_dir,
            template=case[0],
            stage=case[1],
            dataset=case[2],
            dataset_dir=str(DATA),
            max_samples=12,
            cutoff_len=256,
            max_steps=1,
            tokenized_path=str(root / f"tokenized-{i}"),
        )
        for i, case in enumerate(CASES)
    }
    runs = in_parallel(
        *(lambda i=i, case=case: run_trainer(root / f"job-{i}", settings[case]) for i, case in enumerate(CASES))
    )
    (root / "cases.json").write_text(json.dumps([[settings[case], settings[case]["tokenized_path"]] for case in CASES]))
    done = subprocess.run(
        [trainer_python(), str(REPO / "tests/integration/trainer/llamafactory_reference.py"), str(root / "cases.json")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {case: (run, result) for case, run, result in zip(CASES, runs, results, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=["-".join(c[:2]) for c in CASES])
def test_job_trains_on_llamafactorys_own_encoding(compared, case):
    run, result = compared[case]
    assert run.returncode == ExitCode.SUCCEEDED, run.log_tail()
    assert result["rows"] == result["adc_rows"] > 0 and result["mismatched_rows"] == []
    expected = (
        {"input_ids", "labels"}
        if case[1] == "sft"
        else {"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"}
    )
    assert expected <= set(result["columns"])
