"""Jobs over the API: submit (JSON, YAML), list with filters and pages, logs (tail, follow),
metrics and events from the bus, and quotas at submission."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from shared.contracts.messages import JobEvent
from tests.waits import until


def _run_as_executor(api, job_id: str, attempt: int, status: str = "running") -> Path:
    """What the executor records when a job starts: its folder, attempt and status."""
    job_dir = Path(api.server.config.storage.root) / "jobs" / job_id
    (job_dir / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
    placement = [{"node": "node-1", "gpus": [0]}] if status in ("running", "starting") else None
    api.server.sql(
        "UPDATE jobs SET job_dir = $2, attempt = $3, status = $4, placement = $5 WHERE id = $1",
        job_id,
        str(job_dir),
        attempt,
        status,
        placement,
    )
    return job_dir / f"attempt-{attempt}" / "trainer.log"


def test_submit_json_and_yaml_and_list_with_filters_and_pages(api):
    with api.client("user") as http:
        a = api.submit("user", name="list-a", priority="high")
        r = http.post(
            "/v1/jobs",
            content=yaml.safe_dump(api.job_spec(name="list-b")),
            headers={"Content-Type": "application/yaml"},
        )
        assert r.status_code == 201, r.text
        b = r.json()
        assert (a["priority"], b["priority"]) == ("high", "low") and a["team"] == "alpha" and a["owner"] == "user-token"
        by_priority = http.get("/v1/jobs", params={"priority": "high"}).json()["items"]
        assert a["id"] in [j["id"] for j in by_priority] and b["id"] not in [j["id"] for j in by_priority]
        assert [j["id"] for j in http.get("/v1/jobs", params={"name": "list-b"}).json()["items"]] == [b["id"]]
        first = http.get("/v1/jobs", params={"limit": 1}).json()
        assert [j["id"] for j in first["items"]] == [b["id"]] and first["next"] == b["id"]
        second = http.get("/v1/jobs", params={"limit": 1, "before": first["next"]}).json()
        assert [j["id"] for j in second["items"]] == [a["id"]]
        assert http.get("/v1/jobs", params={"status": "running", "name": "list-a"}).json()["items"] == []
        assert http.get("/v1/jobs", params={"status": "sleeping"}).status_code == 422


def test_logs_whole_tail_and_missing(api):
    job = api.submit("user", name="logs")
    with api.client("user") as http:
        assert http.get(f"/v1/jobs/{job['id']}/logs").status_code == 404  # pending: no folder yet
        log = _run_as_executor(api, job["id"], 1)
        log.write_text("".join(f"step {i}\n" for i in range(1, 101)))
        assert http.get(f"/v1/jobs/{job['id']}/logs").text.count("\n") == 100
        assert http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 3}).text == "step 98\nstep 99\nstep 100\n"
        assert http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 0}).text == ""
        assert http.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 2}).status_code == 404
    with api.client("other_user") as http:
        assert http.get(f"/v1/jobs/{job['id']}/logs").status_code == 404


def test_logs_follow_until_the_job_ends_across_attempts(api):
    job = api.submit("user", name="follow")
    first = _run_as_executor(api, job["id"], 1)
    first.write_text("attempt one starts\n")

    def one_more_step() -> None:
        with first.open("a") as f:
            f.write("step 1\n")

    def migrated() -> None:  # a new attempt, a new log
        _run_as_executor(api, job["id"], 2).write_text("resumed at step 1\nstep 2\n")

    # What the trainer and the executor do once the follower has shown a line: each change comes
    # after the follow is under way, whatever the pace of either side.
    after = {
        "attempt one starts": one_more_step,
        "step 1": migrated,
        "step 2": lambda: api.server.sql("UPDATE jobs SET status = 'succeeded' WHERE id = $1", job["id"]),
    }
    shown = []
    with api.client("user") as http:  # a follow that outlived the job would end in a read timeout
        with http.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}, timeout=20) as r:
            for line in r.iter_lines():
                shown.append(line)
                if act := after.pop(line, None):
                    act()
    assert shown == ["attempt one starts", "step 1", "--- attempt 2 ---", "resumed at step 1", "step 2"]


def test_a_job_folder_outside_shared_storage_is_not_served(api):
    job = api.submit("user", name="escape")
    api.server.sql("UPDATE jobs SET job_dir = '/etc', attempt = 1 WHERE id = $1", job["id"])
    with api.client("admin") as http:
        r = http.get(f"/v1/jobs/{job['id']}/logs")
    assert r.status_code == 404 and "shared" in r.text


def _publish_progress(api, job_id: str, attempt: int, steps: range, loss=lambda s: 2.0 / s) -> None:
    """Node-1's trainer reports `attempt`, which the executor placed there."""
    api.server.sql(
        "UPDATE jobs SET attempt = $2, placement = $3, status = 'running' WHERE id = $1",
        job_id,
        attempt,
        [{"node": "node-1", "gpus": [0]}],
    )
    bus = api.server.as_role("worker-node-1")

    async def publish() -> None:
        for step in steps:
            event = JobEvent(
                job_id=job_id,
                kind="progress",
                ts=time.time(),
                attempt=attempt,
                node="node-1",
                data={
                    "step": step,
                    "max_steps": 100,
                    "loss": loss(step),
                    "learning_rate": 1e-3,
                    "tokens_per_s": 1000.0 + step,
                },
            )
            await bus.publish_js(bus.subjects.job_events(job_id, "node-1"), event, event.event_id)
        done = JobEvent(
            job_id=job_id,
            kind="checkpointed",
            ts=time.time(),
            attempt=attempt,
            node="node-1",
            data={"step": steps[-1], "path": "/ckpt"},
        )
        await bus.publish_js(bus.subjects.job_events(job_id, "node-1"), done, done.event_id)

    api.server.run(publish())
    api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job_id)


def test_metrics_and_events_come_from_the_job_stream(api):
    job = api.submit("user", name="metrics")
    _publish_progress(api, job["id"], 1, range(1, 31))
    _publish_progress(api, job["id"], 2, range(31, 41), loss=lambda s: float("nan") if s == 40 else 2.0 / s)
    with api.client("user") as http:
        m = http.get(f"/v1/jobs/{job['id']}/metrics").json()
        assert m["summary"]["points"] == 40 and m["summary"]["last_step"] == 40
        assert m["points"][-1]["loss"] is None  # a NaN loss is shown as null, not an error
        assert m["summary"]["min_loss"] == pytest.approx(2.0 / 39)
        assert [p["step"] for p in m["points"][:3]] == [1, 2, 3] and m["points"][0]["tokens_per_s"] == 1001.0
        thin = http.get(f"/v1/jobs/{job['id']}/metrics", params={"max_points": 5}).json()["points"]
        assert len(thin) <= 5 and thin[-1]["step"] == 40 and thin[0]["step"] == 1
        only_two = http.get(f"/v1/jobs/{job['id']}/metrics", params={"attempt": 2}).json()
        assert only_two["summary"]["points"] == 10
        events = http.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        assert [e["kind"] for e in events] == ["submitted", "checkpointed", "checkpointed"]
        assert events[0]["actor"].startswith("user-token")
        everything = http.get(f"/v1/jobs/{job['id']}/events", params={"include_progress": "true"}).json()["items"]
        assert len(everything) == 43 and [e["seq"] for e in everything] == sorted(e["seq"] for e in everything)
    with api.client("other_user") as http:
        assert http.get(f"/v1/jobs/{job['id']}/metrics").status_code == 404


@pytest.fixture(scope="module")
def gamma(api):
    """A team of its own, so quotas here touch no other test."""
    with api.client("admin") as http:
        token = http.post("/v1/tokens", json={"name": "gamma-ci", "role": "user", "team": "gamma"}).json()["secret"]
    return token


def test_quota_refuse_mode_and_allowed_priorities(api, gamma):
    with api.client("admin") as admin:
        r = admin.put(
            "/v1/quotas/gamma",
            json={"max_gpus": 2, "max_running_jobs": 5, "allowed_priorities": ["low"], "over_quota": "refuse"},
        )
        assert r.status_code == 200, r.text
    with api.client(gamma) as http:
        high = http.post("/v1/jobs", json=api.job_spec(name="too-high", priority="high"))
        assert high.status_code == 422 and high.json()["detail"][0]["loc"] == ["priority"]
        assert "may not submit priority 'high'" in high.text
        huge = http.post("/v1/jobs", json=api.job_spec(name="huge", gpus=3))
        assert huge.status_code == 422 and huge.json()["detail"][0]["loc"] == ["gpus"] and "never run" in huge.text
        for i in range(2):
            assert http.post("/v1/jobs", json=api.job_spec(name=f"fits-{i}")).status_code == 201
        over = http.post("/v1/jobs", json=api.job_spec(name="one-too-many"))
        assert over.status_code == 429 and "quota is 2" in over.json()["detail"]
        assert [q["team"] for q in http.get("/v1/quotas").json()["items"]] == ["gamma"]
    refused = api.wait_audit(lambda e: e["kind"] == "job.refused")
    event = next(e for e in refused if e["kind"] == "job.refused")
    assert event["actor"].startswith("gamma-ci") and "quota is 2" in event["reason"]


def test_quota_queue_mode_accepts_with_the_reason(api, gamma):
    with api.client("admin") as admin:
        assert admin.put("/v1/quotas/gamma", json={"max_running_jobs": 0}).status_code == 200
    with api.client(gamma) as http:
        r = http.post("/v1/jobs", json=api.job_spec(name="queued", priority="high"))
        assert r.status_code == 201 and "queued until the team is under quota" in r.json()["quota_note"]
    with api.client("admin") as admin:
        assert admin.delete("/v1/quotas/gamma").status_code == 204
        assert admin.delete("/v1/quotas/gamma").status_code == 404
        assert admin.put("/v1/quotas/gamma", json={"allowed_priorities": ["urgent"]}).status_code == 422
    changes = api.wait_audit(lambda e: e["kind"] == "quota.removed")
    update = [e for e in changes if e["kind"] == "quota.updated"][-1]
    assert {"path": "over_quota", "old": "refuse", "new": "queue"} in update["data"]["diff"]


def test_cancel_is_audited_and_a_finished_job_cannot_be_cancelled(api):
    job = api.submit("user", name="cancel-me")
    with api.client("user") as http:
        r = http.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 202 and r.json()["cancel_requested"] is True
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202  # asked twice: audited twice
        api.server.sql("UPDATE jobs SET status = 'cancelled' WHERE id = $1", job["id"])
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409

    def both_requests() -> list[dict] | None:
        trail = api.wait_audit(lambda e: e["kind"] == "job.cancel_requested" and e["job_id"] == job["id"])
        found = [e for e in trail if e["kind"] == "job.cancel_requested" and e["job_id"] == job["id"]]
        return found if len(found) >= 2 else None

    requests = until(both_requests, "both cancel requests audited", timeout=30)
    assert len({e["event_id"] for e in requests}) == 2
    assert all(e["actor"].startswith("user-token") for e in requests)


def test_export_is_refused_unless_the_job_succeeded_and_queues_an_export_job(api):
    lora = api.submit("user", name="to-export")
    full, oft = api.submit("user", name="full-ft"), api.submit("user", name="oft-ft")
    for job, method in ((full, "full"), (oft, "oft")):
        api.server.sql(
            "UPDATE jobs SET spec = jsonb_set(spec, '{train,finetuning_type}', to_jsonb($2::text)) WHERE id = $1",
            job["id"],
            method,
        )
    with api.client("user") as http:
        r = http.post(f"/v1/jobs/{lora['id']}/export")
        assert r.status_code == 409 and "is pending: only a succeeded job" in r.json()["detail"]
        for job in (lora, full, oft):
            _run_as_executor(api, job["id"], 1, status="succeeded")
        r = http.post(f"/v1/jobs/{oft['id']}/export")
        assert r.status_code == 422, r.text
        [error] = r.json()["detail"]
        assert error["loc"] == ["train", "finetuning_type"] and "'oft'" in error["msg"]
        # A full job's output is a whole model: saved again, in shards of export_size GB.
        r = http.post(f"/v1/jobs/{full['id']}/export", json={"export_size": 2, "export_legacy_format": True})
        assert r.status_code == 201, r.text
        train = r.json()["spec"]["train"]
        assert train["model_name_or_path"] == http.get(f"/v1/jobs/{full['id']}").json()["output_dir"]
        assert "adapter_name_or_path" not in train and train["finetuning_type"] == "full"
        assert (train["export_size"], train["export_legacy_format"]) == (2, True)
        assert http.post(f"/v1/jobs/{lora['id']}/export", json={"dtype": "int3"}).status_code == 422
        r = http.post(f"/v1/jobs/{lora['id']}/export", json={"dtype": "float32"})
        assert r.status_code == 201, r.text
        export = r.json()
        assert export["name"] == "to-export-export" and export["status"] == "pending" and export["gpus"] == 1
        train = export["spec"]["train"]
        assert train["adc_export_of"] == lora["id"] and train["finetuning_type"] == "lora"
        assert train["adapter_name_or_path"] == http.get(f"/v1/jobs/{lora['id']}").json()["output_dir"]
        assert train["model_name_or_path"] == lora["spec"]["train"]["model_name_or_path"]
        assert train["infer_dtype"] == "float32"
        _run_as_executor(api, export["id"], 1, status="succeeded")
        r = http.post(f"/v1/jobs/{export['id']}/export")
        assert r.status_code == 409 and "itself an export" in r.json()["detail"]
        # A user may not smuggle the export key into an ordinary job.
        r = http.post(
            "/v1/jobs",
            json=api.job_spec(name="sneaky") | {"train": {**api.job_spec()["train"], "adc_export_of": lora["id"]}},
        )
        assert r.status_code == 422 and "adc_export_of" in r.text
    with api.client("other_user") as http:
        assert http.post(f"/v1/jobs/{lora['id']}/export").status_code == 404
