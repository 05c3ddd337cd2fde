"""A hostile tenant's paths, through the real api on the real Postgres and NATS.

Team alpha owns <teams>/alpha, team beta <teams>/beta; every team reads <teams>/shared, and
<teams>/shared/trusted is where a model's own Python may run. Each attack is refused with 422
naming the field, and the answer for a path outside alpha's folders is the same whether or not
the path exists.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.api.conftest import serving_api

ALPACA = {"alpaca": {"file_name": "alpaca.json"}}
RECORDS = [{"instruction": "say hi", "input": "", "output": "hi"}]


def _dataset(folder: Path, registry: dict, files: dict[str, list] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_info.json").write_text(json.dumps(registry))
    for name, rows in (files or {"alpaca.json": RECORDS}).items():
        (folder / name).write_text(json.dumps(rows))
    return folder


def _model(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def teams(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("teams")
    _dataset(root / "alpha" / "data", ALPACA | {"escape": {"file_name": "../../beta/data/secret.json"},
                                                "absolute": {"file_name": str(root / "beta" / "data" / "secret.json")}})
    _model(root / "alpha" / "models" / "plain", model_type="llama")
    _model(root / "alpha" / "models" / "custom", model_type="evil", auto_map={"AutoModel": "modeling_evil.Evil"})
    (root / "alpha" / "models" / "custom" / "modeling_evil.py").write_text("import os; os.system('id')\n")
    _model(root / "shared" / "models" / "plain", model_type="llama")
    _model(root / "shared" / "trusted" / "custom", model_type="vetted", auto_map={"AutoModel": "modeling.Vetted"})
    _dataset(root / "beta" / "data", {"secret_beta_set": {"file_name": "secret.json"}}, {"secret.json": RECORDS})
    (root / "alpha" / "to-beta").symlink_to(root / "beta" / "data")
    (root / "alpha" / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(root / "alpha" / "fifo.json")
    return root


@pytest.fixture(scope="module")
def api(tmp_path_factory, teams):
    yield from serving_api(tmp_path_factory, {"tenancy": {
        "team_roots": {"alpha": [str(teams / "alpha")], "beta": [str(teams / "beta")]},
        "shared_roots": [str(teams / "shared"), str(REPO_ROOT / "examples")],
        "trusted_code_roots": [str(teams / "shared" / "trusted")]}})


def spec(teams: Path, **train) -> dict:
    return {"name": "tenant", "gpus": 1, "train": {
        "model_name_or_path": str(teams / "alpha" / "models" / "plain"), "stage": "sft", "finetuning_type": "lora",
        "dataset": "alpaca", "dataset_dir": str(teams / "alpha" / "data"), "max_steps": 2, **train}}


def refused(api, body: dict, token: str = "user") -> dict[str, str]:
    with api.client(token) as http:
        r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    return {".".join(map(str, e["loc"])): e["msg"] for e in r.json()["detail"]}


def test_own_folders_and_shared_data_are_accepted(api, teams):
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=spec(teams, trust_remote_code=True))  # no custom code: harmless
        assert r.status_code == 201, r.text
        shared = spec(teams, dataset="alpaca_en_demo", dataset_dir=str(REPO_ROOT / "examples" / "data"),
                      model_name_or_path=str(teams / "shared" / "trusted" / "custom"), trust_remote_code=True)
        assert http.post("/v1/jobs", json=shared).status_code == 201


def test_another_teams_folder_is_refused_without_saying_whether_it_exists(api, teams):
    real = refused(api, spec(teams, dataset_dir=str(teams / "beta" / "data")))["train.dataset_dir"]
    ghost = refused(api, spec(teams, dataset_dir=str(teams / "beta" / "no-such")))["train.dataset_dir"]
    assert "outside the folders team 'alpha' may read" in real and str(teams / "alpha") in real
    assert str(teams / "beta") + "'" not in real.split(" may read: ")[1]  # beta's folder is not offered
    assert real.replace("data", "X") == ghost.replace("no-such", "X")  # same answer, existing or not
    assert "secret_beta_set" not in real


@pytest.mark.parametrize("field, value, where", [
    ("dataset_dir", "{alpha}/data/../../beta/data", "train.dataset_dir"),           # ../
    ("dataset_dir", "{alpha}/to-beta", "train.dataset_dir"),                        # a symlink out
    ("deepspeed", "/etc/passwd", "train.deepspeed"),                                # the host's files
    ("deepspeed", "{alpha}/zero.json", "train.deepspeed"),                          # a link to /dev/zero
    ("model_name_or_path", "/etc", "train.model_name_or_path"),
    ("adapter_name_or_path", "{alpha}/models/plain,{beta}/data", "train.adapter_name_or_path"),
    ("tokenized_path", "{beta}/data", "train.tokenized_path"),
    ("resume_from_checkpoint", "{beta}/data", "train.resume_from_checkpoint"),
])
def test_paths_that_leave_the_teams_folders_are_refused(api, teams, field, value, where):
    value = value.format(alpha=teams / "alpha", beta=teams / "beta")
    errors = refused(api, spec(teams, **{field: value}))
    assert "outside the folders team 'alpha' may" in errors[where], errors


def test_dataset_file_names_cannot_escape_the_dataset_folder(api, teams):
    for name in ("escape", "absolute"):
        errors = refused(api, spec(teams, dataset=name))
        assert "file_name" in errors["train.dataset"] and "outside the folders" in errors["train.dataset"], errors


def test_a_fifo_inside_the_team_folder_is_refused_at_once_not_read(api, teams):
    errors = refused(api, spec(teams, deepspeed=str(teams / "alpha" / "fifo.json")))
    # Not "took over api.validation_timeout_s": the open did not wait for a writer.
    assert "is not a regular file" in errors["train.deepspeed"], errors


def test_a_model_with_its_own_code_outside_a_trusted_root_is_refused_naming_it(api, teams):
    model = teams / "alpha" / "models" / "custom"
    errors = refused(api, spec(teams, model_name_or_path=str(model), trust_remote_code=True))
    msg = errors["train.model_name_or_path"]
    assert str(model) in msg and "auto_map" in msg and "trusted_code_roots" in msg, msg


def test_interpolations_are_refused_before_they_reach_the_trainer(api, teams):
    errors = refused(api, spec(teams, learning_rate="${oc.env:DATABASE_URL}",
                               lora_target="${oc.env:NATS_URL,all}"))
    assert "interpolation" in errors["train.learning_rate"] and "train.lora_target" in errors, errors


def test_outputs_go_only_inside_the_jobs_folder(api, teams):
    errors = refused(api, spec(teams, logging_dir=str(teams / "beta" / "logs")))
    assert "inside the job's own folder" in errors["train.logging_dir"], errors
    with api.client("user") as http:
        assert http.post("/v1/jobs", json=spec(teams, logging_dir="runs")).status_code == 201


def test_resume_only_from_the_same_teams_checkpoints(api, teams):
    storage = Path(api.server.config.storage.root)
    anyone = spec(teams, model_name_or_path=str(teams / "shared" / "models" / "plain"), dataset="alpaca_en_demo",
                  dataset_dir=str(REPO_ROOT / "examples" / "data"))
    with api.client("other_user") as beta, api.client("user") as alpha:
        beta_job, alpha_job = (c.post("/v1/jobs", json=anyone).json()["id"] for c in (beta, alpha))
    errors = refused(api, spec(teams, resume_from_checkpoint=str(storage / "jobs" / beta_job / "output" / "checkpoint-2")))
    assert "not a checkpoint of team 'alpha'" in errors["train.resume_from_checkpoint"], errors
    own = spec(teams, resume_from_checkpoint=str(storage / "jobs" / alpha_job / "output" / "checkpoint-2"))
    with api.client("user") as http:
        assert http.post("/v1/jobs", json=own).status_code == 201


def test_close_hints_name_only_what_the_team_may_see(api, teams):
    errors = refused(api, spec(teams, dataset="secret_beta"))  # close to beta's dataset, not to alpha's
    assert "not registered" in errors["train.dataset"] and "secret_beta_set" not in errors["train.dataset"], errors
