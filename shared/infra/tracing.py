"""OpenTelemetry for ADC: one trace per job, from the HTTP request to the worker's start.

`setup(service)` installs a tracer provider that exports over OTLP (HTTP) when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set, and nothing otherwise: the API's no-op tracer then makes
no ids and costs nothing. Tests pass an exporter (an in-memory one).

W3C trace context travels in NATS message headers. `shared/infra/bus.py` injects it into every
publish and request made while a span is recording, and opens a consumer span, child of the
sender's, around each JetStream message that carries one; a service adds only the spans for
what it handles (`span`, `within`). The api stores the submit's `traceparent` with the job
(`jobs.trace_parent`), so the decider, which decides in passes over many jobs, continues each
job's own trace (`job_context`). Audit events published inside a span carry its `trace_id`.

Where one trace leads to another, span links join them: an operator's request (its own trace)
links the manual decision it became, which lies in the job's trace and links the request back;
a decision the decider makes of a move request or of telemetry links the request's span or the
collector's publish span (`linked`, from the `traceparent` they carried, checked as untrusted).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags

from shared.contracts.trace_context import valid_traceparent
from shared.infra.job_reads.one_job import trace_parent

SERVICE = "adc.service"
T = TypeVar("T")
_enabled = False


def setup(service: str, exporter=None) -> bool:
    """Install this process's tracer provider; False when there is nowhere to send spans."""
    global _enabled
    if exporter is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"adc-{service}"}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def enabled() -> bool:
    return _enabled


@contextmanager
def span(
    service: str,
    name: str,
    *,
    parent: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    links: Iterable[SpanContext | Link | None] = (),
    **attributes: Any,
) -> Iterator[Span]:
    """A span of `service` (also its `adc.service` attribute, so one process may hold several),
    linked to the spans of `links` (those of another trace it follows from; a `Link` with attributes)."""
    attrs = {SERVICE: service} | {f"adc.{k}": v for k, v in attributes.items() if v is not None}
    with trace.get_tracer(f"adc.{service}").start_as_current_span(
        name, context=parent, kind=kind, attributes=attrs, links=_links(links)
    ) as current:
        yield current


def _links(links: Iterable[SpanContext | Link | None]) -> list[Link]:
    out = []
    for link in links:
        if isinstance(link, SpanContext):
            link = Link(link)
        if link is not None and link.context.is_valid:
            out.append(link)
    return out


def linked(parent: str | None, **attributes: Any) -> Link | None:
    """A link to the span a carried `traceparent` names (untrusted: None unless well formed)."""
    checked = valid_traceparent(parent)
    if checked is None:
        return None
    _, trace_hex, span_hex, flags = checked.split("-")
    context = SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)))
    return Link(context, {f"adc.{k}": v for k, v in attributes.items() if v is not None})


def current_span() -> SpanContext | None:
    """The recording span's context (to link to it from another trace), or None."""
    return trace.get_current_span().get_span_context() if recording() else None


def link_current(to: SpanContext | None, **attributes: Any) -> None:
    """Link the current span to `to` (a span of another trace that this one led to)."""
    if to is not None and to.is_valid and recording():
        trace.get_current_span().add_link(to, {f"adc.{k}": v for k, v in attributes.items() if v is not None})


def context_span(context: Context | None) -> SpanContext | None:
    """The span a stored context names (e.g. a job's `traceparent`: its submit request)."""
    return trace.get_current_span(context).get_span_context() if context is not None else None


async def within(
    service: str,
    name: str,
    work: Awaitable[T],
    *,
    headers: Mapping[str, str] | None = None,
    parent: Context | None = None,
    **attributes: Any,
) -> T:
    """Await `work` inside a span; its parent is the context in `headers` (a message's), or `parent`."""
    if headers is not None:
        parent = extract(headers)
    with span(service, name, parent=parent, **attributes):
        return await work


def annotate(**attributes: Any) -> None:
    """Add `adc.*` attributes to the current span (e.g. the job id once it is known)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes({f"adc.{k}": v for k, v in attributes.items() if v is not None})


def recording() -> bool:
    return trace.get_current_span().is_recording()


def inject() -> dict[str, str]:
    """Headers carrying the current span's context; empty when no span is recording."""
    carrier: dict[str, str] = {}
    if recording():
        propagate.inject(carrier)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The context a message's headers carry, or None when they carry none."""
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract(dict(headers))


def trace_id() -> str | None:
    """The current trace id in hex, while a span is recording."""
    if not recording():
        return None
    return format(trace.get_current_span().get_span_context().trace_id, "032x")


def traceparent() -> str | None:
    """The current span as a W3C traceparent, while one is recording (formatted, not propagated:
    a collector asks once a second)."""
    current = trace.get_current_span()
    if not current.is_recording():
        return None
    c = current.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def trace_id_of(parent: str | None) -> str | None:
    """The trace id inside a stored `traceparent` (version-traceid-spanid-flags)."""
    parts = (parent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


async def job_context(pool, job_id: str) -> Context | None:
    """The context of the job's own trace, as the api stored it at submission; None when off."""
    if not _enabled:
        return None
    stored = await trace_parent(pool, job_id)
    return extract({"traceparent": stored}) if stored else None
