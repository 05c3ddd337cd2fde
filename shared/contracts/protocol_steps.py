"""The steps of a protocol that changes a running job, and how one leads to the next.

Each protocol is recorded in `protocols` with its step before the step acts, so a restarted
executor resumes it there. Migrations 008 and 024 hold the same names as CHECKs.

  preparing       a move whose target devices are free of the source's: the target's trainer is
                  made ready to load the checkpoint (warm) while the source still trains; a
                  target that fails to get ready ends the move with the source untouched
  stopping        checkpoint-stop the trainer (escalation: kill, use the last periodic checkpoint)
  hold            preempt: requeue; pause: hold until resumed
  placing         migrate / tune / scale: the new attempt on the target placement
  starting_target start the trainer on the target
  rollback        the target refused: what the move's decision says (`OnTargetFailure`): back
                  to the source if its devices are still free, else requeue
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class ProtocolKind(StrEnum):
    MIGRATE = "migrate"
    TUNE = "tune"
    SCALE = "scale"
    PREEMPT = "preempt"
    PAUSE = "pause"

    @property
    def holds(self) -> bool:
        """Ends with the job off its devices (requeued or paused) rather than moved."""
        return self in (ProtocolKind.PREEMPT, ProtocolKind.PAUSE)


class Step(StrEnum):
    PREPARING = "preparing"
    STOPPING = "stopping"
    HOLD = "hold"
    PLACING = "placing"
    STARTING_TARGET = "starting_target"
    ROLLBACK = "rollback"


class OnTargetFailure(StrEnum):
    """What a move does when its target fails after the source stopped: the decider's policy (each rule's
    `on_target_failure`), carried by the decision, since asking again then would leave the job stopped."""

    RESTART_SOURCE = "restart_source"  # back on the source's devices if they are still free, else requeue
    REQUEUE = "requeue"  # back to the queue, to resume from the stop's checkpoint wherever the decider says


# The same values as a field's type: configs and bus messages are validated strictly, where a string is no enum.
OnTargetFailureName = Literal["restart_source", "requeue"]


class ProtocolState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"


STEP_TRANSITIONS: dict[Step, frozenset[Step]] = {
    Step.PREPARING: frozenset({Step.STOPPING}),
    Step.STOPPING: frozenset({Step.HOLD, Step.PLACING}),
    Step.HOLD: frozenset(),
    Step.PLACING: frozenset({Step.STARTING_TARGET}),
    Step.STARTING_TARGET: frozenset({Step.ROLLBACK}),
    Step.ROLLBACK: frozenset({Step.STARTING_TARGET}),
}
FIRST_STEP = Step.STOPPING


class InvalidStep(ValueError):
    def __init__(self, protocol_id: str, old: Step, new: Step) -> None:
        allowed = ", ".join(sorted(STEP_TRANSITIONS[old])) or "none (it can only end)"
        super().__init__(f"protocol {protocol_id}: step {old} -> {new} is not allowed (from {old}: {allowed})")
        self.old, self.new = old, new


def check_step(protocol_id: str, old: Step | str, new: Step | str) -> None:
    old, new = Step(old), Step(new)
    if new not in STEP_TRANSITIONS[old]:
        raise InvalidStep(protocol_id, old, new)
