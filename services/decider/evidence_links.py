"""The spans a decision follows from, as its evidence names them.

An evidence entry (the evidence itself, or a mapping inside it, a few levels down) that holds a
`traceparent` names the span of what the decision acted on: an operator's move request
(`request_id`), a telemetry sample (`node`, `ts`). The decision's span links each, with those
names as the link's attributes, so a trace viewer leads from the cause to the decision. The
rules only quote what they were given; the traceparents were checked where they came in, and are
checked again here (`tracing.linked`), as evidence is any rule's output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Link

from shared.infra import tracing

MAX_LINKS = 16  # a decision about many GPUs links a few of their samples, not all
_DEPTH = 3  # evidence -> hot_gpus -> one GPU -> its traced sample
_NAMES = ("request_id", "node", "gpu", "ts")


def evidence_links(evidence: Mapping[str, Any]) -> list[Link]:
    found: list[Link] = []
    _collect(evidence, _DEPTH, found)
    return found


def _collect(value: Any, depth: int, found: list[Link]) -> None:
    if len(found) >= MAX_LINKS or depth < 0:
        return
    if isinstance(value, Mapping):
        if "traceparent" in value:
            names = {k: value[k] for k in _NAMES if isinstance(value.get(k), str | int | float)}
            link = tracing.linked(value["traceparent"], **names)
            if link is not None:
                found.append(link)
        children = value.values()
    elif isinstance(value, list | tuple):
        children = value
    else:
        return
    for child in children:
        _collect(child, depth - 1, found)
