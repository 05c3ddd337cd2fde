"""Text and JSON from processes we do not trust to be tidy (a trainer's error, an event's data)
made storable before any database write: Postgres refuses NUL in text and `\\u0000` in jsonb,
and one such character once made every retry of a job's exit fail until the exit was dropped."""

from __future__ import annotations

from typing import Any

MAX_TEXT = 4000


def storable_text(text: str, limit: int = MAX_TEXT) -> str:
    """No NUL, at most `limit` characters (cut with an ellipsis)."""
    text = text.replace("\x00", "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable_json(value: Any, limit: int = MAX_TEXT) -> Any:
    """The same for every string (keys too) inside a JSON value."""
    if isinstance(value, str):
        return storable_text(value, limit)
    if isinstance(value, dict):
        return {storable_text(str(k), 200): storable_json(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable_json(v, limit) for v in value]
    return value
