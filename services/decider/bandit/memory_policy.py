"""Decision point 2, memory pressure: when `oom_protection` proposes its response for a hot job, the
bandit chooses among the feasible responses (memory_arms.py), the rule's own as arm 0. Its own
learner, statistics and random stream; the mode, exploration budget and cooldown are decision
point 1's (policy.py), shared. No I/O.

Shadow logs the rule's response with propensity 1 and never changes it (`shadow_explore` does not
apply here: every response stops the job). Active replaces it, within the exploration budget,
never for a job that is not preemptible or that the bandit acted on within `cooldown_s`; the
decision keeps the rule's name, precedence and cooldown, so arbitration and the rule's own
cooldown judge it as the rule's.

Reward, on the first progress report of the attempt the response started (or `reward_within_s`
after the decision, if the job has not run again by then), with c = step time x devices (GPU-
seconds a step) before (0) and after (1):
    reward = -log(c1 / c0) - lost_gpu_s / (memory_window_s x devices before)
where lost_gpu_s = (time since the decision - steps made since x the new step time) x the larger
device count: the checkpoint, the restart, a requeue's wait and steps done again, as the job's own
reports show them. Floored at `REWARD_FLOOR`; a job that ran out of memory after the decision (its
`oom_retries` grew) gets the floor.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np

from services.decider.arbitration import Proposal
from services.decider.bandit.arms import Taken
from services.decider.bandit.budget import ExplorationBudget
from services.decider.bandit.learner import Learner
from services.decider.bandit.memory_arms import memory_arms, memory_context
from services.decider.bandit.records import Logged, Stats, decision_event, memory_reward_event
from services.decider.snapshot import Snapshot
from shared.contracts.job_status import JobStatus
from shared.contracts.strategies import BanditConfig

RULE = "oom_protection"
POINT = "memory"
REWARD_FLOOR = -3.0


@dataclass
class MemoryPoint:
    config: BanditConfig
    budget: ExplorationBudget
    keep_history: bool = False
    learner: Learner | None = None
    stats: Stats = field(default_factory=Stats)
    pending: dict[str, Logged] = field(default_factory=dict)
    history: list[Logged] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.learner is None:
            self.learner = Learner(self.config.epsilon, self.config.seed)
        self._rng = np.random.default_rng([self.config.seed, 31])
        self._this_pass: dict[str, Logged] = {}

    def configure(self, config: BanditConfig) -> None:
        if config != self.config:
            self.learner = self.learner.with_epsilon(config.epsilon)
            self.config = config

    def reset(self) -> None:
        self.learner = Learner(self.config.epsilon, self.config.seed)
        self.stats = Stats()
        self.pending.clear()

    def status(self) -> dict:
        c = self.config
        return {
            "model_version": self.learner.version,
            "pending_rewards": len(self.pending),
            "act_margin": c.act_margin,
            "act_after": c.act_after,
            **self.stats.view(),
        }

    @staticmethod
    def eligible(p: Proposal) -> bool:
        return p.rule == RULE and not p.shadow

    def choose_one(self, p: Proposal, snapshot: Snapshot, settings, taken: Taken, now: float) -> Proposal:
        config = self.config
        job = snapshot.job(p.action.job_id)
        if job is None or not job.preemptible or job.status != JobStatus.RUNNING or job.id in self._this_pass:
            return p
        if settings is None or self.budget.cooling(job.id, now, config):
            return p
        arms = memory_arms(job, p.action, snapshot, settings, taken)
        if arms is None:
            return p
        shared = memory_context(job, snapshot)
        features = [a.features for a in arms]
        active = config.mode == "active"
        may_explore = not active or self.budget.may_explore(job.id, now, config)
        chosen, prob, greedy = self.learner.draw(
            shared, features, self._rng, may_explore, config.act_margin, config.act_after
        )
        taken_arm, taken_prob = (chosen, prob) if active else (0, 1.0)
        logged = Logged(
            id=uuid.uuid4().hex,
            job_id=job.id,
            ts=now,
            shared=shared,
            arms=features,
            placements=[],
            chosen=chosen,
            prob=prob,
            explored=chosen != greedy,
            taken=taken_arm,
            taken_prob=taken_prob,
            acted=active,
            mode=config.mode,
            attempt=job.attempt,
            step=job.step,
            model_version=self.learner.version,
            point=POINT,
            actions=[a.kind for a in arms],
            before={
                "step_time_s": job.step_time_s,
                "devices": job.gpu_count or job.gpus,
                "oom_retries": job.oom_retries,
            },
        )
        self._this_pass[job.id] = logged
        if active:
            self.budget.spend(job.id, now, logged.spends)
        if taken_arm == 0:
            return p
        arm = arms[taken_arm]
        taken |= {(part.node, g) for part in getattr(arm.action, "placement", None) or () for g in part.gpus}
        how = "explored" if logged.explored else "learned"
        evidence = dict(arm.action.evidence or {}) | {
            "bandit": {"arm": taken_arm, "propensity": round(taken_prob, 4), "explored": logged.spends},
            "rules_response": arms[0].kind,
        }
        reason = f"{arm.action.reason}; the bandit chose {arm.kind} over the rule's {arms[0].kind} ({how})"
        changed = arm.action.model_copy(update={"reason": reason, "evidence": evidence})
        return Proposal(p.rule, changed, p.precedence, False, p.cooldown_s)

    def settle(self, decisions: list, snapshot: Snapshot) -> list:
        events = []
        chosen, self._this_pass = self._this_pass, {}
        for d in decisions:
            logged = chosen.get(d.action.job_id)
            if logged is None or d.rule != RULE:
                continue
            del chosen[d.action.job_id]
            logged.decision_id = d.decision_id
            self.pending[d.decision_id] = logged
            self.stats.count(logged)
            if self.keep_history:
                self.history.append(logged)
            events.append(decision_event(logged))
        for logged in chosen.values():
            if logged.acted:
                self.budget.give_back(logged.job_id, logged.ts, logged.spends)
        return events + self._rewards(snapshot)

    def _rewards(self, snapshot: Snapshot) -> list:
        events = []
        now = snapshot.ts
        for decision_id, logged in list(self.pending.items()):
            job = snapshot.job(logged.job_id)
            if job is None:
                del self.pending[decision_id]
                self.stats.unrewarded += 1
                continue
            outcome = reward_of(logged, job, now, self.config)
            if outcome is None:
                continue
            del self.pending[decision_id]
            logged.reward, logged.lost_gpu_s = outcome
            self.learner.learn(logged.shared, logged.arms, logged.taken, logged.reward, logged.taken_prob)
            s = self.stats
            s.rewarded += 1
            s.reward_sum += logged.reward
            if logged.taken == 0:
                s.rules_rewarded += 1
                s.rules_reward_sum += logged.reward
            events.append(memory_reward_event(logged, decision_id, job, self.learner.version, now))
        return events


def reward_of(logged: Logged, job, now: float, config: BanditConfig) -> tuple[float, float] | None:
    """(reward, GPU-seconds lost) of a memory decision, or None while it is not known yet."""
    before = logged.before
    if job.oom_retries > before["oom_retries"]:
        return REWARD_FLOOR, math.nan  # it ran out of memory after all
    elapsed = now - logged.ts
    step0, devices0 = before["step_time_s"], max(1, before["devices"])
    ran = job.status == JobStatus.RUNNING and job.attempt > logged.attempt and (job.step_time_s or 0) > 0
    ran = ran and job.step is not None and (logged.step is None or job.step > logged.step)
    if not ran:
        if elapsed <= config.reward_within_s:
            return None
        lost = elapsed * devices0  # not running again within the window: all of it lost
        return max(REWARD_FLOOR, -lost / (config.memory_window_s * devices0)), lost
    devices = job.gpu_count or job.gpus
    made = job.step - (logged.step or 0)
    lost = max(0.0, elapsed - made * job.step_time_s) * max(devices0, devices)
    slower = math.log(job.step_time_s * devices / (step0 * devices0)) if step0 else 0.0
    return max(REWARD_FLOOR, -slower - lost / (config.memory_window_s * devices0)), lost
