"""The W3C `traceparent` as ADC accepts it from outside: a request, a bus message, a stored row.

Only the shape is checked (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, lowercase,
ids not all zero), and the length is bounded before anything else reads the text. What fails is
dropped, never an error: a trace link is a convenience, and a bad one must not cost a job or a
sample anything.
"""

from __future__ import annotations

import re

TRACEPARENT_MAX = 55  # version 00 is exactly this long; later versions are not accepted
_SHAPE = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: object) -> str | None:
    """`value` when it is a well-formed version-00 traceparent, else None."""
    if not isinstance(value, str) or len(value) != TRACEPARENT_MAX:
        return None
    return value if _SHAPE.fullmatch(value) else None
