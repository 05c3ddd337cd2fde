"""The policy contract's output: a closed, typed union of actions.

A policy is a pure function `decide(snapshot, config) -> list[Action]`. Each action carries
the plain-words reason, its code and the evidence it used, so every decision explains itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.contracts.reason_codes import ReasonCode


class NodeGpus(BaseModel):
    """Devices of one node given to a job. A multi-node job has several."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    gpus: tuple[int, ...]


Placement = list[NodeGpus]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str
    reason: str = Field(description="why, in plain words")
    reason_code: ReasonCode | None = Field(None, description="why, as a code of shared/contracts/reason_codes.py")
    evidence: dict[str, Any] = Field(default_factory=dict, description="the values that triggered it")


class Start(_Action):
    action: Literal["start"] = "start"
    placement: Placement
    resume_from: str | None = None
    train_overrides: dict[str, Any] = Field(
        default_factory=dict, description="train keys this and later starts use instead of the spec's (an OOM retry)"
    )


class Migrate(_Action):
    action: Literal["migrate"] = "migrate"
    placement: Placement = Field(description="target; empty: any node but the current one with room (manual)")


class Preempt(_Action):
    action: Literal["preempt"] = "preempt"


class Scale(_Action):
    action: Literal["scale"] = "scale"
    placement: Placement


class Tune(_Action):
    """Checkpoint-stop and restart in place with changed settings."""

    action: Literal["tune"] = "tune"
    env: dict[str, str] = Field(default_factory=dict)
    train_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="train keys the restart and later starts use instead of the job's (a smaller micro-batch)",
    )


class Cancel(_Action):
    action: Literal["cancel"] = "cancel"


class Fail(_Action):
    """Give a waiting job up: it ends failed, with the reason (an out-of-memory job past its retries)."""

    action: Literal["fail"] = "fail"


class Pause(_Action):
    """Checkpoint-stop and hold until resumed (manual)."""

    action: Literal["pause"] = "pause"


class Resume(_Action):
    """A paused job goes back to the queue, to resume from its checkpoint anywhere (manual)."""

    action: Literal["resume"] = "resume"


class _NodeAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    reason: str
    reason_code: ReasonCode | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)

    @property
    def job_id(self) -> str:
        # Node actions are serialized per node, as job actions are per job.
        return f"node:{self.node}"


class Cordon(_NodeAction):
    action: Literal["cordon"] = "cordon"


class Uncordon(_NodeAction):
    action: Literal["uncordon"] = "uncordon"


class Drain(_NodeAction):
    """Move every job off the node without losing a step, then leave it cordoned."""

    action: Literal["drain"] = "drain"


JOB_ACTIONS = (Start, Migrate, Preempt, Scale, Tune, Cancel, Fail, Pause, Resume)
Action = Annotated[
    Start | Migrate | Preempt | Scale | Tune | Cancel | Fail | Pause | Resume | Cordon | Uncordon | Drain,
    Field(discriminator="action"),
]
