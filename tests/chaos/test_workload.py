"""Three jobs at once through one fault after another, on the replicated stack (two of each
controller and api, two workers of two CPU slots):

- `move` (priority high) starts, then `low` (priority low), which best fit puts beside it;
- the decider leader, an audit sink and an api replica are killed (kill -9); `move` is migrated
  to the other node and the executor leader is killed in the middle of that migration;
- `multi` (high, two ranks with gloo) arrives: no node has two free slots, so `low` is preempted
  (checkpoint and requeue) and `multi` takes its node, `low` resuming beside `move`; the decider
  leader is killed again as `multi` arrives;
- NATS is restarted while all three train;
- the worker of `move` and `low` is killed (kill -9; its trainers die with it, by construction) and
  restarted: it reports them stopped at their newest checkpoints, and both resume from there.

Asserted from Postgres and the job folders: every job succeeds at its max_steps; no step is lost
across its attempts, and none is trained twice for `multi` (every move of it is a checkpoint-stop);
`move` and `low`, whose trainers died with their worker, train at most save_steps again; each job's
status history; each decision carried out once, each attempt started once, each protocol done
once; every job's events audited once, event ids unique, the hash chain intact; each leadership
change audited; every service and node healthy again.
Between faults the trainers of `move` and `low` are frozen (SIGSTOP), and thawed where a phase needs
them to train or to checkpoint-stop: each phase then begins while both still have steps to train,
however fast the machine trains a tiny model.
Postgres outages, a frozen worker and a worker cut off from the bus have their own modules.
"""

from __future__ import annotations

import time

import httpx

from tests.chaos.conftest import DONE, lora_job

SAVE_STEPS = 10
# More than `move` and `low` train in the moments they are thawed before their worker is killed.
STEPS = {"low": 400, "move": 450, "multi": 40}
RUN = ["pending", "scheduled", "starting", "running"]


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

    frozen: dict[str, int] = {}  # job -> its frozen trainer's process group

    def freeze(*job_ids: str) -> None:
        for job_id in job_ids:
            frozen[job_id] = chaos.freeze(job_id)

    def thaw(*job_ids: str) -> None:
        for job_id in job_ids:
            chaos.thaw(frozen.pop(job_id))

    def stopping(job_id: str) -> None:
        _until(
            lambda: chaos.sql("SELECT 1 FROM protocols WHERE job_id = $1 AND step = 'stopping'", job_id),
            f"{job_id} asked to checkpoint-stop",
        )

    try:
        move = chaos.submit(_spec(tiny_model, data_dir, "move", "high"))["id"]
        x = chaos.wait_step(move, SAVE_STEPS + 2)["placement"][0]["node"]
        freeze(move)
        low = chaos.submit(_spec(tiny_model, data_dir, "low", "low"))["id"]
        assert chaos.wait_step(low, 1)["placement"][0]["node"] == x, "best fit puts the second job beside the first"
        freeze(low)
        [y] = [n for n in stack.nodes if n != x]

        # Controllers killed while both hold: the other replicas carry on.
        kill(chaos.leader("decider"))
        kill("audit-sink")
        kill("api")
        chaos.http = httpx.Client(base_url=stack.api_urls[1], headers=chaos.http.headers, timeout=30)

        # `move` migrated to the other node; the executor leader killed while the migration waits on the
        # frozen trainer, which then checkpoint-stops for the new leader.
        r = chaos.http.post(f"/v1/jobs/{move}/migrate", json={"target_node": y})
        assert r.status_code == 202, r.text
        stopping(move)
        executor = kill(chaos.leader("executor"))
        thaw(move)
        assert chaos.sql("SELECT 1 FROM protocols WHERE job_id = $1 AND state = 'running'", move), (
            "the migration was over before its executor died"
        )
        _until(
            lambda: (j := chaos.job(move))["attempt"] == 2 and j["status"] == "running",
            "move running on the target",
            timeout=120,
        )
        assert chaos.wait_step(move, 1)["placement"][0]["node"] == y
        freeze(move)
        restart_killed()

        # `multi` needs a whole node: `low` makes room; the decider leader dies as `multi` arrives.
        multi = chaos.submit(_spec(tiny_model, data_dir, "multi", "high", gpus=2))["id"]
        kill(chaos.leader("decider"))
        stopping(low)
        thaw(low)
        _until(lambda: (j := chaos.job(low))["attempt"] == 2 and j["status"] == "running", "low resumed", timeout=120)
        assert chaos.wait_step(low, 1)["placement"][0]["node"] == y
        freeze(low)
        placed = chaos.wait_step(multi, 2, timeout=180)
        assert [(p["node"], len(p["gpus"])) for p in placed["placement"]] == [(x, 2)], placed
        restart_killed()

        # NATS restarted under three trainers (one of them of two ranks). Briefly: a bus gone for half of
        # worker.node_timeout would have every worker checkpoint-stop its trainers (test_cut_off_worker.py);
        # they reconnect well before, and train on in their attempts.
        thaw(move, low)
        chaos.restart_nats(down_s=0.5)
        for job_id in (move, low):  # both train on through it
            chaos.wait_step(job_id, chaos.job(job_id)["progress"]["step"] + 3)

        # The worker of `move` and `low` killed (their trainers frozen, so neither reaches a safe point
        # first): the trainers die with it; restarted, it reports them stopped at their newest checkpoints.
        freeze(move, low)
        kill(f"worker-{y}")
        stack.restart(f"worker-{y}")
        thaw(move, low)
    finally:
        for pgid in frozen.values():
            chaos.thaw(pgid)

    done = {job_id: chaos.wait_for(job_id, DONE, timeout=300) for job_id in (multi, move, low)}
    for name, job_id in (("low", low), ("move", move), ("multi", multi)):
        assert done[job_id]["status"] == "succeeded" and done[job_id]["progress"]["step"] == STEPS[name], done[job_id]

    # Steps: every move of `multi` was a checkpoint-stop, so each of its attempts starts where the last stopped.
    for name, job_id in (("low", low), ("move", move), ("multi", multi)):
        trained = [s for a in range(1, done[job_id]["attempt"] + 1) for s in chaos.progress(job_id, a)]
        if job_id != multi:  # their trainers died with their worker: resumed from the newest checkpoint
            assert sorted(set(trained)) == list(range(1, STEPS[name] + 1)), (name, trained)
            assert len(trained) - len(set(trained)) <= SAVE_STEPS, (name, trained)
        else:
            assert trained == list(range(1, STEPS[name] + 1)), (name, trained)
    [started] = [e for e in chaos.trainer_events(multi, 1) if e["event"] == "started"]
    assert started["world_size"] == 2

    # Each job's story, each decision carried out once, each attempt started once.
    histories = {
        low: RUN + ["checkpointing", "preempted"] + RUN + RUN + ["succeeded"],
        move: RUN + ["checkpointing", "migrating", "starting", "running"] + RUN + ["succeeded"],
        multi: RUN + ["succeeded"],
    }
    for job_id, history in histories.items():
        assert chaos.history(job_id) == history, (job_id, chaos.history(job_id))
    expected = {low: ["start", "preempt", "start", "start"], move: ["start", "migrate", "start"], multi: ["start"]}
    for job_id, actions in expected.items():
        rows = chaos.sql(
            "SELECT action, state FROM decisions WHERE job_id = $1 AND state <> 'refused' ORDER BY received_at", job_id
        )
        assert [(r["action"], r["state"]) for r in rows] == [(a, "done") for a in actions], (job_id, rows)
        starts = [(e["data"]["attempt"], e["node"]) for e in chaos.audit(job_id=job_id, kind="command.start")]
        # A warm move's attempt begins with its go (`protocol.resumed`), not with a start command.
        starts += [
            (e["data"]["attempt"], "go")
            for e in chaos.audit(job_id=job_id, kind="protocol.resumed")
            if e["data"].get("ok")
        ]
        assert sorted(starts) == sorted(set(starts)) and len(starts) == done[job_id]["attempt"], (job_id, starts)
    protocols = chaos.sql(
        "SELECT job_id, kind, state FROM protocols WHERE job_id = ANY($1::text[])", [low, move, multi]
    )
    assert sorted((p["job_id"], p["kind"], p["state"]) for p in protocols) == sorted(
        [(low, "preempt", "done"), (move, "migrate", "done")]
    ), protocols

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
    leading = {
        role: {e["data"]["pid"] for e in chaos.audit(kind=f"{role}.leading")} for role in ("decider", "executor")
    }
    assert set(killed[executor]) <= leading["executor"] and len(leading["executor"]) >= 2, leading
    decider_leaders = [pid for name, pids in killed.items() if name.startswith("decider") for pid in pids]
    assert set(decider_leaders) <= leading["decider"] and len(leading["decider"]) >= 3, leading
    chaos.healthy()
