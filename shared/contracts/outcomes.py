"""How a trainer attempt ended: one map from exit code to outcome, and from outcome to job transition.

The codes are the trainer's contract (worker/trainer/README.md): 0 succeeded, 1 failed, 2 config
error, 75 stopped after a checkpoint, 76 out of memory. The worker turns an exit into an
`ExitOutcome` (its `exited` event carries it); the executor turns the outcome into the job's
next transition. Nobody else translates exit codes.
"""

from __future__ import annotations

from enum import StrEnum

SUCCEEDED_CODE, STOPPED_CODE, OOM_CODE = 0, 75, 76


class ExitOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"  # checkpoint-stop honoured: resume from its checkpoint
    OOM = "oom"  # out of memory: may resume with more memory or a smaller micro-batch
    FAILED = "failed"
    CANCELLED = "cancelled"  # the worker terminated it on request
    KILLED = "killed"  # ended by a signal nobody in ADC sent, or vanished

    @classmethod
    def of_exit(cls, code: int | None, cancelled: bool = False) -> ExitOutcome:
        if cancelled:
            return cls.CANCELLED
        if code is None or code < 0:
            return cls.KILLED
        return {SUCCEEDED_CODE: cls.SUCCEEDED, STOPPED_CODE: cls.STOPPED, OOM_CODE: cls.OOM}.get(code, cls.FAILED)

    @classmethod
    def of_last_event(cls, event: dict) -> ExitOutcome:
        """For a trainer that is not our child (its exit code cannot be read): its last event says."""
        try:
            outcome = cls(event.get("event"))
        except ValueError:
            return cls.KILLED
        return outcome if outcome in (cls.SUCCEEDED, cls.STOPPED, cls.OOM, cls.FAILED) else cls.KILLED


# The job transition each outcome leads to (shared/contracts/job_status.py NAMED). An OOM is always
# requeued, its outcome and count recorded: the decider's oom_retry rule retries it or fails it
# (`strategies.oom_retry.max_retries`); a stop nobody asked for (its worker shut down) is requeued to
# resume from its checkpoint.
JOB_TRANSITION: dict[ExitOutcome, str] = {
    ExitOutcome.SUCCEEDED: "finish",
    ExitOutcome.STOPPED: "requeue",
    ExitOutcome.OOM: "requeue",
    ExitOutcome.FAILED: "fail",
    ExitOutcome.CANCELLED: "cancel",
    ExitOutcome.KILLED: "fail",
}
