"""Decision point 3, queue knobs (`bandit.knobs`): once a window (`bandit.knob_window_s`) the
bandit chooses a setting of the queue rules (knob_arms.py, the configured values as arm 0) from
the load regime as the window opens. Its own learner, statistics and random stream; the mode and
the hourly exploration budget are decision point 1's (policy.py), shared. No I/O.

Shadow chooses and audits, and the rules read the configured values (the arm taken is 0, with
propensity 1). Active overlays the chosen setting on the config the rules read in every pass of
the window (`EngineCore` asks before the rules run); an exploring window spends one unit of the
hourly budget, and with none left the greedy arm is played with propensity 1. The rules' hard
constraints are theirs: a knob only changes how far they go within them.

Reward, when the window ends, joined to the window's decision by its decision id:
    reward = -waiting_gpu_s / (cluster GPUs x window seconds)
where waiting_gpu_s sums, over the window's passes, the devices the pending jobs ask for times the
seconds to the next pass: minus the mean share of the cluster the queue waited for. Normalized by
the cluster's size, so windows of different clusters and regimes compare; the load the window
started from is in the context. The audit event also carries the change in waiting GPU-hours
against the previous window. A window the decider did not see through (no pass for longer than a
window: the bandit was off, the decider stopped) is dropped unrewarded.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

from services.decider.bandit.budget import ExplorationBudget
from services.decider.bandit.knob_arms import KnobArm, cluster_gpus, knob_arms, knob_context, overlay, waiting_gpus
from services.decider.bandit.learner import Learner
from services.decider.bandit.records import Logged, Stats, knob_decision_event, knob_reward_event
from services.decider.snapshot import Snapshot
from shared.contracts.strategies import BanditConfig
from shared.infra.config import AdcConfig

POINT = "knobs"


@dataclass
class Window:
    logged: Logged
    arms: list[KnobArm]
    start: float
    end: float
    cluster_gpus: int
    last_ts: float
    last_waiting: int
    waiting_gpu_s: float = 0.0

    @property
    def arm(self) -> KnobArm:
        return self.arms[self.logged.taken]


@dataclass
class KnobPoint:
    config: BanditConfig
    budget: ExplorationBudget
    keep_history: bool = False
    learner: Learner | None = None
    stats: Stats = field(default_factory=Stats)
    history: list[Logged] = field(default_factory=list)
    window: Window | None = None

    def __post_init__(self) -> None:
        if self.learner is None:
            self.learner = Learner(self.config.epsilon, self.config.seed)
        self._rng = np.random.default_rng([self.config.seed, 37])
        self._events: list = []
        self._overlaid: tuple[AdcConfig, str, AdcConfig] | None = None  # (config in force, arm, overlay)
        self.previous_gpu_h: float | None = None

    def configure(self, config: BanditConfig) -> None:
        if config != self.config:
            self.learner = self.learner.with_epsilon(config.epsilon)
            self.config = config

    def reset(self) -> None:
        self.learner = Learner(self.config.epsilon, self.config.seed)
        self.stats = Stats()
        self.window = None
        self.previous_gpu_h = None

    def restore(self, learner: Learner, stats: dict | None) -> None:
        self.learner = learner.with_epsilon(self.config.epsilon)
        self.stats = Stats(**{k: v for k, v in (stats or {}).items() if k in Stats.__dataclass_fields__})

    def status(self) -> dict:
        w = self.window
        now = {"arm": w.arm.name, "ends_at": w.end, "acted": w.logged.acted} if w is not None else None
        c = self.config
        return {
            "model_version": self.learner.version,
            "window": now,
            "act_margin": c.act_margin,
            "act_after": c.act_after,
            **self.stats.view(),
        }

    # --- before the rules run ----------------------------------------------------------

    def overlay(self, config: AdcConfig, snapshot: Snapshot) -> AdcConfig:
        """The config the rules read this pass: the window's setting over `config` when it acts,
        else `config` itself. Closes a window that has ended and opens the next."""
        if not self.config.knobs:
            return config
        now, w = snapshot.ts, self.window
        if w is not None and now - w.last_ts > self.config.knob_window_s:
            self.stats.unrewarded += 1  # a gap longer than a window: its waiting is not known
            w = self.window = None
        if w is not None:
            w.waiting_gpu_s += w.last_waiting * max(0.0, min(now, w.end) - w.last_ts)
            w.last_ts = now
            if now >= w.end:
                self._close(w, now)
                w = self.window = None
        if w is None:
            w = self.window = self._open(config, snapshot, now)
        w.last_waiting = waiting_gpus(snapshot)
        arm = w.arm
        if not w.logged.acted or not arm.settings:
            return config
        kept = self._overlaid
        if kept is None or kept[0] is not config or kept[1] != arm.name:  # the same object while it holds
            kept = self._overlaid = (config, arm.name, overlay(config, arm))
        return kept[2]

    def _open(self, config: AdcConfig, snapshot: Snapshot, now: float) -> Window:
        arms = knob_arms(config)
        shared = knob_context(snapshot)
        features = [a.features for a in arms]
        active = self.config.mode == "active"
        may_explore = not active or self.budget.may_explore_window(now, self.config)
        chosen, prob, greedy = self.learner.draw(
            shared, features, self._rng, may_explore, self.config.act_margin, self.config.act_after
        )
        taken, taken_prob = (chosen, prob) if active else (0, 1.0)
        total = cluster_gpus(snapshot)
        logged = Logged(
            id=uuid.uuid4().hex,
            job_id="",
            ts=now,
            shared=shared,
            arms=features,
            placements=[],
            chosen=chosen,
            prob=prob,
            explored=chosen != greedy,
            taken=taken,
            taken_prob=taken_prob,
            acted=active,
            mode=self.config.mode,
            attempt=0,
            step=None,
            model_version=self.learner.version,
            point=POINT,
            actions=[a.name for a in arms],
            before={"waiting_gpus": waiting_gpus(snapshot), "cluster_gpus": total, "settings": arms[taken].settings},
        )
        logged.decision_id = uuid.uuid4().hex  # no executor decision: the window's own
        if logged.spends:
            self.budget.spend_window(now)
        self.stats.count(logged)
        if self.keep_history:
            self.history.append(logged)
        end = now + self.config.knob_window_s
        self._events.append(knob_decision_event(logged, end))
        return Window(logged, arms, now, end, total, now, 0)

    def _close(self, w: Window, now: float) -> None:
        logged = w.logged
        span = max(1e-9, min(now, w.end) - w.start)
        logged.waiting_gpu_s = w.waiting_gpu_s
        logged.reward = -w.waiting_gpu_s / (max(1, w.cluster_gpus) * span)
        self.learner.learn(logged.shared, logged.arms, logged.taken, logged.reward, logged.taken_prob)
        s = self.stats
        s.rewarded += 1
        s.reward_sum += logged.reward
        if logged.taken == 0:
            s.rules_rewarded += 1
            s.rules_reward_sum += logged.reward
        gpu_h = w.waiting_gpu_s / 3600.0
        change = None if self.previous_gpu_h is None else gpu_h - self.previous_gpu_h
        self.previous_gpu_h = gpu_h
        self._events.append(knob_reward_event(logged, change, self.learner.version, now))

    # --- after arbitration -------------------------------------------------------------

    def settle(self) -> list:
        """The audit events of the windows opened and closed this pass."""
        events, self._events = self._events, []
        return events
