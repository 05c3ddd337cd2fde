"""What a `user` is shown of other teams: nothing. Job ids of other teams' jobs in reasons and evidence
(a pending reason "held behind job j…", a preemption's victims, a decision's candidates) are
replaced before a user sees them; operators and admins see everything.

The decider and executor write their reasons for everyone; the api, which knows who asks,
redacts at the edge, so no writer has to know who will read.
"""
from __future__ import annotations

import re
from typing import Any

from services.api.auth import Principal

JOB_ID = re.compile(r"\bj[0-9a-f]{16}\b")
HIDDEN = "(another team's job)"


def _ids(value: Any, found: set[str]) -> set[str]:
    if isinstance(value, str):
        found.update(JOB_ID.findall(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _ids(k, found)
            _ids(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _ids(v, found)
    return found


def _replace(value: Any, foreign: set[str]) -> Any:
    if isinstance(value, str):
        return JOB_ID.sub(lambda m: HIDDEN if m.group(0) in foreign else m.group(0), value)
    if isinstance(value, dict):
        return {_replace(k, foreign): _replace(v, foreign) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace(v, foreign) for v in value]
    return value


async def for_viewer(pool, who: Principal, value: Any) -> Any:
    """`value` (a view, a list of them, any JSON-like data) as `who` may see it."""
    if who.sees_all:
        return value
    ids = _ids(value, set())
    if not ids:
        return value
    # Only the caller's own team's ids stay; any other (another team's, or a job since deleted) is hidden.
    rows = await pool.fetch("SELECT id FROM jobs WHERE id = ANY($1::text[]) AND team = $2", list(ids), who.team)
    foreign = ids - {r["id"] for r in rows}
    return _replace(value, foreign) if foreign else value
