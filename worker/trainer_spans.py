"""A trainer's events as spans of its job's trace.

The trainer has no network (a namespace of its own), so it exports nothing. Its events reach the
worker anyway (the events file); each attempt's become spans here, children of the worker's
`command start` span that launched it (so inside the job's trace), on the trainer's own times:

- `trainer load`: from the launch to `started` (LLaMA-Factory loading the model, the tokenizer
  and the dataset);
- `train steps A-B`: the logging steps between two other events, one span per stretch;
- `evaluate <split>` (the step and its metrics) and `checkpoint` (the step and the folder): from
  the trainer's previous event to this one (the save or the evaluation, as the events bracket it);
- `trainer exit`: from the last event to the end (outcome, exit code).

No span stays open while the job trains for hours: each ends with the event that closes it, and
links the one before it, so a long attempt reads as a chain. The trainer is not trusted: its
times are kept within the attempt's launch and now, its values to numbers and short strings, and
an attempt makes at most MAX_SPANS spans before its exit.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan

from shared.infra import tracing
from shared.infra.clock import Clock

_TRACER = "adc.worker"
MAX_METRICS = 32  # an evaluation's metrics kept as attributes
MAX_TEXT = 256
MAX_SPANS = 5_000  # an attempt's spans before the exit; a trainer writing events without end makes no more
_attempts: dict[tuple[str, int], AttemptSpans] = {}  # (job, attempt) -> its spans, until it exits


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


class AttemptSpans:
    def __init__(self, job_id: str, attempt: int, node: str, clock: Clock) -> None:
        self.clock = clock
        self.parent = trace.set_span_in_context(NonRecordingSpan(trace.get_current_span().get_span_context()))
        self.base = {tracing.SERVICE: "worker", "adc.job_id": job_id, "adc.attempt": attempt, "adc.node": node}
        self.launched = self.last = clock.now()
        self.previous: trace.SpanContext | None = None
        self.stretch: dict[str, float] | None = None  # the logging steps since the last other event
        self.ended = False
        self.made = 0

    def _when(self, event: dict) -> float:
        """The event's time, within the launch and now (the trainer's clock is its own word)."""
        ts = _number(event.get("ts"))
        return min(max(ts if ts is not None else self.clock.now(), self.last), self.clock.now())

    def _span(self, name: str, start: float, end: float, final: bool = False, **attributes: Any) -> None:
        if self.made >= MAX_SPANS and not final:
            return
        self.made += 1
        attrs = self.base | {f"adc.{k}": v for k, v in attributes.items() if v is not None}
        links = [Link(self.previous)] if self.previous is not None else []
        span = trace.get_tracer(_TRACER).start_span(
            name, context=self.parent, start_time=_ns(start), attributes=attrs, links=links
        )
        span.end(end_time=_ns(max(start, end)))
        self.previous = span.get_span_context()

    def _close_stretch(self) -> None:
        if self.stretch is not None:
            s = self.stretch
            first, last = int(s["first"]), int(s["last"])
            self._span(f"train steps {first}-{last}", s["start"], s["end"], first_step=first, step=last, loss=s["loss"])
            self.stretch = None

    def event(self, event: dict) -> None:
        if self.ended:
            return
        kind, at = event.get("event"), self._when(event)
        step = _number(event.get("step"))
        if kind == "progress":
            if self.stretch is None:
                self.stretch = {"start": self.last, "first": step or 0}
            self.stretch |= {"last": step or 0, "end": at, "loss": _number(event.get("loss"))}
        elif kind == "started":
            facts = {k: _number(event.get(k)) for k in ("max_steps", "world_size", "samples", "trainable_parameters")}
            self._span("trainer load", self.launched, at, resumed_from=_text(event.get("resumed_from")), **facts)
        elif kind == "checkpointed":
            self._close_stretch()
            self._span("checkpoint", self.last, at, step=step, path=_text(event.get("path")))
        elif kind == "evaluated":
            self._close_stretch()
            metrics = event.get("metrics") if isinstance(event.get("metrics"), dict) else {}
            shown = {f"metric.{_text(k)[:64]}": _number(v) for k, v in list(metrics.items())[:MAX_METRICS] if _text(k)}
            split = _text(event.get("split")) or "eval"
            self._span(f"evaluate {split[:32]}", self.last, at, step=step, **shown)
        else:
            return  # a terminal event: the exit closes the attempt
        self.last = at

    def exited(self, outcome: str, exit_code: int | None) -> None:
        if self.ended:
            return
        self._close_stretch()
        self._span("trainer exit", self.last, self.clock.now(), final=True, outcome=outcome, exit_code=exit_code)
        self.ended = True


def begin(job_id: str, attempt: int, node: str, clock: Clock) -> None:
    """Called inside the span that launches the attempt: its events become that span's children."""
    if tracing.recording():
        _attempts[job_id, attempt] = AttemptSpans(job_id, attempt, node, clock)


def event(job_id: str, attempt: int, record: dict) -> None:
    if (spans := _attempts.get((job_id, attempt))) is not None:
        spans.event(record)


def exited(job_id: str, attempt: int, outcome: str, exit_code: int | None) -> None:
    if (spans := _attempts.pop((job_id, attempt), None)) is not None:
        spans.exited(outcome, exit_code)
