"""`kill -9` of each controller while a job trains, on the replicated stack (two of each):
the decider leader, an audit sink, an api replica, then the executor leader in the middle of a
pause (its checkpoint-stop under way). The standbys take over, the pause completes, the job
resumes from the pause's checkpoint and finishes: no step lost or repeated, no action twice,
every audit event once, the chain intact, every service back."""
from __future__ import annotations

import time

import httpx

from tests.chaos.conftest import lora_job

STEPS, SAVE_STEPS = 40, 5


def _wait(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.05)


def test_every_controller_killed_in_turn_loses_and_doubles_nothing(chaos, tiny_model, data_dir):
    stack = chaos.stack
    job_id = chaos.submit(lora_job(tiny_model, data_dir, "through-kills", STEPS, SAVE_STEPS))["id"]
    chaos.wait_for(job_id, {"running"}, timeout=120)
    killed = []

    def kill(name: str) -> None:
        pid = stack.procs[name].pid
        stack.kill(name)  # SIGKILL
        killed.append((name, pid))

    # The decider leader, an audit sink and the first api: the other replicas carry on meanwhile.
    kill(chaos.leader("decider"))
    kill("audit-sink")
    kill("api")
    chaos.http = httpx.Client(base_url=stack.api_urls[1], headers=chaos.http.headers, timeout=30)
    assert chaos.job(job_id)["status"] == "running"
    for name, _ in killed:
        stack.restart(name)

    # The executor leader, mid-protocol: once the pause is recorded and its stop sent.
    r = chaos.http.post(f"/v1/jobs/{job_id}/pause")
    assert r.status_code == 202, r.text
    _wait(lambda: chaos.sql("SELECT 1 FROM protocols WHERE job_id = $1 AND state = 'running'", job_id),
          "the pause protocol under way")
    executor = chaos.leader("executor")
    kill(executor)
    chaos.wait_for(job_id, {"paused"}, timeout=90, may_be_dead={executor})
    stack.restart(executor)
    assert chaos.stack.check_alive() == []

    r = chaos.http.post(f"/v1/jobs/{job_id}/resume")
    assert r.status_code == 202, r.text
    done = chaos.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout=180)
    assert done["status"] == "succeeded" and done["progress"]["step"] == STEPS, done

    # No step lost, none repeated: the resumed attempt starts right after the pause's checkpoint.
    [protocol] = chaos.sql("SELECT id, state, kind FROM protocols WHERE job_id = $1", job_id)
    assert protocol["state"] == "done" and protocol["kind"] == "pause"
    first = [e["step"] for e in chaos.trainer_events(job_id, 1) if e["event"] == "progress"]
    second = [e["step"] for e in chaos.trainer_events(job_id, 2) if e["event"] == "progress"]
    stopped_at = [e["step"] for e in chaos.trainer_events(job_id, 1) if e["event"] == "stopped"]
    [resumed] = [e for e in chaos.trainer_events(job_id, 2) if e["event"] == "started"]
    assert stopped_at == [first[-1]] and resumed["resumed_from"].endswith(f"checkpoint-{first[-1]}")
    assert first + second == list(range(1, STEPS + 1))

    # Each action once: one pause carried out, one start per attempt.
    history = [r["new_status"] for r in chaos.sql(
        "SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job_id)]
    assert history == ["pending", "scheduled", "starting", "running", "checkpointing", "paused",
                       "pending", "scheduled", "starting", "running", "succeeded"], history
    states = chaos.sql("SELECT action, state FROM decisions WHERE job_id = $1 ORDER BY received_at", job_id)
    assert [(r["action"], r["state"]) for r in states if r["state"] != "refused"] == [
        ("start", "done"), ("pause", "done"), ("resume", "done"), ("start", "done")], states

    # Leadership changed hands, each change audited naming host and pid; every job event once.
    for role in ("decider", "executor"):
        leading = chaos.wait_audit(lambda t: len({e["data"]["pid"] for e in t}) >= 2, timeout=30,
                                   kind=f"{role}.leading")
        assert all(e["data"]["host"] and e["data"]["token"] for e in leading)
    killed_executor_pid = dict(killed)[executor]
    assert killed_executor_pid in {e["data"]["pid"] for e in chaos.audit(kind="executor.leading")}
    expected = ["job.submitted", "job.scheduled", "job.starting", "job.running", "job.checkpointing", "job.paused",
                "job.pending", "job.succeeded"]
    trail = chaos.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], timeout=90, job_id=job_id)
    kinds = [e["kind"] for e in trail]
    for kind in expected:
        assert kinds.count(kind) == (2 if kind in ("job.scheduled", "job.starting", "job.running") else 1), (kind, kinds)
    ids = [e["event_id"] for e in chaos.audit(limit=1000)]
    assert len(ids) == len(set(ids))
    assert chaos.chain_breaks() is None

    for url in stack.api_urls:
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    assert stack.check_alive() == []
