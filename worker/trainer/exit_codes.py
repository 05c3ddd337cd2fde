"""Exit codes of the trainer process: the worker's only signal when no event made it out.

Importable without torch: the worker and the executor map these to job outcomes.
75 and 76 sit in the range sysexits.h leaves to programs (EX_TEMPFAIL is 75: "try again
later", which is what a stopped-after-checkpoint job is).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCEEDED = 0
    FAILED = 1
    CONFIG_ERROR = 2
    STOPPED_AFTER_CHECKPOINT = 75
    OUT_OF_MEMORY = 76

    @classmethod
    def describe(cls, code: int) -> str:
        """A name for any exit status, including ones the trainer never returns (signals)."""
        try:
            return cls(code).name
        except ValueError:
            if code < 0:
                return f"KILLED_BY_SIGNAL_{-code}"
            if code > 128:
                return f"KILLED_BY_SIGNAL_{code - 128}"
            return f"UNKNOWN_{code}"
