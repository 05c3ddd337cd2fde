"""The bandit beside the rules: after the rules propose and before arbitration it chooses, for each
start it may decide, among the feasible placements the rules' own constraints allow (arms.py);
after arbitration it ties its choices to the decisions made, and on later passes joins each to
its reward. No I/O: `EngineCore` calls it, the decider audits and stores what it returns.

Modes (`bandit.mode`): `off` (not attached at all), `shadow` (chooses, audits its choice, its
propensity and the rules' choice, and learns from what was done; changes no proposal, except the
`shadow_explore` share of starts, within the exploration budget, that it places on an arm drawn
uniformly so that the log has support for every arm) and `active` (its choice replaces the rules'
placement, within the exploration budget; never for a job that is not preemptible, never twice for
one job within `cooldown_s`). A start it leaves alone is the rules' start, unchanged. Arbitration
judges its proposals like any other.

Reward of a placement: minus the log of the GPU-seconds a step costs, on the first progress
report of the attempt the decision started: `-log(step_time_s x (devices + blocked))`, where
`blocked` is the device count of the waiting job the placement pushed back (arms.py; 0 for the
rules' pick). With the global batch fixed this is log tokens per GPU-second up to a constant per
job, with the devices a spread placement keeps from a waiting job counted as its own. No report
within `reward_within_s` (the job ended or never ran there): the decision is dropped unlearned.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.decider.arbitration import Proposal
from services.decider.bandit.arms import Taken, job_features, placement_arms, waiting_gang
from services.decider.bandit.budget import ExplorationBudget
from services.decider.bandit.knob_policy import KnobPoint
from services.decider.bandit.learner import Learner
from services.decider.bandit.memory_policy import MemoryPoint
from services.decider.bandit.records import RULE, Logged, Stats, decision_event, reward_event
from services.decider.snapshot import Snapshot
from shared.contracts.job_status import JobStatus
from shared.contracts.messages import AuditEvent
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import BanditConfig


@dataclass
class BanditPolicy:
    config: BanditConfig
    learner: Learner | None = None
    keep_history: bool = False  # the simulator keeps every choice (bench/bandit.py reads them)
    budget: ExplorationBudget = field(default_factory=ExplorationBudget)
    stats: Stats = field(default_factory=Stats)
    pending: dict[str, Logged] = field(default_factory=dict)  # decision id -> choice awaiting its reward
    history: list[Logged] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.learner is None:
            self.learner = Learner(self.config.epsilon, self.config.seed)
        self._rng = np.random.default_rng([self.config.seed, 29])
        self._this_pass: dict[str, Logged] = {}
        # Decision points 2 (memory pressure) and 3 (queue knobs): own learners, the same budget.
        self.memory = MemoryPoint(self.config, self.budget, self.keep_history)
        self.knobs = KnobPoint(self.config, self.budget, self.keep_history)

    # --- config and state --------------------------------------------------------------

    def configure(self, config: BanditConfig) -> None:
        """A reloaded config: the mode, budget and exploration rate change, the learner is kept."""
        if config != self.config:
            self.learner = self.learner.with_epsilon(config.epsilon)
            self.config = config
        self.memory.configure(config)
        self.knobs.configure(config)

    def reset(self) -> None:
        """Forget everything learned (`adc bandit reset`)."""
        self.learner = Learner(self.config.epsilon, self.config.seed)
        self.stats = Stats()
        self.pending.clear()
        self.memory.reset()
        self.knobs.reset()

    def restore(self, learner: Learner, stats: dict[str, Any] | None) -> None:
        self.learner = learner.with_epsilon(self.config.epsilon)
        known = {k: v for k, v in (stats or {}).items() if k in Stats.__dataclass_fields__}
        self.stats = Stats(**known)

    def status(self, now: float) -> dict[str, Any]:
        return {
            "mode": self.config.mode,
            "epsilon": self.config.epsilon,
            "act_margin": self.config.act_margin,
            "act_after": self.config.act_after,
            "model_version": self.learner.version,
            "pending_rewards": len(self.pending),
            "explored_last_hour": self.budget.spent_last_hour(now),
            "explore_per_hour": self.config.explore_per_hour,
            **self.stats.view(),
            "memory": self.memory.status(),
            "knobs": self.knobs.status(),
        }

    # --- before arbitration ------------------------------------------------------------

    def choose(self, proposals: list[Proposal], snapshot: Snapshot, settings: dict | None = None) -> list[Proposal]:
        self._this_pass = {}
        if self.config.mode == "off":
            return proposals
        now = snapshot.ts
        taken: Taken = _taken(proposals)
        starting = {p.action.job_id for p in proposals if p.kind == "start" and not p.shadow}
        waiting = waiting_gang(snapshot, starting)
        out = []
        for p in proposals:
            if _eligible(p):
                p = self._choose_one(p, snapshot, taken, now, waiting)
            elif settings and self.memory.eligible(p):  # the rules' typed configs, by rule name
                p = self.memory.choose_one(p, snapshot, settings.get(p.rule), taken, now)
            out.append(p)
        return out

    def _choose_one(self, p: Proposal, snapshot: Snapshot, taken: Taken, now: float, waiting: int) -> Proposal:
        action, config = p.action, self.config
        job = snapshot.job(action.job_id)
        if job is None or not job.preemptible or job.status != JobStatus.PENDING or job.id in self._this_pass:
            return p
        if sum(len(part.gpus) for part in action.placement) < config.min_job_gpus:
            return p
        if self.budget.cooling(job.id, now, config):
            return p
        own = {(part.node, g) for part in action.placement for g in part.gpus}
        arms = placement_arms(
            job, tuple(action.placement), snapshot, taken - own, config.max_arms, config.keep_idle_nodes, waiting
        )
        if arms is None:
            return p
        shared = job_features(job, snapshot, waiting)
        features = [a.features for a in arms]
        active = config.mode == "active"
        may_explore = not active or self.budget.may_explore(job.id, now, config)
        chosen, prob, greedy = self.learner.draw(
            shared, features, self._rng, may_explore, config.act_margin, config.act_after
        )
        explored = chosen != greedy
        taken_arm, taken_prob, randomized = (
            (chosen, prob, False) if active else self._log_shadow(job.id, now, len(arms))
        )
        logged = Logged(
            id=uuid.uuid4().hex,
            job_id=job.id,
            ts=now,
            shared=shared,
            arms=features,
            placements=[a.placement for a in arms],
            chosen=chosen,
            prob=prob,
            explored=explored,
            taken=taken_arm,
            taken_prob=taken_prob,
            acted=active or randomized,
            randomized=randomized,
            blocked=[a.blocked for a in arms],
            mode=config.mode,
            attempt=job.attempt,
            step=job.step,
            model_version=self.learner.version,
        )
        self._this_pass[job.id] = logged
        if active or randomized:
            self.budget.spend(job.id, now, logged.spends)
        if taken_arm == 0:
            return p
        placement = arms[taken_arm].placement
        taken -= own
        taken |= {(part.node, g) for part in placement for g in part.gpus}
        evidence = dict(action.evidence or {}) | {
            "bandit": {"arm": taken_arm, "propensity": round(taken_prob, 4), "explored": logged.spends},
            "rules_placement": [part.model_dump(mode="json") for part in action.placement],
        }
        how = "drawn for evaluation" if randomized else "explored" if explored else "learned"
        reason = f"{action.reason}; the bandit placed it on {placement[0].node} ({how})"
        code = ReasonCode.BANDIT_PLACEMENT
        update = {"placement": list(placement), "reason": reason, "reason_code": code, "evidence": evidence}
        changed = action.model_copy(update=update)
        return Proposal(RULE, changed, p.precedence, False, 0.0)

    def _log_shadow(self, job_id: str, now: float, arms: int) -> tuple[int, float, bool]:
        """The arm a shadow start takes and its logging propensity: the rules' (1), or with the
        budget left, with probability `shadow_explore` an arm drawn uniformly (the rules' pick among
        them), so every arm has probability at least shadow_explore / arms."""
        share = self.config.shadow_explore
        if share <= 0 or not self.budget.may_explore(job_id, now, self.config):
            return 0, 1.0, False
        randomized = bool(self._rng.random() < share)
        taken = int(self._rng.integers(arms)) if randomized else 0
        prob = share / arms + (1.0 - share if taken == 0 else 0.0)
        return taken, prob, randomized

    # --- after arbitration -------------------------------------------------------------

    def settle(self, decisions: list, snapshot: Snapshot) -> list[AuditEvent]:
        """Tie this pass's choices to the decisions made (a choice whose start arbitration refused is
        dropped, its budget given back), join earlier ones to their rewards; the audit events."""
        events: list[AuditEvent] = []
        chosen, self._this_pass = self._this_pass, {}
        for d in decisions:
            logged = chosen.pop(d.action.job_id, None)
            if logged is None or d.action.action != "start":
                continue
            logged.decision_id = d.decision_id
            self.pending[d.decision_id] = logged
            self.stats.count(logged)
            if self.keep_history:
                self.history.append(logged)
            events.append(decision_event(logged))
        for logged in chosen.values():
            if logged.acted:
                self.budget.give_back(logged.job_id, logged.ts, logged.spends)
        events += self._rewards(snapshot)
        return events + self.memory.settle(decisions, snapshot) + self.knobs.settle()

    def _rewards(self, snapshot: Snapshot) -> list[AuditEvent]:
        events = []
        now = snapshot.ts
        for decision_id, logged in list(self.pending.items()):
            job = snapshot.job(logged.job_id)
            if job is None or now - logged.ts > self.config.reward_within_s:
                del self.pending[decision_id]
                self.stats.unrewarded += 1
                continue
            if not _reported_after(job, logged):
                continue
            del self.pending[decision_id]
            devices = sum(len(part.gpus) for part in job.placement) or job.gpus
            reward = -math.log(job.step_time_s * (devices + logged.blocked[logged.taken]))
            logged.reward = reward
            self.learner.learn(logged.shared, logged.arms, logged.taken, reward, logged.taken_prob)
            s = self.stats
            s.rewarded += 1
            s.reward_sum += reward
            if logged.taken == 0:
                s.rules_rewarded += 1
                s.rules_reward_sum += reward
            events.append(reward_event(logged, decision_id, job, devices, self.learner.version, now))
        return events


def _taken(proposals: list[Proposal]) -> Taken:
    """The devices the pass's proposals take (shadow ones take none)."""
    placed = (getattr(p.action, "placement", None) or () for p in proposals if not p.shadow)
    return {(part.node, g) for placement in placed for part in placement for g in part.gpus}


def _eligible(p: Proposal) -> bool:
    """A start decision point 1 may choose for."""
    return p.kind == "start" and not p.shadow and not p.for_job and not p.action.train_overrides


def _reported_after(job, logged: Logged) -> bool:
    """A progress report of the attempt the decision started (not one left over from before)."""
    return (
        job.status == JobStatus.RUNNING
        and job.attempt > logged.attempt
        and job.step_time_s is not None
        and job.step_time_s > 0
        and job.step is not None
        and (logged.step is None or job.step > logged.step)
    )
