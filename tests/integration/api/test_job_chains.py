"""Job references (`job://NAME[/PATH]`) and chains (`after`, POST /v1/jobs/chain) at the api: a reference
resolves to the output folder of the team's own job and nothing else; a chain is queued whole or not at
all, each job audited and waiting for the one before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


def _finish(api, job_id: str, files: dict[str, str]) -> Path:
    """What the executor and a trainer leave of a succeeded job: its folder, its team, its output files."""
    job_dir = Path(api.server.config.storage.root).resolve() / "jobs" / job_id
    (job_dir / "output").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (job_dir / "output" / name).parent.mkdir(parents=True, exist_ok=True)
        (job_dir / "output" / name).write_text(text)
    (job_dir / "team").write_text(api.server.sql("SELECT team FROM jobs WHERE id = $1", job_id)[0]["team"])
    api.server.sql("UPDATE jobs SET job_dir = $2, status = 'succeeded' WHERE id = $1", job_id, str(job_dir))
    return job_dir / "output"


ADAPTER = {"adapter_config.json": "{}", "adapter_model.safetensors": "", "checkpoint-5/adapter_config.json": "{}"}


def _next(api, name: str, **train) -> dict:
    """A job on an earlier one's output (the api's examples hold one dataset: sft again, on the adapter)."""
    spec = api.job_spec(name=name)
    spec["train"] = {**spec["train"], **train}
    return spec


@pytest.fixture(scope="module")
def sft(api):
    job = api.submit("user", name="chain-sft")
    return job | {"output": _finish(api, job["id"], ADAPTER)}


def test_a_reference_names_the_teams_own_job_output_by_name_or_id(api, sft):
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=_next(api, "by-name", adapter_name_or_path="job://chain-sft"))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["train"]["adapter_name_or_path"] == str(sft["output"])
        ref = f"job://{sft['id']}/checkpoint-5"
        r = http.post("/v1/jobs", json=_next(api, "by-id", adapter_name_or_path=ref))
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["train"]["adapter_name_or_path"] == str(sft["output"] / "checkpoint-5")
    trail = api.wait_audit(lambda e: e["kind"] == "job.submitted" and e["job_id"] == r.json()["id"])
    [submitted] = [e for e in trail if e["kind"] == "job.submitted" and e["job_id"] == r.json()["id"]]
    assert submitted["data"]["inputs"] == {"adapter_name_or_path": ref}


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("job://no-such-job", "no job of team 'alpha' has the id or name 'no-such-job'"),
        ("job://chain-sft/../../other", "plain names"),
        ("job://chain-sft/checkpoint-9", "has no checkpoint-9"),
        ("job://", "name a job by its id or name"),
    ],
)
def test_a_bad_reference_is_refused_naming_the_key(api, sft, ref, words):
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=_next(api, "bad-ref", adapter_name_or_path=ref))
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["train", "adapter_name_or_path"] and words in error["msg"], error


def test_another_teams_job_reads_as_no_job_at_all(api, sft):
    """Team beta names alpha's job by id and by name: refused in the words an unknown job gets."""
    with api.client("other_user") as http:
        for ref in (f"job://{sft['id']}", "job://chain-sft"):
            r = http.post("/v1/jobs", json=_next(api, "steal", reward_model=ref))
            assert r.status_code == 422, r.text
            [error] = r.json()["detail"]
            assert error["loc"] == ["train", "reward_model"], error
            assert error["msg"] == f"{ref!r}: no job of team 'beta' has the id or name {ref[6:]!r}"
        # The folder itself, written as a path, is outside what beta may read.
        r = http.post("/v1/jobs", json=_next(api, "steal", adapter_name_or_path=str(sft["output"])))
        assert r.status_code == 422 and "outside the folders team 'beta' may read" in r.text


def test_a_lora_reward_model_is_an_adapter_folder_when_it_is_a_job(api, sft):
    with api.client("user") as http:
        spec = _next(api, "ppo", reward_model="job://chain-sft", stage="ppo", dataset="alpaca_en_demo")
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        r = http.post("/v1/jobs", json=spec | {"train": {**spec["train"], "reward_model_type": "full"}})
        assert r.status_code == 422 and "loads as reward_model_type lora" in r.text
        # The same folder by path is the storage root: refused, whoever's it is.
        r = http.post("/v1/jobs", json=_next(api, "ppo", reward_model=str(sft["output"])))
        assert r.status_code == 422 and "outside the folders team 'alpha' may read" in r.text


def test_an_unfinished_job_is_named_only_by_a_job_that_waits_for_it(api):
    running = api.submit("user", name="still-running")
    with api.client("user") as http:
        r = http.post("/v1/jobs", json=_next(api, "too-soon", adapter_name_or_path="job://still-running"))
        assert r.status_code == 422, r.text
        assert f"is pending, so its output is not final; add `after: {running['id']}`" in r.text
        spec = _next(api, "waits", adapter_name_or_path="job://still-running") | {"after": "still-running"}
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["after"] == running["id"]
        # Nothing runs after a job that failed.
        api.server.sql("UPDATE jobs SET status = 'failed' WHERE id = $1", running["id"])
        r = http.post("/v1/jobs", json=api.job_spec(name="after-failed") | {"after": running["id"]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["after"] and "is failed" in r.text


def test_a_chain_is_queued_whole_each_job_after_the_one_before(api, sft):
    chain = {
        "jobs": [
            api.job_spec(name="c-sft"),
            _next(api, "c-dpo", adapter_name_or_path="job://c-sft"),
            {
                "name": "c-export",
                "train": {
                    "model_name_or_path": str(api.model_dir),
                    "adapter_name_or_path": "job://c-dpo",
                    "finetuning_type": "lora",
                    "export_dir": "merged",
                    "export_size": 1,
                },
            },
        ]
    }
    with api.client("user") as http:
        r = http.post("/v1/jobs/chain", json=chain)
        assert r.status_code == 201, r.text
        sft_job, dpo, export = r.json()["items"]
        assert r.json()["chain"] == sft_job["id"]
        assert "after" not in sft_job["spec"]
        assert dpo["spec"]["after"] == sft_job["id"] and export["spec"]["after"] == dpo["id"]
        storage = Path(api.server.config.storage.root).resolve() / "jobs"
        assert dpo["spec"]["train"]["adapter_name_or_path"] == str(storage / sft_job["id"] / "output")
        assert export["spec"]["train"]["export_size"] == 1  # as written, not 1.0
        shown = http.get(f"/v1/jobs/{dpo['id']}").json()
        assert [m["id"] for m in shown["chain"]] == [sft_job["id"], dpo["id"], export["id"]]
    trail = api.wait_audit(lambda e: e["kind"] == "job.submitted" and e["job_id"] == export["id"])
    submitted = {e["job_id"]: e["data"] for e in trail if e["kind"] == "job.submitted"}
    assert [submitted[j["id"]]["chain_position"] for j in (sft_job, dpo, export)] == [1, 2, 3]
    assert submitted[dpo["id"]]["after"] == sft_job["id"]


def test_a_chain_with_one_bad_spec_queues_nothing(api):
    before = api.server.sql("SELECT count(*) AS n FROM jobs")[0]["n"]
    chain = {"jobs": [api.job_spec(name="ok-1"), _next(api, "bad-2", adapter_name_or_path="job://nope")]}
    with api.client("user") as http:
        r = http.post("/v1/jobs/chain", json=chain)
        assert r.status_code == 422, r.text
        [error] = r.json()["detail"]
        assert error["loc"] == ["jobs", 1, "train", "adapter_name_or_path"], error
        assert http.post("/v1/jobs/chain", content=json.dumps({"jobs": []})).status_code == 422
    assert api.server.sql("SELECT count(*) AS n FROM jobs")[0]["n"] == before


def test_adc_submit_chain_and_what_adc_jobs_and_adc_job_show(api, tmp_path):
    first, second = tmp_path / "sft.yaml", tmp_path / "next.yaml"
    first.write_text(yaml.safe_dump(api.job_spec()["train"]))  # bare LLaMA-Factory configs, named by file
    second.write_text(yaml.safe_dump(_next(api, "x", adapter_name_or_path="job://sft")["train"]))
    done = api.cli("submit", str(first), str(second), "--chain", "-o", "json", token="user")
    assert done.returncode == 0, done.stderr
    sft_id, next_id = done.stdout.split()
    listed = api.cli("jobs", "--limit", "5", token="user").stdout
    assert any(next_id in line and sft_id in line for line in listed.splitlines()), listed  # its `after`
    shown = api.cli("job", next_id, token="user").stdout
    assert f"sft {sft_id} (pending) -> next {next_id} (pending)" in shown, shown


def test_a_chain_refused_by_the_quota_at_its_second_job_stores_nothing(api):
    with api.client("admin") as admin:
        token = admin.post("/v1/tokens", json={"name": "delta-ci", "role": "user", "team": "delta"}).json()["secret"]
        r = admin.put("/v1/quotas/delta", json={"allowed_priorities": ["low"], "over_quota": "refuse"})
        assert r.status_code == 200, r.text
    chain = {"jobs": [api.job_spec(name="d-1"), api.job_spec(name="d-2", priority="high")]}
    with api.client(token) as http:
        r = http.post("/v1/jobs/chain", json=chain)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["jobs", 1, "priority"], r.json()
    assert api.server.sql("SELECT count(*) AS n FROM jobs WHERE team = 'delta'")[0]["n"] == 0
