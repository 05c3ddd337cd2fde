"""The audit log's hash chain: each row's hash covers its content and the previous row's hash."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

GENESIS = "0" * 64
CHAINED_FIELDS = ("event_id", "ts", "source", "kind", "actor", "job_id", "node", "decision_id",
                  "rule", "action", "reason", "evidence", "data")


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def row_hash(prev_hash: str, row: dict[str, Any]) -> str:
    body = json.dumps({f: _canonical(row.get(f)) for f in CHAINED_FIELDS}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def find_break(rows: list[dict[str, Any]], prev_hash: str = GENESIS) -> tuple[int, str] | None:
    """The first row whose chain does not hold, as (id, why); None if all hold."""
    for row in rows:
        if row["prev_hash"] != prev_hash:
            return row["id"], "prev_hash does not match the hash of the row before it"
        expected = row_hash(prev_hash, row)
        if row["hash"] != expected:
            return row["id"], "content does not match its hash (the row was altered)"
        prev_hash = row["hash"]
    return None
