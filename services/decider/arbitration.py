"""Arbitration: which of the rules' proposed actions become decisions.

Rules propose independently over the same snapshot; here their proposals meet, in precedence
order (lower first; safety rules like oom_protection come before admission). A proposal is
refused, with the reason kept, when:
- a decision for its job is still in flight (an expectation not yet seen done or failed);
- an earlier proposal in this pass already took its job (one action per job);
- the job is not in the state the action needs: a start or a fail needs a pending job, a migrate,
  preempt, scale or tune a running one (a job mid-move is left alone);
- the same rule acted on the same job less than its cooldown ago;
- a device it would take is not free, or already taken in this pass or by a decision in flight
  (no GPU booked twice);
- it would disrupt a running job beyond the cluster-wide rate limit.
Proposals that make room for one job (`for_job` in their evidence) form a group: all of the
group or none, and only the first rule's group for a given job. Shadow proposals are judged
the same way but take nothing, so they never block a real decision.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from services.decider.snapshot import Snapshot
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from shared.contracts.reason_codes import Reason, ReasonCode, code_of

BOOKING = {"start", "migrate", "scale"}
DISRUPTIVE = {"migrate", "preempt", "scale", "tune", "pause", "drain"}
NEEDS_RUNNING = {"migrate", "preempt", "scale", "tune", "pause"}


@dataclass(frozen=True)
class Proposal:
    rule: str
    action: Any
    precedence: int = 100
    shadow: bool = False
    cooldown_s: float = 0.0

    @property
    def kind(self) -> str:
        return self.action.action

    @property
    def for_job(self) -> str | None:
        return (self.action.evidence or {}).get("for_job") if hasattr(self.action, "evidence") else None


@dataclass(frozen=True)
class Verdict:
    proposal: Proposal
    accepted: bool
    why: str = ""
    routine: bool = False  # refused for a reason that is the normal course (in flight, cooling down, taken)

    @property
    def code(self) -> ReasonCode | None:
        """The refusal's code (shared/contracts/reason_codes.py); None when accepted."""
        return None if self.accepted else code_of(self.why)


@dataclass
class InFlight:
    """A decision published and not yet seen carried out, refused or failed."""

    decision_id: str
    rule: str
    kind: str
    issued_at: float
    booked: tuple[NodeGpus, ...] = ()


class Cooldowns:
    def __init__(self) -> None:
        self._until: dict[tuple[str, str], float] = {}

    def remaining(self, rule: str, job_id: str, now: float) -> float:
        return max(0.0, self._until.get((rule, job_id), 0.0) - now)

    def start(self, rule: str, job_id: str, now: float, seconds: float) -> None:
        if seconds > 0:
            self._until[(rule, job_id)] = now + seconds

    def by_rule(self, now: float) -> dict[str, frozenset[str]]:
        """Per rule, the jobs it must leave alone now."""
        cooling: dict[str, set[str]] = {}
        for (rule, job_id), until in self._until.items():
            if until > now:
                cooling.setdefault(rule, set()).add(job_id)
        return {rule: frozenset(jobs) for rule, jobs in cooling.items()}

    def prune(self, now: float) -> None:
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]


class RateLimiter:
    """At most `per_minute` disruptive actions in any sliding minute, cluster-wide."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._times: deque[float] = deque()

    def allows(self, now: float) -> bool:
        while self._times and now - self._times[0] >= 60.0:
            self._times.popleft()
        return len(self._times) < self.per_minute

    def take(self, now: float) -> None:
        self._times.append(now)


@dataclass
class _Pass:
    snapshot: Snapshot
    in_flight: dict[str, InFlight]
    cooldowns: Cooldowns
    limiter: RateLimiter
    now: float
    taken_jobs: dict[str, str] = field(default_factory=dict)  # job -> rule
    taken_gpus: set[tuple[str, int]] = field(default_factory=set)
    room_for: dict[str, str] = field(default_factory=dict)  # job made room for -> rule
    routine: bool = False  # set by judge()

    def judge(self, p: Proposal) -> Reason | None:
        """Why `p` cannot be accepted, or None. Sets `routine` when the reason is the normal course."""
        job_id = p.action.job_id
        self.routine = True
        if job_id in self.in_flight:
            f = self.in_flight[job_id]
            return Reason(
                ReasonCode.REFUSED_IN_FLIGHT,
                f"a {f.kind} decision for {job_id} ({f.decision_id}, by {f.rule}) is still in flight",
            )
        if job_id in self.taken_jobs:
            return Reason(
                ReasonCode.REFUSED_TAKEN_THIS_PASS,
                f"{job_id} already has a decision in this pass, by {self.taken_jobs[job_id]}",
            )
        left = self.cooldowns.remaining(p.rule, job_id, self.now)
        if left > 0:
            return Reason(
                ReasonCode.REFUSED_COOLING_DOWN,
                f"{p.rule} acted on {job_id} recently: cooling down for {left:.0f} s more",
            )
        self.routine = False
        job = self.snapshot.job(job_id)
        if job is not None:
            if p.kind in ("start", "fail") and job.status != JobStatus.PENDING:
                return Reason(ReasonCode.REFUSED_NOT_PENDING, f"{job_id} is {job.status}, not pending")
            if p.kind in NEEDS_RUNNING and job.status != JobStatus.RUNNING:
                return Reason(
                    ReasonCode.REFUSED_NOT_RUNNING,
                    f"{job_id} is {job.status}, not running (mid-move or not started): left alone",
                )
        elif p.kind in BOOKING | NEEDS_RUNNING:
            return Reason(ReasonCode.REFUSED_NO_LIVE_JOB, f"no live job {job_id}")
        if p.kind in BOOKING:
            own = {(part.node, g) for part in (job.placement if job and job.holds_gpus else ()) for g in part.gpus}
            for part in p.action.placement:
                node = self.snapshot.nodes.get(part.node)
                if node is None or not node.schedulable:
                    return Reason(ReasonCode.REFUSED_NODE_UNSCHEDULABLE, f"node {part.node} is not schedulable")
                for g in part.gpus:
                    if (part.node, g) in own:
                        continue
                    if g not in node.free:
                        holder = self.snapshot.owner(part.node, g)
                        return Reason(
                            ReasonCode.REFUSED_DEVICE_NOT_FREE,
                            f"device {part.node}:{g} is not free" + (f" (held by {holder.id})" if holder else ""),
                        )
                    if (part.node, g) in self.taken_gpus:
                        return Reason(
                            ReasonCode.REFUSED_DEVICE_TAKEN,
                            f"device {part.node}:{g} is already taken in this pass or by a decision in flight",
                        )
        if p.kind in DISRUPTIVE and not p.shadow and not self.limiter.allows(self.now):
            return _rate_limited(self.limiter)
        return None

    def take(self, p: Proposal) -> None:
        job_id = p.action.job_id
        self.cooldowns.start(p.rule, job_id, self.now, p.cooldown_s)
        if p.shadow:
            return
        self.taken_jobs[job_id] = p.rule
        if p.kind in BOOKING:
            own = {(part.node, g) for part in getattr(self.snapshot.job(job_id), "placement", ()) for g in part.gpus}
            self.taken_gpus |= {(part.node, g) for part in p.action.placement for g in part.gpus} - own
        if p.kind in DISRUPTIVE:
            self.limiter.take(self.now)


def arbitrate(
    proposals: list[Proposal],
    snapshot: Snapshot,
    in_flight: dict[str, InFlight],
    cooldowns: Cooldowns,
    limiter: RateLimiter,
    now: float,
) -> list[Verdict]:
    """Verdicts in the order proposals were considered (precedence, then rule, then as proposed)."""
    state = _Pass(snapshot, in_flight, cooldowns, limiter, now)
    # Devices booked by decisions in flight count as taken even when the snapshot was built before
    # they were made (the decider's urgent pass runs beside its regular one): no GPU booked twice.
    state.taken_gpus = {(part.node, g) for flight in in_flight.values() for part in flight.booked for g in part.gpus}
    ordered = sorted(enumerate(proposals), key=lambda ip: (ip[1].precedence, ip[1].rule, ip[0]))
    groups: dict[tuple[str, str], list[Proposal]] = {}
    for _, p in ordered:
        if p.for_job:
            groups.setdefault((p.rule, p.for_job), []).append(p)
    verdicts: list[Verdict] = []
    seen_groups: set[tuple[str, str]] = set()
    for _, p in ordered:
        if not p.for_job:
            why = state.judge(p)
            if why is None:
                state.take(p)
            verdicts.append(Verdict(p, why is None, why or "", routine=state.routine))
            continue
        key = (p.rule, p.for_job)
        if key in seen_groups:
            continue
        seen_groups.add(key)
        verdicts += _judge_group(state, p.rule, p.for_job, groups[key])
    return verdicts


def _judge_group(state: _Pass, rule: str, for_job: str, members: list[Proposal]) -> list[Verdict]:
    shadow = all(m.shadow for m in members)
    if not shadow and for_job in state.room_for:
        why = Reason(
            ReasonCode.REFUSED_ROOM_ALREADY_MADE,
            f"room for {for_job} is already being made by {state.room_for[for_job]}",
        )
        return [Verdict(m, False, why, routine=True) for m in members]
    # Judge members one after another on a trial pass, so they do not collide with each other (it
    # only reads the cooldowns: shared, not copied).
    trial = _Pass(
        state.snapshot,
        state.in_flight,
        state.cooldowns,
        state.limiter,
        state.now,
        dict(state.taken_jobs),
        set(state.taken_gpus),
        dict(state.room_for),
    )
    taken_rate = 0
    for m in members:
        why = trial.judge(m)
        if why is None and m.kind in DISRUPTIVE and not m.shadow:
            if len(state.limiter._times) + taken_rate >= state.limiter.per_minute:
                why = _rate_limited(state.limiter)
        if why is not None:
            return [
                Verdict(
                    x, False, Reason(why.code, f"group for {for_job} refused: {m.action.job_id}: {why}"), trial.routine
                )
                for x in members
            ]
        trial.taken_jobs[m.action.job_id] = rule
        if m.kind in BOOKING:
            trial.taken_gpus |= {(part.node, g) for part in m.action.placement for g in part.gpus}
        taken_rate += m.kind in DISRUPTIVE and not m.shadow
    for m in members:
        state.take(m)
    if not shadow:
        state.room_for[for_job] = rule
    return [Verdict(m, True) for m in members]


def _rate_limited(limiter: RateLimiter) -> Reason:
    return Reason(
        ReasonCode.REFUSED_RATE_LIMIT,
        f"cluster-wide limit of {limiter.per_minute} disruptive actions per minute reached",
    )
