"""Three jobs at once through one fault after another, on the replicated stack (two of each
controller and api, two workers of two CPU slots):

- `low` (priority low) and `move` (high) start on one node (best fit puts them together);
- the decider leader, an audit sink and an api replica are killed (kill -9); `move` is migrated
  to the other node and the executor leader is killed in the middle of that migration;
- `multi` (high, two ranks with gloo) arrives: it fits nowhere, so `low` is preempted (checkpoint
  and requeue) and `multi` takes its node; the decider leader is killed again as it arrives;
- NATS is restarted while `multi` and `move` train;
- `move`'s worker is killed (kill -9; its trainer lives on) and restarted: it checkpoint-stops the
  trainer it left, and `move` and `low` resume on that node.

Asserted from Postgres and the job folders: every job succeeds at its max_steps; no step is lost
or trained twice across its attempts (every move here is a checkpoint-stop; if the restarted
worker came back only after its node was called lost, at most save_steps again); each decision
carried out once and each attempt started once; every expected audit event exactly once and the
hash chain intact; each leadership change audited; every service and node healthy again.
Postgres outages, a frozen worker and a worker cut off from the bus have their own modules.
"""
from __future__ import annotations

import time

import httpx

from tests.chaos.conftest import DONE, lora_job

SAVE_STEPS = 10
STEPS = {"low": 120, "move": 120, "multi": 40}


def _spec(tiny_model, data_dir, name: str, priority: str, gpus: int = 1) -> dict:
    spec = lora_job(tiny_model, data_dir, f"w-{name}", STEPS[name], SAVE_STEPS)
    spec.update(priority=priority, gpus=gpus)
    return spec


def _until(predicate, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.1)
    return found


def test_three_jobs_through_every_controller_kill_a_nats_restart_and_a_worker_kill(chaos, tiny_model, data_dir):
    stack = chaos.stack
    killed: dict[str, list[int]] = {}

    def kill(name: str) -> str:
        killed.setdefault(name, []).append(stack.procs[name].pid)
        stack.kill(name)  # SIGKILL
        return name

    def restart_killed() -> None:
        for name in killed:
            if stack.procs[name].poll() is not None:
                stack.restart(name)

    low = chaos.submit(_spec(tiny_model, data_dir, "low", "low"))["id"]
    chaos.wait_step(low, 1)
    move = chaos.submit(_spec(tiny_model, data_dir, "move", "high"))["id"]
    running = chaos.wait_step(move, SAVE_STEPS + 2)
    x = chaos.job(low)["placement"][0]["node"]
    assert running["placement"][0]["node"] == x, "best fit put both single-slot jobs on one node"
    [y] = [n for n in stack.nodes if n != x]

    # Controllers killed while both train: the other replicas carry on.
    kill(chaos.leader("decider"))
    kill("audit-sink")
    kill("api")
    chaos.http = httpx.Client(base_url=stack.api_urls[1], headers=chaos.http.headers, timeout=30)

    # `move` migrated to the other node; the executor leader killed once the migration is under way.
    r = chaos.http.post(f"/v1/jobs/{move}/migrate", json={"target_node": y})
    assert r.status_code == 202, r.text
    _until(lambda: chaos.sql("SELECT 1 FROM protocols WHERE job_id = $1 AND state = 'running'", move),
           "migration under way")
    executor = kill(chaos.leader("executor"))
    _until(lambda: (j := chaos.job(move))["attempt"] == 2 and j["status"] == "running", "move running on the target",
           timeout=120)
    assert chaos.job(move)["placement"][0]["node"] == y
    restart_killed()

    # `multi` needs a whole node: `low` makes room; the decider leader dies as `multi` arrives.
    multi = chaos.submit(_spec(tiny_model, data_dir, "multi", "high", gpus=2))["id"]
    kill(chaos.leader("decider"))
    placed = chaos.wait_step(multi, 2, timeout=180)
    assert [(p["node"], len(p["gpus"])) for p in placed["placement"]] == [(x, 2)], placed
    restart_killed()

    # NATS restarted under two trainers (one of them two ranks).
    chaos.restart_nats(down_s=2.0)
    chaos.wait_step(move, chaos.job(move)["progress"]["step"] + 3)  # trains on through the restart

    # `move`'s worker killed; restarted, it checkpoint-stops the trainer it left behind.
    kill(f"worker-{y}")
    stack.restart(f"worker-{y}")

    done = {job_id: chaos.wait_for(job_id, DONE, timeout=300) for job_id in (multi, move, low)}
    for name, job_id in (("low", low), ("move", move), ("multi", multi)):
        assert done[job_id]["status"] == "succeeded" and done[job_id]["progress"]["step"] == STEPS[name], done[job_id]

    # Steps: every move was a checkpoint-stop, so each attempt starts where the last one stopped.
    requeue_reasons = [e["reason"] for e in chaos.audit(job_id=move, kind="job.pending")]
    node_lost_first = any("was lost" in r for r in requeue_reasons)  # a slow restart: the node timed out first
    for name, job_id in (("low", low), ("move", move), ("multi", multi)):
        trained = [chaos.progress(job_id, a) for a in range(1, done[job_id]["attempt"] + 1)]
        if job_id == move and node_lost_first:
            flat = [s for steps in trained for s in steps]
            assert sorted(set(flat)) == list(range(1, STEPS[name] + 1)), trained
            assert len(flat) - len(set(flat)) <= SAVE_STEPS, trained
        else:
            assert [s for steps in trained for s in steps] == list(range(1, STEPS[name] + 1)), (name, trained)
    [started] = [e for e in chaos.trainer_events(multi, 1) if e["event"] == "started"]
    assert started["world_size"] == 2

    # Each job's story, each decision carried out once, each attempt started once.
    assert chaos.history(low) == ["pending", "scheduled", "starting", "running", "checkpointing", "preempted",
                                  "pending", "scheduled", "starting", "running", "succeeded"], chaos.history(low)
    assert chaos.history(multi) == ["pending", "scheduled", "starting", "running", "succeeded"]
    assert chaos.history(move)[:8] == ["pending", "scheduled", "starting", "running", "checkpointing", "migrating",
                                       "starting", "running"], chaos.history(move)
    assert chaos.history(move)[8:] == ["pending", "scheduled", "starting", "running", "succeeded"], chaos.history(move)
    expected = {low: ["start", "preempt", "start"], move: ["start", "migrate", "start"], multi: ["start"]}
    for job_id, actions in expected.items():
        rows = chaos.sql("SELECT action, state FROM decisions WHERE job_id = $1 AND state <> 'refused' "
                         "ORDER BY received_at", job_id)
        assert [(r["action"], r["state"]) for r in rows] == [(a, "done") for a in actions], (job_id, rows)
        starts = [(e["data"]["attempt"], e["node"]) for e in chaos.audit(job_id=job_id, kind="command.start")]
        assert sorted(starts) == sorted(set(starts)) and len(starts) == done[job_id]["attempt"], (job_id, starts)
    protocols = chaos.sql("SELECT job_id, kind, state FROM protocols WHERE job_id = ANY($1::text[])", [low, move, multi])
    assert sorted((p["job_id"], p["kind"], p["state"]) for p in protocols) == sorted(
        [(low, "preempt", "done"), (move, "migrate", "done")]), protocols

    # The audit trail: each job's events exactly once, leadership changes named, the chain intact.
    for job_id in (low, move, multi):
        trail = chaos.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], timeout=90, job_id=job_id)
        kinds = [e["kind"] for e in trail]
        assert kinds.count("job.submitted") == 1 and kinds.count("job.succeeded") == 1, kinds
        assert kinds.count("job.running") == done[job_id]["attempt"], kinds
    assert [e["kind"] for e in chaos.audit(job_id=low, kind="job.preempted")] == ["job.preempted"]
    ids = [e["event_id"] for e in chaos.audit(limit=1000)]
    assert len(ids) == len(set(ids))
    assert chaos.chain_breaks() is None
    leading = {role: {e["data"]["pid"] for e in chaos.audit(kind=f"{role}.leading")} for role in ("decider", "executor")}
    assert set(killed[executor]) <= leading["executor"] and len(leading["executor"]) >= 2, leading
    decider_leaders = [pid for name, pids in killed.items() if name.startswith("decider") for pid in pids]
    assert set(decider_leaders) <= leading["decider"] and len(leading["decider"]) >= 3, leading
    chaos.healthy()
