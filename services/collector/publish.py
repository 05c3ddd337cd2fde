"""A node's sample onto the bus, with a reference to its publish span when tracing samples it.

A collector publishes once a second on every node, so its traces are a sampler's choice
(`OTEL_TRACES_SAMPLER`, e.g. `parentbased_traceidratio` with `OTEL_TRACES_SAMPLER_ARG=0.01`). The
message names its span (`trace_parent`) only when that span records: an unsampled publish costs
an unsampled span and nothing on the wire (with tracing off, not even the span), and a decision the
sample triggers links the span.
"""

from __future__ import annotations

from opentelemetry.trace import SpanKind

from shared.contracts.messages import NodeMetrics
from shared.infra import tracing
from shared.infra.bus import Bus


async def publish_sample(bus: Bus, metrics: NodeMetrics) -> None:
    subject = bus.subjects.metrics(metrics.node)
    if not tracing.enabled():  # even a no-op span costs about what encoding the sample does
        await bus.nc.publish(subject, metrics.encode())
        return
    with tracing.span("collector", "publish metrics", kind=SpanKind.PRODUCER, node=metrics.node):
        metrics.trace_parent = tracing.traceparent()
        await bus.nc.publish(subject, metrics.encode())
