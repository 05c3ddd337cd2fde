"""The shape of a submitted document, bounded before anything reads its keys.

Checking a spec costs per key (schema look-ups, a near-miss suggestion for an unknown one), so a
body of 40,000 near-miss keys would hold a check thread for minutes. `shape_problems` walks the
decoded document once, iteratively, and stops at the first limit it passes (`api.spec_limits`):
values in all, keys of one mapping, nesting depth, characters of a key. It also refuses what no
later step should have to guard against: an integer outside 64 bits (`max_steps` of 10**400 would
stop every consumer that casts it) and a string that is not valid Unicode (a lone UTF-16 surrogate,
which JSON's `\\ud800` escape can produce and neither Postgres nor a JSON answer can carry).
"""

from __future__ import annotations

from typing import Any

from shared.infra.config import SpecLimits

INT64 = (-(2**63), 2**63 - 1)


def printable_key(key: str, limit: int = 64) -> str:
    """A key as an error's `loc` may carry it: valid UTF-8, and short."""
    safe = key.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\0")
    return safe if len(safe) <= limit else safe[:limit] + "..."


def unicode_problem(text: str) -> str | None:
    """Why `text` is not valid Unicode (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return (
            f"not valid Unicode: a lone UTF-16 surrogate (U+{ord(text[err.start]):04X}) at character "
            f"{err.start}; send UTF-8 text"
        )
    return None


def shape_problems(doc: Any, limits: SpecLimits) -> list[dict[str, Any]]:
    """The first bound `doc` passes, as [{"loc", "msg"}] (empty when it fits). A few values of every kind
    are looked at, never more than `limits.max_values`, so this is cheap whatever the document holds."""
    seen = 0
    stack: list[tuple[Any, tuple, int]] = [(doc, (), 0)]
    while stack:
        value, loc, depth = stack.pop()
        seen += 1
        if seen > limits.max_values:
            return [
                {
                    "loc": ["body"],
                    "msg": f"more than {limits.max_values} keys and values in the document "
                    "(api.spec_limits.max_values)",
                }
            ]
        if isinstance(value, dict):
            if depth >= limits.max_depth:
                return [
                    {
                        "loc": list(loc),
                        "msg": f"nested more than {limits.max_depth} levels deep (api.spec_limits.max_depth)",
                    }
                ]
            if len(value) > limits.max_keys:
                return [
                    {
                        "loc": list(loc) or ["body"],
                        "msg": f"{len(value)} keys in one mapping; at most "
                        f"{limits.max_keys} (api.spec_limits.max_keys)",
                    }
                ]
            for key, item in value.items():
                if isinstance(key, str):
                    where = (*loc, printable_key(key))
                    if len(key) > limits.max_key_chars:
                        return [
                            {
                                "loc": list(where),
                                "msg": f"a key of {len(key)} characters; at most "
                                f"{limits.max_key_chars} (api.spec_limits.max_key_chars)",
                            }
                        ]
                    if why := unicode_problem(key):
                        return [{"loc": list(where), "msg": f"key {why}"}]
                    stack.append((item, where, depth + 1))
                else:
                    stack.append((item, (*loc, str(key)), depth + 1))  # unstorable() names a key that is no string
        elif isinstance(value, list):
            if depth >= limits.max_depth:
                return [
                    {
                        "loc": list(loc),
                        "msg": f"nested more than {limits.max_depth} levels deep (api.spec_limits.max_depth)",
                    }
                ]
            stack.extend((item, (*loc, i), depth + 1) for i, item in enumerate(value[: limits.max_values]))
        elif isinstance(value, str):
            if why := unicode_problem(value):
                return [{"loc": list(loc), "msg": why}]
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            return [
                {
                    "loc": list(loc),
                    "msg": f"an integer of {value.bit_length()} bits is outside 64 bits ({INT64[0]} to {INT64[1]})",
                }
            ]
    return []
