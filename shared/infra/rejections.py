"""Messages refused at a service's door: counted per subject and reason, logged once per kind.

Anything crossing the bus is untrusted. A reader that cannot take a message calls `rejected`:
the Prometheus counter `adc_rejected_messages_total{subject,reason}` (in the process's default
registry) goes up, and the first rejection of each (subject, reason) is logged with its detail,
so a flood of bad input is visible without flooding the log.

Reasons: `oversized` (over `shared.contracts.messages.MAX_MESSAGE_BYTES`), `malformed_json`,
`schema_version` (a major version this reader does not know), `schema` (any other field wrong);
and `unauthenticated`, for a worker's command without the executor's valid signature
(worker/command_gate.py, which logs each one itself), or a job event not from its claimed sender;
`not_placed`, for a trainer event from a node the job's attempt is not placed on (the executor
audits it, services/executor/lifecycle.py).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter
from pydantic import ValidationError

from shared.contracts.messages import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

REJECTED = Counter(
    "adc_rejected_messages", "Bus messages a service refused, by subject and reason", ["subject", "reason"]
)
_logged: set[tuple[str, str]] = set()


def reason_of(err: Exception, data: bytes) -> str:
    if len(data) > MAX_MESSAGE_BYTES:
        return "oversized"
    if isinstance(err, ValidationError):
        errors = err.errors()
        if any(e["type"] == "json_invalid" or e["type"] == "json_type" for e in errors):
            return "malformed_json"
        if any(tuple(e["loc"][:1]) == ("v",) for e in errors):
            return "schema_version"
    return "schema"


def rejected(subject: str, err: Exception, data: bytes, service: str = "") -> str:
    """Count and (once per kind) log a refused message; its reason. `subject` is the kind, e.g. `decisions`."""
    reason = reason_of(err, data)
    REJECTED.labels(subject, reason).inc()
    if (subject, reason) not in _logged:
        _logged.add((subject, reason))
        log.warning(
            "%s: refused a message on %s (%s): %s; further ones of this kind are only counted",
            service or "service",
            subject,
            reason,
            str(err)[:300],
        )
    return reason


def refused_unauthenticated(subject: str) -> None:
    """Count a message refused for its missing or wrong signature (its sender logs it)."""
    REJECTED.labels(subject, "unauthenticated").inc()


def refused_not_placed() -> None:
    """Count a job event from a node its job's attempt does not run on (the caller logs or audits it)."""
    REJECTED.labels("job_events", "not_placed").inc()


def count(subject: str, reason: str) -> float:
    """How many messages on `subject` were refused for `reason` in this process."""
    return REJECTED.labels(subject, reason)._value.get()
