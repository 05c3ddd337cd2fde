"""Migrate, scale, tune, preempt and pause through the bus, step by step, with recording workers:
each ends where it must, the refused ones change nothing, and a restarted executor resumes one."""

from __future__ import annotations

import pytest

from shared.contracts.actions import Cordon, Migrate, NodeGpus, Pause, Preempt, Scale, Start, Tune
from shared.contracts.messages import CommandError, CommandResult
from tests.integration.executor.harness import refuse, unique


def on(node, *gpus):
    return [NodeGpus(node=node, gpus=gpus)]


async def test_migrate_stops_at_a_checkpoint_and_resumes_on_the_target(ex):
    a, b = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="test", placement=on(b.node, 1)))
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    assert row["status"] == "starting" and row["attempt"] == 2 and row["placement"] == [{"node": b.node, "gpus": [1]}]
    assert row["resume_from"] == f"/jobs/{job_id}/output/checkpoint-20" and row["last_checkpoint_step"] == 20
    # Warm: the target was prepared (attempt 2, no checkpoint yet) before the source was asked to stop.
    assert a.kinds(job_id) == ["start", "stop"] and b.kinds(job_id) == ["prepare", "go"]
    prepare, go = b.commands
    assert prepare.attempt == 2 and prepare.resume_from is None and prepare.train
    assert go.resume_from == row["resume_from"] and go.attempt == 2
    assert await ex.history(job_id) == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "checkpointing",
        "migrating",
        "starting",
    ]
    kinds = [e.kind for e in ex.audits if e.decision_id == did]
    assert (
        kinds.index("protocol.started")
        < kinds.index("protocol.prepared")
        < kinds.index("command.stop")
        < kinds.index("protocol.resumed")
        < kinds.index("protocol.done")
    )
    resumed = next(e for e in ex.audits if e.decision_id == did and e.kind == "protocol.resumed")
    assert resumed.data["ok"] and resumed.data["warm"] and resumed.data["since_stopped_s"] is not None


async def test_a_target_that_fails_to_get_ready_leaves_the_source_untouched(ex):
    a, b = await ex.worker(), await ex.worker()
    b.replies["prepare"] = refuse(CommandError.NOT_READY, "warm trainer: it exited with code 1 while preparing")
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="test", placement=on(b.node, 1)))
    assert await ex.settled(did) == "failed"
    row = await ex.row(job_id)
    assert row["status"] == "running" and row["attempt"] == 1 and row["placement"] == [{"node": a.node, "gpus": [0]}]
    assert a.kinds(job_id) == ["start"]  # never asked to stop
    assert b.kinds(job_id) == ["prepare", "cancel"] and b.commands[-1].attempt == 2
    [failed] = [e for e in ex.audits if e.decision_id == did and e.kind == "protocol.prepare_failed"]
    assert "trains on" in failed.reason and failed.data["attempt"] == 2
    proto = await ex.pool.fetchrow("SELECT state, error FROM protocols WHERE id = $1", did)
    assert proto["state"] == "rolled_back" and "source trains on" in proto["error"]


async def test_a_go_the_target_does_not_take_falls_back_to_a_cold_start_there(ex):
    a, b = await ex.worker(), await ex.worker()
    b.replies["go"] = refuse(CommandError.NOT_RUNNING, "no prepared attempt 2")
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="test", placement=on(b.node, 1)))
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    assert row["status"] == "starting" and row["attempt"] == 2 and row["placement"] == [{"node": b.node, "gpus": [1]}]
    assert b.kinds(job_id) == ["prepare", "go", "cancel", "start"]
    assert b.commands[-1].resume_from == row["resume_from"]


async def test_a_job_that_finishes_before_it_stops_drops_its_prepared_target(ex):
    a, b = await ex.worker(), await ex.worker()
    a.replies["stop"] = lambda cmd: CommandResult(command_id=cmd.command_id, ok=True, outcome="succeeded", step=50)
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="test", placement=on(b.node, 1)))
    assert await ex.settled(did) == "failed"
    assert b.kinds(job_id) == ["prepare", "cancel"] and b.commands[-1].attempt == 2


@pytest.mark.parametrize(
    "kind,ends,history_tail",
    [
        ("preempt", "pending", ["checkpointing", "preempted", "pending"]),
        ("pause", "paused", ["checkpointing", "paused"]),
        ("scale", "starting", ["checkpointing", "resizing", "starting"]),
        ("tune", "starting", ["checkpointing", "migrating", "starting"]),
    ],
)
async def test_each_protocol_ends_where_it_must(ex, kind, ends, history_tail):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    action = {
        "preempt": lambda: Preempt(job_id=job_id, reason="t"),
        "pause": lambda: Pause(job_id=job_id, reason="t"),
        "scale": lambda: Scale(job_id=job_id, reason="t", placement=on(w.node, 0, 1)),
        "tune": lambda: Tune(
            job_id=job_id, reason="t", env={"NCCL_ALGO": "Ring"}, train_overrides={"per_device_train_batch_size": 2}
        ),
    }[kind]()
    assert await ex.settled(await ex.decide(action)) == "done"
    row = await ex.row(job_id)
    assert row["status"] == ends and (await ex.history(job_id))[4:] == history_tail
    if ends in ("pending", "paused"):
        assert row["placement"] is None and row["resume_from"].endswith("checkpoint-20")
    if kind == "tune":  # restarted in place with the settings, which stay with the job
        assert w.commands[-1].env["NCCL_ALGO"] == "Ring" and row["env"] == {"NCCL_ALGO": "Ring"}
        assert w.commands[-1].train["per_device_train_batch_size"] == 2  # a smaller micro-batch, kept too
        assert row["train_overrides"] == {"per_device_train_batch_size": 2}
    if kind == "scale":
        assert w.commands[-1].placement == on(w.node, 0, 1)


@pytest.mark.parametrize(
    "why,make",
    [
        ("only a running job", "pending"),
        ("not a live, ready node", "dead_target"),
        ("are not free", "busy_target"),
        ("placement names no devices", "empty_scale"),
        ("placement names no devices on", "node_only_migrate"),
        ("is mid-pause", "busy_job"),
    ],
)
async def test_a_protocol_the_executor_refuses_changes_nothing(ex, why, make):
    w = await ex.worker()
    job_id = await ex.job() if make == "pending" else await ex.running_job(w)
    action = Migrate(job_id=job_id, reason="t", placement=on(w.node, 1))
    if make == "dead_target":
        action = Migrate(job_id=job_id, reason="t", placement=on("node-gone", 0))
    elif make == "busy_target":
        other = await ex.worker()
        await ex.running_job(other, gpus=(0,))
        action = Migrate(job_id=job_id, reason="t", placement=on(other.node, 0))
    elif make == "empty_scale":
        action = Scale(job_id=job_id, reason="t", placement=[])
    elif make == "node_only_migrate":  # the executor never picks devices: the decider completes moves
        action = Migrate(job_id=job_id, reason="t", placement=[NodeGpus(node=w.node, gpus=())])
    elif make == "busy_job":  # a pause left running by an executor that died
        await ex.pool.execute(
            "INSERT INTO protocols (id, job_id, kind, step) VALUES ($1, $2, 'pause', 'stopping')", unique("p"), job_id
        )
    before = await ex.history(job_id)
    did = await ex.decide(action)
    assert await ex.settled(did) == "refused"
    assert why in next(a.reason for a in ex.audited("decision.refused") if a.decision_id == did)
    assert await ex.history(job_id) == before and "stop" not in w.kinds(job_id)


async def test_a_target_that_refuses_rolls_back_to_the_source(ex):
    a, b = await ex.worker(), await ex.worker()
    # Ready while the source trains, gone once it has stopped: neither the go nor a cold start is taken.
    b.replies["go"] = refuse(CommandError.NOT_RUNNING, "no prepared attempt 2")
    b.replies["start"] = refuse(CommandError.NO_SUCH_DEVICE, "no device 1")
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="t", placement=on(b.node, 1)))
    assert await ex.settled(did) == "failed"  # the move failed, the job did not
    row = await ex.row(job_id)
    assert row["status"] == "starting" and row["placement"] == [{"node": a.node, "gpus": [0]}] and row["attempt"] == 3
    proto = await ex.pool.fetchrow("SELECT state, error FROM protocols WHERE id = $1", did)
    assert proto["state"] == "rolled_back" and "restarted on the source" in proto["error"]
    [rollback] = ex.audited("protocol.rollback", job_id)
    assert rollback.data["on_target_failure"] == "restart_source"  # the default of a decision naming none
    assert (await ex.history(job_id))[4:] == ["checkpointing", "migrating", "migrating", "starting"]


async def test_a_rollback_with_the_source_gone_requeues(ex):
    a, b = await ex.worker(), await ex.worker()
    b.replies["go"] = b.replies["start"] = refuse(CommandError.DEVICES_BUSY)
    job_id = await ex.running_job(a)
    assert await ex.settled(await ex.decide(Cordon(node=a.node, reason="t"))) == "done"
    did = await ex.decide(Migrate(job_id=job_id, reason="t", placement=on(b.node, 1)))
    assert await ex.settled(did) == "failed"
    row = await ex.row(job_id)
    assert row["status"] == "pending" and row["resume_from"].endswith("checkpoint-20")
    [rollback] = ex.audited("protocol.rollback", job_id)
    assert "the source cannot take it back" in rollback.reason and "requeued" in rollback.reason


async def test_a_move_whose_rule_says_requeue_is_requeued_though_the_source_is_free(ex):
    a, b = await ex.worker(), await ex.worker()
    b.replies["go"] = b.replies["start"] = refuse(CommandError.NO_SUCH_DEVICE, "no device 1")
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="t", placement=on(b.node, 1)), on_target_failure="requeue")
    assert await ex.settled(did) == "failed"
    row = await ex.row(job_id)
    assert row["status"] == "pending" and row["placement"] is None and row["resume_from"].endswith("checkpoint-20")
    assert a.kinds(job_id) == ["start", "stop"]  # never restarted on the source
    [rollback] = ex.audited("protocol.rollback", job_id)
    assert rollback.data["on_target_failure"] == "requeue" and rollback.data["failure_error"] == "no_such_device"
    proto = await ex.pool.fetchrow("SELECT state, error FROM protocols WHERE id = $1", did)
    assert proto["state"] == "rolled_back" and "requeued" in proto["error"]


async def test_a_preempted_job_that_once_ran_out_of_memory_reads_as_stopped_not_out_of_memory(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "exited", 1, w.node, outcome="oom", exit_code=76, error="alloc")
    assert (await ex.status_becomes(job_id, "pending"))["last_outcome"] == "oom"
    retry = Start(job_id=job_id, reason="t", placement=on(w.node, 0))
    assert await ex.settled(await ex.decide(retry)) == "done"
    await ex.event(job_id, "started", 2, w.node)
    await ex.status_becomes(job_id, "running")
    assert await ex.settled(await ex.decide(Preempt(job_id=job_id, reason="t"))) == "done"
    row = await ex.row(job_id)
    # The decider's oom_retry rule reads last_outcome: this attempt ended at the preemption's stop.
    assert row["status"] == "pending" and row["last_outcome"] == "stopped" and row["oom_retries"] == 1


async def test_a_stop_that_fails_is_escalated_to_a_kill_and_the_newest_checkpoint(ex):
    a, b = await ex.worker(), await ex.worker()
    a.replies["stop"] = refuse(CommandError.STOP_FAILED, "trainer exited with code 1")
    a.replies["cancel"] = lambda cmd: CommandResult(
        command_id=cmd.command_id, ok=True, checkpoint=f"/jobs/{cmd.job_id}/output/checkpoint-15", step=15
    )
    job_id = await ex.running_job(a)
    did = await ex.decide(Migrate(job_id=job_id, reason="t", placement=on(b.node, 0)))
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    assert row["resume_from"].endswith("checkpoint-15") and a.kinds(job_id) == ["start", "stop", "cancel"]
    assert [e for e in ex.audited("protocol.escalated", job_id) if "checkpoint-15" in e.reason]


async def test_a_stop_nobody_answers_times_out_and_is_escalated(ex):
    a, _target = await ex.worker(), await ex.worker()
    a.replies["stop"] = lambda cmd: None  # a stuck checkpoint: the worker never answers
    job_id = await ex.running_job(a)
    await ex.event(job_id, "checkpointed", 1, a.node, step=10, path=f"/s/jobs/{job_id}/output/checkpoint-10")
    await ex.until(lambda: _ckpt(ex, job_id), "checkpoint recorded")
    did = await ex.decide(Preempt(job_id=job_id, reason="t"))
    await ex.until(lambda: [c for c in a.commands if c.job_id == job_id and c.kind == "stop"], "stop sent")
    assert await ex.decision_state(did) == "received"  # stuck: nothing moves until controller.timeout passes
    # controller.timeout (1 s here) for each of two stop attempts, on the executor's clock: no real waiting.
    ex.clock.advance(ex.config.controller.timeout)
    await ex.until(
        lambda: len([c for c in a.commands if c.job_id == job_id and c.kind == "stop"]) == 2,
        "the stop sent again after the first timed out",
    )
    ex.clock.advance(ex.config.controller.timeout)
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    # The fake's cancel names no checkpoint: the last one the worker reported is used.
    assert row["status"] == "pending" and row["resume_from"] == f"/s/jobs/{job_id}/output/checkpoint-10"


async def _ckpt(ex, job_id):
    return (await ex.row(job_id))["last_checkpoint_step"] == 10


async def test_a_redelivered_protocol_decision_is_not_redone(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    did = await ex.decide(Preempt(job_id=job_id, reason="t"))
    await ex.settled(did)
    await ex.decide(Preempt(job_id=job_id, reason="t"), decision_id=did, msg_id=did + ":again")
    await ex.decide(Preempt(job_id=job_id, reason="t"), decision_id=did + "x")
    assert await ex.settled(did + "x") == "refused"
    assert w.kinds(job_id).count("stop") == 1


async def test_a_restarted_executor_resumes_a_protocol_at_its_step(ex):
    a, b = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(a)
    await ex.stop_executor()
    # What a killed executor left: the job checkpointed, the protocol recorded at `placing`.
    did = unique("d")
    await ex.pool.execute("UPDATE jobs SET status = 'checkpointing' WHERE id = $1", job_id)
    await ex.pool.execute(
        "INSERT INTO decisions (decision_id, job_id, rule, action, payload, state) VALUES ($1, $2, 't', 'migrate',"
        " '{}', 'received')",
        did,
        job_id,
    )
    await ex.pool.execute(
        "INSERT INTO protocols (id, job_id, kind, step, source, target, checkpoint, ckpt_step) VALUES"
        " ($1, $2, 'migrate', 'placing', $3, $4, '/c/checkpoint-7', 7)",
        did,
        job_id,
        [{"node": a.node, "gpus": [0]}],
        [{"node": b.node, "gpus": [0]}],
    )
    await ex.start_executor()
    assert await ex.settled(did) == "done"
    row = await ex.row(job_id)
    assert (
        row["status"] == "starting"
        and row["placement"][0]["node"] == b.node
        and row["resume_from"] == "/c/checkpoint-7"
    )
    assert [e for e in ex.audited("protocol.resumed", job_id) if "placing" in e.reason]
