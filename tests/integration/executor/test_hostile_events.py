"""Job events the executor cannot take as they come: a trainer error with NUL in it (Postgres
refuses NUL in text; it once made every retry fail until JetStream dropped the exit and the job
stayed running) is stored cleaned, and an event that fails on its own is dead-lettered and fails
its job, saying why, instead of leaving it running."""

from __future__ import annotations

from tests.integration.executor.harness import unique


async def test_a_nul_in_a_trainer_error_still_fails_the_job_with_its_reason(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(
        job_id,
        "exited",
        1,
        w.node,
        outcome="failed",
        exit_code=1,
        error="RuntimeError: bad byte \x00 in tokenizer.json\x00",
        progress={"note\x00": "x\x00y"},
    )
    row = await ex.status_becomes(job_id, "failed")
    assert row["status_reason"] == "trainer failed (exit code 1): RuntimeError: bad byte  in tokenizer.json"
    assert (await ex.history(job_id))[-1] == "failed"


async def test_an_event_that_keeps_failing_is_dead_lettered_and_fails_its_job(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "exited", 1, w.node, outcome="exploded", exit_code=3)  # no such outcome: a worker bug
    row = await ex.status_becomes(job_id, "failed", timeout=60)
    assert row["status_reason"].startswith("its exited event (attempt 1) could not be recorded: ValueError:")
    admin = await ex.env.bus("admin")  # an operator reads the dead letters
    try:
        dead = await admin.js.get_last_msg(
            admin.subjects.dead_letter_stream, admin.subjects.dead_letters(f"{ex.env.prefix}-executor-jobs")
        )
    finally:
        await admin.close()
    assert b'"exploded"' in dead.data and dead.headers["Adc-Error"].startswith("ValueError:")
    [note] = [a for a in ex.audited("message.dead_lettered") if a.data["subject"].endswith(f".{job_id}.events")]
    assert note.data["deliveries"] == 5
    assert ex.audited("job.failed", job_id)


async def test_evaluation_metrics_are_kept_per_split_and_only_as_finite_numbers(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "evaluated", 1, w.node, split="eval", step=2, metrics={"eval_loss": 2.5, "epoch": 0.5})
    await ex.event(
        job_id,
        "evaluated",
        1,
        w.node,
        split="predict",
        step=4,
        metrics={"predict_bleu-4": 1.5, "text": "no", "flag": True, "bad\x00": 3, **{f"m{i}": i for i in range(80)}},
    )
    await ex.event(job_id, "evaluated", 1, w.node, split="../etc", step=5, metrics={"eval_loss": 0.0})  # dropped
    await ex.event(job_id, "evaluated", 2, w.node, split="eval", step=9, metrics={"eval_loss": 9.0})  # stale attempt
    await ex.event(job_id, "evaluated", 1, w.node, split="eval", step=4, metrics={"eval_loss": 2.25})
    await ex.until(lambda: _evaluated_to(ex, job_id, 4), "the last evaluated event recorded", 10)
    evaluation = (await ex.row(job_id))["evaluation"]
    assert evaluation["eval"] == {"step": 4, "eval_loss": 2.25}
    predict = evaluation["predict"]
    assert predict["step"] == 4 and predict["predict_bleu-4"] == 1.5 and predict["bad"] == 3.0
    assert "text" not in predict and "flag" not in predict and len(predict) == 1 + 64 - 2
    assert set(evaluation) == {"eval", "predict"}


async def _evaluated_to(ex, job_id: str, step: int) -> bool:
    return ((await ex.row(job_id))["evaluation"].get("eval") or {}).get("step") == step


async def test_a_trainer_event_from_a_node_the_job_is_not_on_changes_nothing_and_is_audited(ex):
    """Each worker publishes on its own node's subject; the executor takes events only from the job's own nodes."""
    from shared.infra.rejections import count

    w, other = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(w)
    before = count("job_events", "not_placed")
    await ex.event(job_id, "exited", 1, other.node, outcome="failed", exit_code=1, error="forged by another node")
    await ex.event(job_id, "progress", 1, w.node, step=7)  # the job's own node, after it
    row = await ex.until(lambda: _progressed(ex, job_id), "the real node's progress")
    assert row["status"] == "running" and row["progress"]["step"] == 7
    [ignored] = await ex.until(lambda: ex.audited("event.ignored", job_id), "the audit of the ignored event")
    assert ignored.node == other.node and ignored.action == "exited" and w.node in ignored.reason
    assert count("job_events", "not_placed") == before + 1


async def _progressed(ex, job_id: str):
    row = await ex.row(job_id)
    return row if (row["progress"] or {}).get("step") == 7 else None


async def test_a_heartbeat_naming_another_node_than_its_subject_is_ignored(ex):
    """A worker key publishes only on its own node's subject; a payload claiming another node is forged."""
    from shared.contracts.messages import Device, Heartbeat

    node, ghost = unique("honest-"), unique("ghost-")
    bus = await ex.env.bus(f"worker-{node}")
    try:
        for name in (ghost, node):  # the forgery first, on the honest node's own subject
            beat = Heartbeat(node=name, ts=ex.clock.now(), started_at=ex.started, devices=[Device(index=0, kind="cpu")])
            await bus.nc.publish(bus.subjects.heartbeat(node), beat.encode())
        await ex.until(lambda: ex.node_status(node), f"node {node} registered")
        assert await ex.node_status(ghost) is None
    finally:
        await bus.close()


async def test_a_cancel_request_from_a_worker_is_refused_and_audited(ex):
    """A cancel request counts only on the api's own subject (and with its signature), never a worker's."""
    from shared.contracts.messages import JobEvent

    w = await ex.worker()
    job_id = await ex.running_job(w)
    worker = await ex.reporter(f"worker-{w.node}")
    forged = JobEvent(job_id=job_id, kind="cancel_requested", ts=ex.clock.now(), actor="someone (user, team other)")
    await worker.publish_js(worker.subjects.job_events(job_id, w.node), forged, forged.event_id, signed=True)
    [refused] = await ex.until(lambda: ex.audited("event.refused", job_id), "the refusal")
    assert refused.reason.endswith(f"a cancel_requested event from '{w.node}': only the api sends those")
    row = await ex.row(job_id)
    assert row["status"] == "running" and not row["cancel_requested"] and "cancel" not in w.kinds(job_id)
    await ex.event(job_id, "cancel_requested", 1)  # the api's own, signed: carried out
    await ex.until(lambda: "cancel" in w.kinds(job_id), "the cancel command")


async def test_a_worker_cannot_speak_for_another_node_in_a_job_event(ex):
    """Another node's worker names the job's own node in its event: its subject gives it away."""
    from shared.contracts.messages import JobEvent

    w, other = await ex.worker(), await ex.worker()
    job_id = await ex.running_job(w)
    impostor = await ex.reporter(f"worker-{other.node}")
    forged = JobEvent(
        job_id=job_id,
        kind="exited",
        ts=ex.clock.now(),
        attempt=1,
        node=w.node,
        data={"outcome": "failed", "exit_code": 1, "error": "forged"},
    )
    await impostor.publish_js(impostor.subjects.job_events(job_id, other.node), forged, forged.event_id, signed=True)
    [refused] = await ex.until(lambda: ex.audited("event.refused", job_id), "the refusal")
    assert refused.reason.endswith(f"published by node '{other.node}' for node '{w.node}'") and refused.node == w.node
    assert (await ex.row(job_id))["status"] == "running"
