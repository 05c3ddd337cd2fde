"""Start and cancel decisions and the trainer's events, through the executor's bus interface:
each row says where the job starts, what arrives, and where it must end (or why it is refused)."""

from __future__ import annotations

import pytest

from shared.contracts.actions import Cancel, Fail, NodeGpus, Resume, Start
from shared.contracts.messages import CommandError
from tests.integration.executor.harness import refuse


def start(job_id, node, gpus=(0,), **kw):
    return Start(job_id=job_id, reason="test start", placement=[NodeGpus(node=node, gpus=gpus)], **kw)


async def test_a_start_schedules_sends_the_command_and_is_starting(ex):
    w = await ex.worker()
    job_id = await ex.job()
    did = await ex.decide(start(job_id, w.node, train_overrides={"per_device_train_batch_size": 2}))
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    assert row["status"] == "starting" and row["attempt"] == 1 and row["job_dir"] == f"/jobs/{job_id}"
    assert await ex.history(job_id) == ["pending", "scheduled", "starting"]
    [cmd] = [c for c in w.commands if c.job_id == job_id]
    assert cmd.kind == "start" and cmd.attempt == 1 and cmd.train["per_device_train_batch_size"] == 2
    [audit] = ex.audited("command.start", job_id)
    assert audit.data["ok"] and audit.decision_id == did


@pytest.mark.parametrize(
    "setup,why",
    [
        ("running", "job is running, not pending"),
        ("cancel_requested", "job has a cancel request"),
        ("no_devices", "placement names no devices"),
        ("booked", "devices already booked"),
        ("missing", "no such job"),
    ],
)
async def test_a_start_the_executor_refuses(ex, setup, why):
    w = await ex.worker()
    job_id = "j-missing" if setup == "missing" else await ex.job()
    gpus = (0,)
    if setup == "running":
        job_id = await ex.running_job(w)
    elif setup == "cancel_requested":
        await ex.pool.execute("UPDATE jobs SET cancel_requested = true WHERE id = $1", job_id)
    elif setup == "no_devices":
        gpus = ()
    elif setup == "booked":
        await ex.running_job(w, gpus=(0,))
    did = await ex.decide(start(job_id, w.node, gpus))
    assert await ex.settled(did) == "refused"
    [refusal] = [a for a in ex.audited("decision.refused") if a.decision_id == did]
    assert why in refusal.reason
    assert not [c for c in w.commands if c.job_id == job_id and c.kind == "start" and c.decision_id == did]


@pytest.mark.parametrize("answer", ["refused", "unreachable"])
async def test_a_start_the_worker_does_not_carry_out_requeues_the_job(ex, answer):
    w = await ex.worker()
    if answer == "refused":
        w.replies["start"] = refuse(CommandError.DEVICES_BUSY, "devices in use")
        node = w.node
    else:
        node = "node-nobody"  # no worker listens there
    job_id = await ex.job()
    did = await ex.decide(start(job_id, node))
    assert await ex.settled(did) == "failed"
    row = await ex.row(job_id)
    assert row["status"] == "pending" and row["placement"] is None
    assert await ex.history(job_id) == ["pending", "scheduled", "pending"]
    [audit] = ex.audited("command.start", job_id)
    assert not audit.data["ok"] and audit.data["error"] == ("devices_busy" if answer == "refused" else "unreachable")


async def test_a_redelivered_start_is_not_carried_out_twice(ex):
    w = await ex.worker()
    job_id = await ex.job()
    did = await ex.decide(start(job_id, w.node))
    await ex.settled(did)
    await ex.decide(start(job_id, w.node), decision_id=did, msg_id=did + ":again")
    second = await ex.decide(start(job_id, w.node))  # a later decision that follows it
    assert await ex.settled(second) == "refused"
    assert w.kinds(job_id) == ["start"]


async def test_a_start_redelivered_after_the_move_but_before_its_audit_audits_the_move(ex):
    """An executor killed between scheduling a job and auditing it: the redelivered decision audits it."""
    from services.executor.store import JobStore

    w = await ex.worker()
    job_id = await ex.job()
    did = "crashed-after-the-move"
    store = JobStore(ex.pool, ex.clock)
    action = start(job_id, w.node)
    await store.apply(
        await store.get(job_id), "schedule", reason=action.reason, decision_id=did, placement=action.placement
    )  # committed, never audited
    await ex.decide(action, decision_id=did)
    assert await ex.settled(did) == "done"
    await ex.until(lambda: bool(ex.audited("job.scheduled", job_id)), "job.scheduled audited")
    assert w.kinds(job_id) == ["start"] and await ex.history(job_id) == ["pending", "scheduled", "starting"]


async def test_a_start_redelivered_after_the_launch_but_before_its_audit_audits_the_launch(ex):
    """An executor that failed between committing the launch and auditing it (a publish that did not
    go out, or a crash): the redelivered decision audits the move to starting, under its id, and is
    done; nothing is started again and nothing is refused."""
    from services.executor.store import JobStore

    w = await ex.worker()
    job_id = await ex.job()
    did = "failed-after-the-launch"
    store = JobStore(ex.pool, ex.clock)
    action = start(job_id, w.node)
    job = await store.apply(
        await store.get(job_id), "schedule", reason=action.reason, decision_id=did, placement=action.placement
    )
    await store.apply(job, "launched", reason="trainer process 4242 on " + w.node, decision_id=did, job_dir="/j")
    await ex.decide(action, decision_id=did)
    assert await ex.settled(did) == "done"
    [starting] = await ex.until(lambda: ex.audited("job.starting", job_id), "job.starting audited")
    assert starting.decision_id == did and starting.reason == f"trainer process 4242 on {w.node}"
    assert starting.event_id == f"{job_id}:{job.attempt}:starting"
    assert w.kinds(job_id) == [] and await ex.history(job_id) == ["pending", "scheduled", "starting"]
    assert not ex.audited("decision.refused", job_id)


async def test_a_start_whose_move_does_not_commit_leaves_no_record_and_its_redelivery_starts_it_once(ex):
    """A Start decision is recorded and its job moved in one transaction, before the command: a move that
    cannot commit leaves no record of the decision either (nothing half done for a successor to find),
    sends no command, and the redelivered decision is carried out once, its audit events in order."""
    w = await ex.worker()
    job_id = await ex.job()
    name = f"refuse_move_{job_id.replace('-', '_')}"
    await ex.pool.execute(f"CREATE SEQUENCE {name}")  # counts the tries: nextval survives a rollback
    await ex.pool.execute(
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$"
        f" BEGIN PERFORM nextval('{name}'); RAISE EXCEPTION 'the move of {job_id} does not commit'; END $$"
    )
    await ex.pool.execute(
        f"CREATE TRIGGER {name} BEFORE UPDATE ON jobs FOR EACH ROW WHEN (OLD.id = '{job_id}') EXECUTE FUNCTION {name}()"
    )
    try:
        did = await ex.decide(start(job_id, w.node))
        await ex.until(lambda: _tried(ex, name), "the executor trying to move the job")
        assert await ex.decision_state(did) is None
        assert await ex.history(job_id) == ["pending"] and w.kinds(job_id) == []
    finally:
        await ex.pool.execute(f"DROP TRIGGER {name} ON jobs; DROP FUNCTION {name}(); DROP SEQUENCE {name}")
    assert await ex.settled(did) == "done"  # redelivered (the executor naks a failed decision)
    assert w.kinds(job_id) == ["start"] and await ex.history(job_id) == ["pending", "scheduled", "starting"]
    kinds = await ex.until(
        lambda: len(audits := [a.kind for a in ex.audits if a.job_id == job_id]) >= 3 and audits, "three audits"
    )
    assert kinds == ["job.scheduled", "command.start", "job.starting"]


async def _tried(ex, sequence: str) -> bool:
    return bool(await ex.pool.fetchval(f"SELECT is_called FROM {sequence}"))


# (status the trainer's event finds, event kind, data, status it ends in, transition audited)
EVENTS = [
    ("starting", "started", {}, "running"),
    ("starting", "progress", {"step": 3, "loss": 1.5}, "running"),
    ("running", "exited", {"outcome": "succeeded", "exit_code": 0, "last_event": {"step": 12}}, "succeeded"),
    ("running", "exited", {"outcome": "failed", "exit_code": 1, "error": "boom"}, "failed"),
    ("running", "exited", {"outcome": "killed", "exit_code": -9}, "failed"),
    ("running", "exited", {"outcome": "cancelled", "exit_code": -15}, "cancelled"),
    (
        "running",
        "exited",
        {"outcome": "stopped", "exit_code": 75, "checkpoint": "/c/checkpoint-8", "step": 8},
        "pending",
    ),
    (
        "running",
        "exited",
        {"outcome": "oom", "exit_code": 76, "error": "alloc", "checkpoint": "/c/checkpoint-6", "checkpoint_step": 6},
        "pending",
    ),
    ("starting", "exited", {"outcome": "succeeded", "exit_code": 0}, "succeeded"),
]


@pytest.mark.parametrize(
    "status,kind,data,ends", EVENTS, ids=[f"{s}-{k}-{d.get('outcome', '')}" for s, k, d, _ in EVENTS]
)
async def test_trainer_events(ex, status, kind, data, ends):
    w = await ex.worker()
    job_id = await ex.running_job(w) if status == "running" else await _starting(ex, w)
    await ex.event(job_id, kind, 1, w.node, **data)
    row = await ex.status_becomes(job_id, ends)
    if kind == "progress":
        await ex.until(lambda: _progress_step(ex, job_id), "progress recorded")
    if data.get("outcome") == "stopped":
        assert row["resume_from"] == "/c/checkpoint-8" and row["last_checkpoint_step"] == 8
    if data.get("outcome") == "oom":
        assert row["resume_from"] == "/c/checkpoint-6" and row["oom_retries"] == 1 and row["last_outcome"] == "oom"
        [pending] = [a for a in ex.audited("job.pending", job_id)]
        assert "out of memory" in pending.reason and "out-of-memory exit 1" in pending.reason
    if ends in ("succeeded", "failed", "cancelled"):
        assert row["finished_at"] is not None and row["last_outcome"] == data["outcome"].replace("killed", "killed")


async def _progress_step(ex, job_id):
    return ((await ex.row(job_id))["progress"] or {}).get("step") == 3


async def _starting(ex, w) -> str:
    job_id = await ex.job()
    await ex.settled(await ex.decide(start(job_id, w.node)))
    return job_id


async def test_checkpoints_reported_by_the_worker_only_move_forward(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    out = f"/s/jobs/{job_id}/output"
    await ex.event(job_id, "checkpointed", 1, w.node, step=10, path=f"{out}/checkpoint-10")
    await ex.until(lambda: _checkpoint(ex, job_id, 10), "checkpoint 10")
    await ex.event(job_id, "checkpointed", 1, w.node, step=5, path=f"{out}/checkpoint-5")  # a late, older one
    await ex.event(job_id, "checkpointed", 0, w.node, step=50, path=f"{out}/checkpoint-50")  # a stale attempt
    await ex.event(job_id, "checkpointed", 1, w.node, step=60, path="/s/jobs/jother/output/checkpoint-60")
    await ex.event(job_id, "progress", 1, w.node, step=11)
    await ex.until(lambda: _progress_is(ex, job_id, 11), "progress 11")
    assert (await ex.row(job_id))["last_checkpoint"] == f"{out}/checkpoint-10"
    # Both refusals are audited: the superseded attempt's, and the one outside the job's own folder.
    await ex.until(lambda: len(ex.audited("checkpoint.refused", job_id)) == 2, "two refused checkpoints")
    reasons = sorted(a.reason for a in ex.audited("checkpoint.refused", job_id))
    assert "own output folder" in reasons[0] and "attempt 0 refused: the job is at attempt 1" in reasons[1], reasons


async def _checkpoint(ex, job_id, step):
    return (await ex.row(job_id))["last_checkpoint_step"] == step


async def _progress_is(ex, job_id, step):
    return ((await ex.row(job_id))["progress"] or {}).get("step") == step


async def test_stale_and_non_rank_0_exits_change_nothing(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "exited", 0, w.node, outcome="failed", exit_code=1)
    await ex.event(job_id, "exited", 1, w.node, outcome="failed", exit_code=1, node_rank=1)
    await ex.event(job_id, "progress", 1, w.node, step=4)
    await ex.until(lambda: _progress_is(ex, job_id, 4), "progress after the ignored exits")
    assert (await ex.row(job_id))["status"] == "running"


async def test_the_executor_never_fails_an_out_of_memory_job_on_its_own_a_fail_decision_does(ex):
    w = await ex.worker()
    job_id = await ex.job()
    for attempt in (1, 2, 3):  # past the budget the decider's oom_retry rule used to be: still requeued
        await ex.settled(await ex.decide(start(job_id, w.node)))
        await ex.event(job_id, "started", attempt, w.node)
        await ex.status_becomes(job_id, "running")
        await ex.event(job_id, "exited", attempt, w.node, outcome="oom", exit_code=76, error="CPU alloc failed")
        row = await ex.status_becomes(job_id, "pending")
        assert row["oom_retries"] == attempt and row["last_outcome"] == "oom" and row["finished_at"] is None
    give_up = Fail(
        job_id=job_id, reason="ran out of memory 3 times: failed after 2 retries", reason_code="oom_retry.give_up"
    )
    assert await ex.settled(await ex.decide(give_up, rule="oom_retry")) == "done"
    row = await ex.row(job_id)
    assert row["status"] == "failed" and row["finished_at"] is not None and row["oom_retries"] == 3
    assert "failed after 2 retries" in row["status_reason"]
    assert await ex.history(job_id) == ["pending"] + ["scheduled", "starting", "running", "pending"] * 3 + ["failed"]
    [failed] = ex.audited("job.failed", job_id)
    assert "failed after 2 retries" in failed.reason


async def test_a_fail_decision_for_a_job_that_is_not_pending_is_refused(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    did = await ex.decide(Fail(job_id=job_id, reason="t", reason_code="oom_retry.give_up"))
    assert await ex.settled(did) == "refused"
    assert (await ex.row(job_id))["status"] == "running" and "stop" not in w.kinds(job_id)


@pytest.mark.parametrize("status", ["pending", "scheduled", "running", "paused"])
async def test_cancel(ex, status):
    w = await ex.worker()
    if status == "running":
        job_id = await ex.running_job(w)
    elif status == "scheduled":
        w.replies["start"] = lambda cmd: None  # the start never answers: the job stays scheduled meanwhile
        job_id = await ex.job()
        await ex.decide(start(job_id, w.node))
        await ex.status_becomes(job_id, "scheduled")
    elif status == "paused":
        job_id = await ex.job()
        await ex.pool.execute("UPDATE jobs SET status = 'paused' WHERE id = $1", job_id)
    else:
        job_id = await ex.job()
    did = await ex.decide(Cancel(job_id=job_id, reason="test cancel"))
    if status == "running":  # the worker stops the trainer; its exit says cancelled
        await ex.settled(did)
        assert w.kinds(job_id)[-1] == "cancel"
        await ex.event(job_id, "exited", 1, w.node, outcome="cancelled", exit_code=-15)
    # A start nobody answers holds the job until it times out, on the executor's clock.
    await ex.until_time_passes(lambda: ex._status_is(job_id, "cancelled"), f"job {job_id} cancelled")
    row = await ex.row(job_id)
    assert row["finished_at"] is not None


async def test_a_cancel_request_from_the_api_is_recorded_and_carried_out(ex):
    job_id = await ex.job()
    await ex.event(job_id, "cancel_requested", 0)
    row = await ex.status_becomes(job_id, "cancelled")
    assert row["cancel_requested"] is True


async def test_resume_only_a_paused_job(ex):
    job_id = await ex.job()
    refused = await ex.decide(Resume(job_id=job_id, reason="test"))
    assert await ex.settled(refused) == "refused"
    await ex.pool.execute("UPDATE jobs SET status = 'paused', resume_from = '/c/checkpoint-3' WHERE id = $1", job_id)
    assert await ex.settled(await ex.decide(Resume(job_id=job_id, reason="test"))) == "done"
    row = await ex.status_becomes(job_id, "pending")
    assert row["resume_from"] == "/c/checkpoint-3" and "continue from /c/checkpoint-3" in row["status_reason"]
