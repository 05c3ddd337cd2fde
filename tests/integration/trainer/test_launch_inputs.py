"""The worker's second look at a job's inputs from earlier jobs (`job://` at the api, an export's source):
each the output folder of a job whose folder names the same team, put read-only in the sandbox's view;
anything else refused, naming the key, whoever sent the start."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts.actions import NodeGpus
from shared.contracts.messages import Command
from shared.infra.config import parse_config
from tests.conftest import REPO_ROOT
from worker.launch_check import LaunchCheck, LaunchRefused


@pytest.fixture
def setup(tmp_path) -> tuple[LaunchCheck, Path, Path]:
    alpha, beta, storage = tmp_path / "alpha", tmp_path / "beta", tmp_path / "storage"
    (alpha / "base").mkdir(parents=True)
    (alpha / "base" / "config.json").write_text("{}")
    beta.mkdir()
    for job_id, team in (("jsft", "alpha"), ("jbeta", "beta"), ("jfull", "alpha")):
        output = storage / "jobs" / job_id / "output"
        output.mkdir(parents=True)
        (storage / "jobs" / job_id / "team").write_text(team)
        (output / ("config.json" if job_id == "jfull" else "adapter_config.json")).write_text("{}")
    tenancy = parse_config(
        {
            "tenancy": {
                "team_roots": {"alpha": [str(alpha)], "beta": [str(beta)]},
                "shared_roots": [str(REPO_ROOT / "examples")],
            }
        },
        env={},
    ).tenancy
    return LaunchCheck(tenancy, data_root=tmp_path, storage_root=storage), alpha, storage / "jobs"


def start(train: dict) -> Command:
    return Command(
        kind="start", job_id="jnext", attempt=1, team="alpha", placement=[NodeGpus(node="n", gpus=[0])], train=train
    )


def sft(alpha: Path, **keys) -> dict:
    data = str(REPO_ROOT / "examples" / "data")
    return {"model_name_or_path": str(alpha / "base"), "dataset": "alpaca_en_demo", "dataset_dir": data, **keys}


def test_an_earlier_jobs_output_of_the_team_is_seen_read_only(setup):
    check, alpha, jobs = setup
    plan = check.plan(start(sft(alpha, adapter_name_or_path=str(jobs / "jsft" / "output"))))
    assert jobs / "jsft" / "output" in plan.readable
    plan = check.plan(start({"adc_export_of": "jfull", "model_name_or_path": str(jobs / "jfull" / "output")}))
    assert jobs / "jfull" / "output" in plan.readable  # a full job's model, exported


def test_another_teams_output_or_a_link_out_of_one_is_refused(setup):
    check, alpha, jobs = setup
    with pytest.raises(LaunchRefused, match="adapter_name_or_path: .* not the output of another job of team 'alpha'"):
        check.plan(start(sft(alpha, adapter_name_or_path=str(jobs / "jbeta" / "output"))))
    with pytest.raises(LaunchRefused, match="not the output folder of job 'jbeta' of team 'alpha'"):
        check.plan(start({"adc_export_of": "jbeta", "model_name_or_path": str(jobs / "jbeta" / "output")}))
    # A trainer of the earlier job left a link to beta's folder in its output: followed, it is outside.
    (jobs / "jsft" / "output" / "evil").symlink_to(jobs / "jbeta" / "output")
    with pytest.raises(LaunchRefused, match="not the output of another job of team 'alpha'"):
        check.plan(start(sft(alpha, adapter_name_or_path=str(jobs / "jsft" / "output" / "evil"))))
