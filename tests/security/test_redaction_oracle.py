"""Redaction answers no guesses, through the real api on the real Postgres and NATS.

A user who can put words of their own into what the api shows them back (a model folder's name in
their job's `job.submitted` audit row, a trainer's event) must not learn from the answer whether
another team has a job of that name: text the user (or their trainer) wrote is shown the same
whether or not the word is another team's job name. The decider's own words (decisions, pending
reasons) still hide other teams' names, and other teams' ids are hidden everywhere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.api.conftest import serving_api

SECRET = "beta-secret-finetune"  # another team's job: the name to be guessed
NOBODY = "nobody-has-this-name"  # a guess that is no job's name


@pytest.fixture(scope="module")
def teams(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("teams")
    for team in ("alpha", "beta"):
        (root / team).mkdir()
    for team, name in (("alpha", SECRET), ("alpha", NOBODY), ("alpha", "plain"), ("beta", "plain")):
        folder = root / team / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
    return root


@pytest.fixture(scope="module")
def api(tmp_path_factory, teams):
    yield from serving_api(
        tmp_path_factory,
        {
            "tenancy": {
                "team_roots": {"alpha": [str(teams / "alpha")], "beta": [str(teams / "beta")]},
                "shared_roots": [str(REPO_ROOT / "examples")],
            }
        },
    )


def _spec(teams: Path, name: str, model: str, team: str = "alpha") -> dict:
    return {
        "name": name,
        "gpus": 1,
        "train": {
            "model_name_or_path": str(teams / team / "models" / model),
            "stage": "sft",
            "finetuning_type": "lora",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(REPO_ROOT / "examples" / "data"),
            "max_steps": 2,
        },
    }


def test_a_guessed_name_in_the_users_own_text_is_not_confirmed(api, teams):
    with api.client("other_user") as beta:
        r = beta.post("/v1/jobs", json=_spec(teams, SECRET, "plain", team="beta"))
        assert r.status_code == 201, r.text
    with api.client("user") as alpha:
        guessed = {
            guess: alpha.post("/v1/jobs", json=_spec(teams, f"probe-{i}", guess)).json()["id"]
            for i, guess in enumerate((SECRET, NOBODY))
        }
    api.wait_audit(lambda r: r["job_id"] == guessed[NOBODY] and r["kind"] == "job.submitted")
    with api.client("user") as alpha:
        models = {
            guess: [
                row["data"]["model"]
                for row in alpha.get("/v1/audit", params={"job_id": job, "kind": "job.submitted"}).json()["items"]
            ]
            for guess, job in guessed.items()
        }
    # Both guesses come back as written: the answer does not depend on whether beta has such a job.
    assert models == {g: [str(teams / "alpha" / "models" / g)] for g in (SECRET, NOBODY)}, models


def test_a_guessed_name_in_the_users_trainer_events_is_not_confirmed(api, teams):
    with api.client("user") as alpha:
        job = alpha.post("/v1/jobs", json=_spec(teams, "probe-events", "plain")).json()["id"]
    server = api.server
    said = f"guesses: {SECRET} {NOBODY}"
    # The job's attempt runs on node-1, whose worker forwards what its trainer writes.
    server.sql(
        "UPDATE jobs SET attempt = 1, placement = $2, status = 'running' WHERE id = $1",
        job,
        [{"node": "node-1", "gpus": [0]}],
    )

    async def trainer_says() -> None:  # what a hostile trainer puts into its own events
        from shared.contracts.messages import JobEvent

        bus = await server.env.bus("worker-node-1")
        try:
            event = JobEvent(
                job_id=job, kind="stopped", ts=time.time(), attempt=1, node="node-1", data={"reason": said}
            )
            await bus.publish_js(bus.subjects.job_events(job, "node-1"), event, event.event_id, signed=True)
        finally:
            await bus.close()

    server.run(trainer_says())
    with api.client("user") as alpha:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            events = alpha.get(f"/v1/jobs/{job}/events").json()["items"]
            if any(e["kind"] == "stopped" for e in events):
                break
            time.sleep(0.1)
    assert [e["data"] for e in events if e["kind"] == "stopped"] == [{"reason": said}], json.dumps(events)
    server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job)
