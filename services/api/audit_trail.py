"""What the API writes to the audit log: one event per mutation, naming its actor, and the
field-by-field diff of a changed document (policies, quotas)."""

from __future__ import annotations

import uuid
from typing import Any

from services.api.auth import Principal
from shared.contracts.messages import AuditEvent


async def record(
    state,
    who: Principal,
    kind: str,
    reason: str,
    *,
    event_id: str | None = None,
    job_id: str | None = None,
    node: str | None = None,
    action: str | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Publish an audit event for something `who` did. Call it inside the transaction that makes the
    change: if the bus refuses, the change rolls back and the caller sees 503."""
    event = AuditEvent(
        event_id=event_id or f"api:{uuid.uuid4().hex}",
        ts=state.clock.now(),
        source="api",
        kind=kind,
        actor=who.actor,
        job_id=job_id,
        node=node,
        action=action,
        reason=reason,
        data=data or {},
    )
    await state.bus.audit(event)
    return event


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Each leaf that differs, as {"path": "a.b", "old": x, "new": y}; absent leaves are None."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[dict[str, Any]] = []
        for key in sorted(set(old) | set(new), key=str):
            changes += diff(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return changes
    if old == new:
        return []
    return [{"path": path or "(document)", "old": old, "new": new}]
