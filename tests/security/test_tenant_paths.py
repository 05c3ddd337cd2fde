"""A hostile tenant's paths, through the real api on the real Postgres and NATS.

Team alpha owns <teams>/alpha, team beta <teams>/beta; every team reads <teams>/shared, and
<teams>/shared/trusted is where a model's own Python may run. Each attack is refused with 422
naming the field, and the answer for a path outside alpha's folders is the same whether or not
the path exists.
"""

from __future__ import annotations

import json
import os
import time
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
    _dataset(
        root / "alpha" / "data",
        ALPACA
        | {
            "escape": {"file_name": "../../beta/data/secret.json"},
            "absolute": {"file_name": str(root / "beta" / "data" / "secret.json")},
        },
    )
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
    yield from serving_api(
        tmp_path_factory,
        {
            "tenancy": {
                "team_roots": {"alpha": [str(teams / "alpha")], "beta": [str(teams / "beta")]},
                "shared_roots": [str(teams / "shared"), str(REPO_ROOT / "examples")],
                "trusted_code_roots": [str(teams / "shared" / "trusted")],
            }
        },
    )


def spec(teams: Path, **train) -> dict:
    return {
        "name": "tenant",
        "gpus": 1,
        "train": {
            "model_name_or_path": str(teams / "alpha" / "models" / "plain"),
            "stage": "sft",
            "finetuning_type": "lora",
            "dataset": "alpaca",
            "dataset_dir": str(teams / "alpha" / "data"),
            "max_steps": 2,
            **train,
        },
    }


def refused(api, body: dict, token: str = "user") -> dict[str, str]:
    with api.client(token) as http:
        r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    return {".".join(map(str, e["loc"])): e["msg"] for e in r.json()["detail"]}


def test_own_folders_and_shared_data_are_accepted(api, teams):
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=spec(teams))
        assert r.status_code == 201, r.text
        # trust_remote_code on a folder outside the trusted roots: refused whatever it holds (test_spec_edges.py)
        assert http.post("/v1/jobs", json=spec(teams, trust_remote_code=True)).status_code == 422
        shared = spec(
            teams,
            dataset="alpaca_en_demo",
            dataset_dir=str(REPO_ROOT / "examples" / "data"),
            model_name_or_path=str(teams / "shared" / "trusted" / "custom"),
            trust_remote_code=True,
        )
        assert http.post("/v1/jobs", json=shared).status_code == 201


def test_another_teams_folder_is_refused_without_saying_whether_it_exists(api, teams):
    real = refused(api, spec(teams, dataset_dir=str(teams / "beta" / "data")))["train.dataset_dir"]
    ghost = refused(api, spec(teams, dataset_dir=str(teams / "beta" / "no-such")))["train.dataset_dir"]
    assert "outside the folders team 'alpha' may read" in real and str(teams / "alpha") in real
    assert str(teams / "beta") + "'" not in real.split(" may read: ")[1]  # beta's folder is not offered
    assert real.replace("data", "X") == ghost.replace("no-such", "X")  # same answer, existing or not
    assert "secret_beta_set" not in real


@pytest.mark.parametrize(
    "field, value, where",
    [
        ("dataset_dir", "{alpha}/data/../../beta/data", "train.dataset_dir"),  # ../
        ("dataset_dir", "{alpha}/to-beta", "train.dataset_dir"),  # a symlink out
        ("deepspeed", "/etc/passwd", "train.deepspeed"),  # the host's files
        ("deepspeed", "{alpha}/zero.json", "train.deepspeed"),  # a link to /dev/zero
        ("model_name_or_path", "/etc", "train.model_name_or_path"),
        ("adapter_name_or_path", "{alpha}/models/plain,{beta}/data", "train.adapter_name_or_path"),
        ("tokenized_path", "{beta}/data", "train.tokenized_path"),
        ("resume_from_checkpoint", "{beta}/data", "train.resume_from_checkpoint"),
    ],
)
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
    errors = refused(api, spec(teams, learning_rate="${oc.env:DATABASE_URL}", lora_target="${oc.env:NATS_URL,all}"))
    assert "interpolation" in errors["train.learning_rate"] and "train.lora_target" in errors, errors


def test_outputs_go_only_inside_the_jobs_folder(api, teams):
    errors = refused(api, spec(teams, logging_dir=str(teams / "beta" / "logs")))
    assert "inside the job's own folder" in errors["train.logging_dir"], errors
    with api.client("user") as http:
        assert http.post("/v1/jobs", json=spec(teams, logging_dir="runs")).status_code == 201


def test_resume_only_from_the_same_teams_checkpoints(api, teams):
    storage = Path(api.server.config.storage.root)
    anyone = spec(
        teams,
        model_name_or_path=str(teams / "shared" / "models" / "plain"),
        dataset="alpaca_en_demo",
        dataset_dir=str(REPO_ROOT / "examples" / "data"),
    )
    with api.client("other_user") as beta, api.client("user") as alpha:
        beta_job, alpha_job = (c.post("/v1/jobs", json=anyone).json()["id"] for c in (beta, alpha))
    errors = refused(
        api, spec(teams, resume_from_checkpoint=str(storage / "jobs" / beta_job / "output" / "checkpoint-2"))
    )
    assert "not a checkpoint of team 'alpha'" in errors["train.resume_from_checkpoint"], errors
    own = spec(teams, resume_from_checkpoint=str(storage / "jobs" / alpha_job / "output" / "checkpoint-2"))
    with api.client("user") as http:
        assert http.post("/v1/jobs", json=own).status_code == 201


def test_close_hints_name_only_what_the_team_may_see(api, teams):
    errors = refused(api, spec(teams, dataset="secret_beta"))  # close to beta's dataset, not to alpha's
    assert "not registered" in errors["train.dataset"] and "secret_beta_set" not in errors["train.dataset"], errors


def test_a_user_is_not_shown_other_teams_job_ids_in_reasons_and_evidence(api, teams):
    from shared.contracts.messages import AuditEvent
    from shared.infra.pending_reasons import PendingReasonBoard

    anyone = spec(
        teams,
        model_name_or_path=str(teams / "shared" / "models" / "plain"),
        dataset="alpaca_en_demo",
        dataset_dir=str(REPO_ROOT / "examples" / "data"),
    )
    with api.client("other_user") as beta, api.client("user") as alpha:
        beta_job, alpha_job = (c.post("/v1/jobs", json=anyone).json()["id"] for c in (beta, alpha))
    server = api.server

    async def decide() -> None:  # what the decider says about alpha's job, as the decider
        bus = await server.env.bus("decider")
        try:
            await bus.audit(
                AuditEvent(
                    event_id=f"{alpha_job}:redaction",
                    ts=time.time(),
                    source="decider",
                    kind="decision",
                    job_id=alpha_job,
                    rule="priority_scheduling",
                    action="preempt",
                    reason=f"preempt {beta_job} so that {alpha_job} starts",
                    evidence={"victims": [beta_job]},
                )
            )
            await PendingReasonBoard(bus).publish(
                {alpha_job: {"priority_fifo": f"held behind higher-priority job {beta_job} (high)"}},
                {alpha_job},
                time.time(),
            )
        finally:
            await bus.close()

    server.run(decide())
    api.wait_audit(lambda r: r["event_id"] == f"{alpha_job}:redaction")

    with api.client("user") as alpha, api.client("admin") as admin:
        mine = alpha.get("/v1/audit", params={"job_id": alpha_job, "kind": "decision"}).json()["items"]
        pending = alpha.get(f"/v1/jobs/{alpha_job}").json()["pending_reason"]
        full = admin.get("/v1/audit", params={"job_id": alpha_job, "kind": "decision"}).json()["items"]
    shown = json.dumps(mine) + pending
    assert beta_job not in shown and "(another team's job)" in mine[0]["reason"], shown
    assert alpha_job in mine[0]["reason"] and "(another team's job)" in pending, shown
    assert beta_job in json.dumps(full), "operators and admins see everything"


def test_a_user_is_not_shown_other_teams_job_names_in_reasons_evidence_and_events(api, teams):
    """A writer may name a job instead of giving its id: another team's job name is hidden from a user in
    the decider's decision reasons and evidence and its pending reasons; the team's own names stay. A job's
    events come from its trainer, text the user's own code writes: shown as written, as hiding a name there
    would confirm a guess (tests/security/test_redaction_oracle.py)."""
    from shared.contracts.messages import AuditEvent, JobEvent
    from shared.infra.pending_reasons import PendingReasonBoard

    secret, own = "beta-secret-finetune", "alpha-own-run"
    anyone = spec(
        teams,
        model_name_or_path=str(teams / "shared" / "models" / "plain"),
        dataset="alpaca_en_demo",
        dataset_dir=str(REPO_ROOT / "examples" / "data"),
    )
    with api.client("other_user") as beta, api.client("user") as alpha:
        assert beta.post("/v1/jobs", json={**anyone, "name": secret}).status_code == 201
        alpha_job = alpha.post("/v1/jobs", json={**anyone, "name": own}).json()["id"]
    server = api.server

    async def speak() -> None:  # what a rule and the executor might say about alpha's job
        bus = await server.env.bus("decider")
        try:
            await bus.audit(
                AuditEvent(
                    event_id=f"{alpha_job}:names",
                    ts=time.time(),
                    source="decider",
                    kind="decision",
                    job_id=alpha_job,
                    rule="queue_order",
                    action="preempt",
                    reason=f"{own} waits: {secret} holds 2 GPUs.",
                    evidence={"blocking": [secret], "gpus": 2},
                )
            )
            await PendingReasonBoard(bus).publish(
                {alpha_job: {"queue_order": f"behind {secret} (high)"}}, {alpha_job}, time.time()
            )
        finally:
            await bus.close()
        bus = await server.env.bus("worker-node-1")  # its trainer's node
        try:
            await bus.publish_js(
                bus.subjects.job_events(alpha_job, "node-1"),
                JobEvent(
                    job_id=alpha_job,
                    kind="stopped",
                    ts=time.time(),
                    attempt=1,
                    node="node-1",
                    data={"reason": f"made room for {secret}"},
                ),
                f"{alpha_job}:names-event",
            )
        finally:
            await bus.close()

    server.sql(
        "UPDATE jobs SET attempt = 1, placement = $2, status = 'running' WHERE id = $1",
        alpha_job,
        [{"node": "node-1", "gpus": [0]}],
    )
    server.run(speak())
    server.sql("UPDATE jobs SET status = 'pending', placement = NULL WHERE id = $1", alpha_job)  # waiting again
    api.wait_audit(lambda r: r["event_id"] == f"{alpha_job}:names")

    with api.client("user") as alpha, api.client("admin") as admin:
        mine = alpha.get("/v1/audit", params={"job_id": alpha_job, "kind": "decision"}).json()["items"]
        job = alpha.get(f"/v1/jobs/{alpha_job}").json()
        events = alpha.get(f"/v1/jobs/{alpha_job}/events").json()["items"]
        full = admin.get("/v1/audit", params={"job_id": alpha_job, "kind": "decision"}).json()["items"]
        admin_events = admin.get(f"/v1/jobs/{alpha_job}/events").json()["items"]
    shown = json.dumps([mine, job["pending_reason"]])
    assert secret not in shown, shown
    assert mine[0]["reason"] == f"{own} waits: (another team's job) holds 2 GPUs.", mine[0]
    assert mine[0]["evidence"] == {"blocking": ["(another team's job)"], "gpus": 2}, mine[0]
    assert job["pending_reason"] == "behind (another team's job) (high)" and job["name"] == own, job
    assert [e["data"] for e in events if e["kind"] == "stopped"] == [{"reason": f"made room for {secret}"}]
    assert [e["kind"] for e in events] == [e["kind"] for e in admin_events]  # kinds never rewritten
    assert secret in json.dumps(full) and secret in json.dumps(admin_events), "operators and admins see everything"


def test_tokenized_path_is_written_only_inside_the_jobs_folder_and_read_only_from_the_teams(api, teams):
    """LLaMA-Factory loads a tokenized dataset from `tokenized_path` if it exists and writes one there if
    not: a relative path is the job's own (placed under its output folder), an absolute one is only read."""
    (teams / "alpha" / "tokenized").mkdir(exist_ok=True)
    with api.client("user") as http:
        assert http.post("/v1/jobs", json=spec(teams, tokenized_path="tokenized")).status_code == 201
        existing = spec(teams, tokenized_path=str(teams / "alpha" / "tokenized"))
        assert http.post("/v1/jobs", json=existing).status_code == 201
    for escape in ("../tokenized", "a/../../b"):
        errors = refused(api, spec(teams, tokenized_path=escape))
        assert "inside the job's own folder" in errors["train.tokenized_path"], errors
    errors = refused(api, spec(teams, tokenized_path=str(teams / "alpha" / "not-yet")))  # would be written there
    assert "give a relative path" in errors["train.tokenized_path"], errors


def test_the_worker_checks_tokenized_path_again_and_places_it_in_the_jobs_folder(teams, tmp_path):
    from shared.contracts.actions import NodeGpus
    from shared.contracts.messages import Command
    from shared.infra.config import parse_config
    from worker.launch_check import LaunchCheck, LaunchRefused

    tenancy = parse_config(
        {
            "tenancy": {
                "team_roots": {"alpha": [str(teams / "alpha")], "beta": [str(teams / "beta")]},
                "shared_roots": [str(teams / "shared")],
            }
        },
        env={},
    ).tenancy
    check = LaunchCheck(tenancy, data_root=teams, storage_root=tmp_path / "storage")
    (teams / "alpha" / "tokenized").mkdir(exist_ok=True)

    def start(**train) -> Command:
        return Command(
            kind="start",
            job_id="jtok",
            attempt=1,
            team="alpha",
            placement=[NodeGpus(node="n", gpus=[0])],
            train=spec(teams, **train)["train"],
        )

    check.plan(start(tokenized_path="tok"))
    check.plan(start(tokenized_path=str(teams / "alpha" / "tokenized")))
    for value, said in (
        (str(teams / "beta" / "data"), "outside the folders team 'alpha' may read"),
        (str(teams / "alpha" / "not-yet"), "give a relative path"),
        ("../../beta", "inside the job's own folder"),
    ):
        with pytest.raises(LaunchRefused, match="tokenized_path") as refusal:
            check.plan(start(tokenized_path=value))
        assert said in str(refusal.value), refusal.value
