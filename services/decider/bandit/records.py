"""What the bandit keeps of each choice and what it audits: `bandit.decision` (context hash, arms
and their features, the bandit's choice and propensity, exploring or exploiting, the rules' arm,
the arm taken and its logging propensity) and, joined by the decision id, `bandit.reward`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.decider.bandit.learner import context_hash
from shared.contracts.messages import AuditEvent

RULE = "bandit"


@dataclass
class Logged:
    """One bandit choice, as audited, and later its reward."""

    id: str
    job_id: str
    ts: float
    shared: dict[str, float]
    arms: list[dict[str, float]]
    placements: list[Any]
    chosen: int  # the bandit's choice
    prob: float  # its propensity under the bandit's distribution
    explored: bool
    taken: int  # the arm acted on: the bandit's when it acted, else the rules' (0)
    taken_prob: float  # the logging policy's propensity of `taken` (the rules' is 1)
    acted: bool
    mode: str
    attempt: int
    step: int | None
    model_version: int
    randomized: bool = False  # a shadow start placed on a uniformly drawn arm (shadow_explore)
    blocked: list[int] = field(default_factory=list)  # per arm, the waiting job's devices it pushes back
    decision_id: str | None = None
    reward: float | None = None
    point: str = "placement"
    actions: list[str] | None = None  # memory pressure: each arm's response (its kind)
    before: dict[str, Any] | None = None  # memory pressure: the job when the decision was made
    lost_gpu_s: float | None = None  # memory pressure: what the response cost, from the job's reports
    waiting_gpu_s: float | None = None  # queue knobs: what the queue waited over the window

    @property
    def spends(self) -> bool:
        """It spent the exploration budget: an exploring choice acted on, or a drawn shadow start."""
        return self.randomized or (self.explored and self.acted)

    def record(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "mode": self.mode,
            "bandit_decision": self.id,
            "context_hash": context_hash(self.shared, self.arms),
            "shared": self.shared,
            "arms": self.arms,
            "placements": [[p.model_dump(mode="json") for p in arm] for arm in self.placements],
            "chosen": self.chosen,
            "propensity": round(self.prob, 6),
            "explored": self.explored,
            "rules_arm": 0,
            "taken": self.taken,
            "taken_propensity": round(self.taken_prob, 6),
            "acted": self.acted,
            "randomized": self.randomized,
            "blocked": self.blocked,
            "model_version": self.model_version,
        } | ({"actions": self.actions} if self.actions is not None else {})


@dataclass
class Stats:
    decisions: int = 0
    acted: int = 0
    explored: int = 0
    agreed: int = 0  # the bandit's choice was the rules' own
    rewarded: int = 0
    unrewarded: int = 0
    reward_sum: float = 0.0
    rules_rewarded: int = 0  # rewards of decisions that took the rules' arm: the baseline estimate
    rules_reward_sum: float = 0.0

    def count(self, logged: Logged) -> None:
        self.decisions += 1
        self.acted += logged.acted
        self.explored += logged.spends
        self.agreed += logged.chosen == 0

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.__dict__)
        out["mean_reward"] = self.reward_sum / self.rewarded if self.rewarded else None
        out["rules_mean_reward"] = self.rules_reward_sum / self.rules_rewarded if self.rules_rewarded else None
        return out


def _event(logged: Logged, kind: str, ts: float, reason: str, data: dict, **fields: Any) -> AuditEvent:
    """A bandit audit event of `logged`'s: its decision (`:bandit`) or its reward (`:reward`)."""
    suffix = "bandit" if kind == "bandit.decision" else "reward"
    return AuditEvent(
        event_id=f"{logged.id}:{suffix}",
        ts=ts,
        source="decider",
        kind=kind,
        rule=RULE,
        reason=reason,
        data=data,
        **fields,
    )


def _choice(logged: Logged) -> str:
    """How the choice was made, for an event's reason."""
    how = "exploring" if logged.explored else "exploiting"
    return f"bandit ({logged.mode}, {how})"


def _odds(logged: Logged, arms: int) -> str:
    return f"arm {logged.chosen} of {arms}, propensity {logged.prob:.3f}"


def decision_event(logged: Logged) -> AuditEvent:
    if logged.actions is not None:
        return _memory_event(logged)
    verb = "placed" if logged.acted and logged.taken != 0 else "would place" if logged.chosen else "agreed with"
    return _event(
        logged,
        "bandit.decision",
        logged.ts,
        f"{_choice(logged)} {verb} the rules' placement: {_odds(logged, len(logged.arms))}",
        logged.record(),
        job_id=logged.job_id,
        decision_id=logged.decision_id,
        action="start",
    )


def reward_event(logged: Logged, decision_id: str, job, devices: int, version: int, now: float) -> AuditEvent:
    return _event(
        logged,
        "bandit.reward",
        now,
        f"placement reward {logged.reward:.4f}: {job.step_time_s:.3g} s a step on {devices} device(s)",
        {
            "bandit_decision": logged.id,
            "reward": logged.reward,
            "step_time_s": job.step_time_s,
            "devices": devices,
            "taken": logged.taken,
            "model_version": version,
        },
        job_id=logged.job_id,
        decision_id=decision_id,
    )


def _memory_event(logged: Logged) -> AuditEvent:
    names = logged.actions
    verb = "chose" if logged.acted and logged.taken != 0 else "would choose" if logged.chosen else "agreed with"
    return _event(
        logged,
        "bandit.decision",
        logged.ts,
        f"{_choice(logged)} {verb} {names[logged.chosen]} for memory pressure, the rule's {names[0]}: "
        + _odds(logged, len(names)),
        logged.record(),
        job_id=logged.job_id,
        decision_id=logged.decision_id,
        action=names[logged.taken],
    )


def memory_reward_event(logged: Logged, decision_id: str, job, version: int, now: float) -> AuditEvent:
    lost = logged.lost_gpu_s
    said = "it ran out of memory after all" if lost != lost else f"{lost:.0f} GPU-s lost"  # NaN: OOM
    return _event(
        logged,
        "bandit.reward",
        now,
        f"memory pressure reward {logged.reward:.4f} for {logged.actions[logged.taken]}: {said}",
        {
            "point": logged.point,
            "bandit_decision": logged.id,
            "reward": logged.reward,
            "lost_gpu_s": None if lost != lost else lost,
            "step_time_s": job.step_time_s,
            "taken": logged.taken,
            "model_version": version,
        },
        job_id=logged.job_id,
        decision_id=decision_id,
    )


def knob_decision_event(logged: Logged, ends_at: float) -> AuditEvent:
    names = logged.actions
    verb = "set" if logged.acted and logged.taken != 0 else "would set" if logged.chosen else "kept"
    return _event(
        logged,
        "bandit.decision",
        logged.ts,
        f"{_choice(logged)} {verb} queue knobs {names[logged.chosen]} for the window to {ends_at:.0f}, "
        f"the rules' {names[0]}: " + _odds(logged, len(names)),
        logged.record() | {"ends_at": ends_at, "settings": logged.before["settings"]},
        decision_id=logged.decision_id,
        action=names[logged.taken],
    )


def knob_reward_event(logged: Logged, change_gpu_h: float | None, version: int, now: float) -> AuditEvent:
    gpu_h = logged.waiting_gpu_s / 3600.0
    return _event(
        logged,
        "bandit.reward",
        now,
        f"queue knobs reward {logged.reward:.4f} for {logged.actions[logged.taken]}: "
        f"{gpu_h:.2f} GPU-hours waited over the window",
        {
            "point": logged.point,
            "bandit_decision": logged.id,
            "reward": logged.reward,
            "waiting_gpu_h": gpu_h,
            "change_gpu_h": change_gpu_h,
            "taken": logged.taken,
            "model_version": version,
        },
        decision_id=logged.decision_id,
    )
