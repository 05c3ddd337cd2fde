"""Job events the executor cannot take as they come: a trainer error with NUL in it (Postgres
refuses NUL in text; it once made every retry fail until JetStream dropped the exit and the job
stayed running) is stored cleaned, and an event that fails on its own is dead-lettered and fails
its job, saying why, instead of leaving it running."""
from __future__ import annotations


async def test_a_nul_in_a_trainer_error_still_fails_the_job_with_its_reason(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "exited", 1, w.node, outcome="failed", exit_code=1,
                   error="RuntimeError: bad byte \x00 in tokenizer.json\x00", progress={"note\x00": "x\x00y"})
    row = await ex.status_becomes(job_id, "failed")
    assert row["status_reason"] == "trainer failed (exit code 1): RuntimeError: bad byte  in tokenizer.json"
    assert (await ex.history(job_id))[-1] == "failed"


async def test_an_event_that_keeps_failing_is_dead_lettered_and_fails_its_job(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "exited", 1, w.node, outcome="exploded", exit_code=3)  # no such outcome: a worker bug
    row = await ex.status_becomes(job_id, "failed", timeout=60)
    assert row["status_reason"].startswith("its exited event (attempt 1) could not be recorded: ValueError:")
    dead = await ex.bus.js.get_last_msg(ex.bus.subjects.dead_letter_stream,
                                        ex.bus.subjects.dead_letters(f"{ex.env.prefix}-executor-jobs"))
    assert b'"exploded"' in dead.data and dead.headers["Adc-Error"].startswith("ValueError:")
    [note] = [a for a in ex.audited("message.dead_lettered") if a.data["subject"].endswith(f".{job_id}.events")]
    assert note.data["deliveries"] == 5
    assert ex.audited("job.failed", job_id)


async def test_evaluation_metrics_are_kept_per_split_and_only_as_finite_numbers(ex):
    w = await ex.worker()
    job_id = await ex.running_job(w)
    await ex.event(job_id, "evaluated", 1, w.node, split="eval", step=2, metrics={"eval_loss": 2.5, "epoch": 0.5})
    await ex.event(job_id, "evaluated", 1, w.node, split="predict", step=4,
                   metrics={"predict_bleu-4": 1.5, "text": "no", "flag": True, "bad\x00": 3, **{f"m{i}": i for i in range(80)}})
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
