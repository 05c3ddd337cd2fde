"""A trainer's events become short spans of the attempt's trace, on the trainer's times (kept
within the attempt), each linked to the one before; the trainer's values are not trusted."""

from __future__ import annotations

from shared.infra import tracing
from shared.infra.clock import ManualClock
from tests.spans import recording_spans
from worker import trainer_spans


def test_an_attempts_events_become_a_chain_of_child_spans():
    spans = recording_spans()
    clock = ManualClock(1000.0)
    with tracing.span("worker", "command start", job_id="j1") as start:
        trainer_spans.begin("j1", 1, "node-1", clock)
    events = [
        {"event": "started", "ts": 1004.0, "max_steps": 20, "samples": 64, "resumed_from": None},
        {"event": "progress", "ts": 1005.0, "step": 5, "loss": 2.0},
        {"event": "progress", "ts": 1006.0, "step": 10, "loss": 1.5},
        {"event": "evaluated", "ts": 1006.5, "split": "eval", "step": 10, "metrics": {"eval_loss": 1.4, "x": "no"}},
        {"event": "checkpointed", "ts": 1007.0, "step": 10, "path": "/out/checkpoint-10"},
        {"event": "progress", "ts": 1008.0, "step": 15, "loss": float("nan")},
        {"event": "progress", "ts": 5000.0, "step": 20, "loss": 1.0},  # a trainer's clock in the future
        {"event": "succeeded", "ts": 1009.0, "step": 20},
    ]
    for e in events:
        clock.advance(e["ts"] - clock.now() if e["ts"] < 2000 else 0.5)
        trainer_spans.event("j1", 1, e)
    clock.advance(1.0)
    trainer_spans.exited("j1", 1, "succeeded", 0)
    trainer_spans.event("j1", 1, {"event": "progress", "ts": 1011.0, "step": 21})  # after the exit: nothing

    got = [s for s in spans.get_finished_spans() if s.name != "command start"]
    assert [s.name for s in got] == [
        "trainer load",
        "train steps 5-10",
        "evaluate eval",
        "checkpoint",
        "train steps 15-20",
        "trainer exit",
    ]
    assert all(s.parent.span_id == start.get_span_context().span_id for s in got)
    assert all(s.context.trace_id == start.get_span_context().trace_id for s in got)
    at = {s.name: (s.start_time / 1e9, s.end_time / 1e9) for s in got}
    assert at["trainer load"] == (1000.0, 1004.0)  # launch to started: model and dataset loading
    assert at["train steps 5-10"] == (1004.0, 1006.0)
    assert at["evaluate eval"] == (1006.0, 1006.5)
    assert at["checkpoint"] == (1006.5, 1007.0)
    assert at["train steps 15-20"][1] <= clock.now()  # not in the trainer's future
    # Each span links the one before it: the attempt reads as a chain.
    for before, after in zip(got, got[1:]):
        assert [link.context.span_id for link in after.links] == [before.context.span_id]
    attrs = {s.name: dict(s.attributes) for s in got}
    assert attrs["checkpoint"]["adc.step"] == 10 and attrs["checkpoint"]["adc.path"] == "/out/checkpoint-10"
    assert attrs["evaluate eval"]["adc.metric.eval_loss"] == 1.4 and "adc.metric.x" not in attrs["evaluate eval"]
    assert attrs["trainer load"]["adc.max_steps"] == 20 and attrs["trainer load"]["adc.samples"] == 64
    assert attrs["trainer exit"]["adc.outcome"] == "succeeded" and attrs["trainer exit"]["adc.exit_code"] == 0
    assert attrs["train steps 15-20"]["adc.loss"] == 1.0
    assert all(a["adc.job_id"] == "j1" and a["adc.attempt"] == 1 and a["adc.node"] == "node-1" for a in attrs.values())


def test_nothing_is_kept_when_no_span_launched_the_trainer():
    spans = recording_spans()
    trainer_spans.begin("j2", 1, "node-1", ManualClock(0.0))  # outside any span: tracing off for it
    trainer_spans.event("j2", 1, {"event": "started", "ts": 1.0})
    trainer_spans.exited("j2", 1, "failed", 1)
    assert spans.get_finished_spans() == ()


def test_a_trainer_writing_events_without_end_makes_a_bounded_number_of_spans(monkeypatch):
    spans = recording_spans()
    monkeypatch.setattr(trainer_spans, "MAX_SPANS", 3)
    clock = ManualClock(0.0)
    with tracing.span("worker", "command start"):
        trainer_spans.begin("j3", 1, "node-1", clock)
    for step in range(10):
        trainer_spans.event("j3", 1, {"event": "checkpointed", "ts": 0.0, "step": step, "path": "/x"})
    trainer_spans.exited("j3", 1, "killed", -9)
    assert [s.name for s in spans.get_finished_spans() if s.name != "command start"] == ["checkpoint"] * 3 + [
        "trainer exit"
    ]
