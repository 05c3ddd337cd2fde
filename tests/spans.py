"""One in-memory span exporter for the whole test session: OpenTelemetry lets a process set its
tracer provider once, so every test that reads spans shares this one and clears it."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.infra import tracing

SPANS = InMemorySpanExporter()


def recording_spans() -> InMemorySpanExporter:
    """Spans from here on are kept (until the next call clears them)."""
    if not tracing.enabled():
        tracing.setup("tests", exporter=SPANS)
    SPANS.clear()
    return SPANS
