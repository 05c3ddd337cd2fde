"""The bandit in the live decider: attached to `EngineCore` while `bandit.mode` is not off (a
reload switches it, the learner kept), its learner loaded from Postgres before the first pass this
decider leads (at start and after a failover), its audit events sent after each pass, and the
learner written back by the leader every `bandit.save_every_s` (fenced by the lease's token) and
when the decider stops; the memory-pressure and queue-knob points' learners likewise, each in its
own row (`memory`, `knobs`). A reset the api asked for is carried out at the next write, for every
point, and audited.
"""

from __future__ import annotations

import asyncio
import logging
import math

from services.decider.bandit.knob_policy import POINT as KNOBS
from services.decider.bandit.learner import Learner
from services.decider.bandit.memory_policy import POINT as MEMORY
from services.decider.bandit.policy import BanditPolicy
from services.decider.bandit.records import Stats
from services.decider.bandit.store import BanditStore
from services.decider.core import EngineCore, PassResult
from services.decider.leadership import Leadership
from shared.contracts.messages import AuditEvent
from shared.contracts.strategies import BanditConfig
from shared.infra.bus import Bus
from shared.infra.clock import Clock

log = logging.getLogger(__name__)


class BanditKeeper:
    def __init__(self, store: BanditStore, bus: Bus, clock: Clock, core: EngineCore, leadership: Leadership) -> None:
        self.store = store
        # Decision points 2 and 3: their learners, each in its own row.
        self.point_stores = {MEMORY: BanditStore(store.pool, MEMORY), KNOBS: BanditStore(store.pool, KNOBS)}
        self.bus = bus
        self.clock = clock
        self.core = core
        self.leadership = leadership
        self.policy: BanditPolicy | None = None
        self._stale = True  # what is in memory may be older than the stored model: load before leading
        self._saved_at = -math.inf
        self._lock = asyncio.Lock()
        self._saving: asyncio.Future | None = None

    def leading(self) -> None:
        """This decider leads now: the previous leader's model is in Postgres, not here."""
        self._stale = True

    @property
    def fence(self) -> int | None:
        """The token a write carries (0 without leases); None when this decider may not write."""
        if not self.leadership.fenced:
            return 0
        return self.leadership.token if self.leadership.leads else None

    async def before_pass(self, config: BanditConfig) -> None:
        if config.mode == "off":
            self.core.bandit = None  # the policy is kept: switching back on keeps what it learned
            return
        if self.policy is None:
            self.policy = BanditPolicy(config)
        else:
            self.policy.configure(config)
        if self._stale and self.leadership.leads:
            await self.load()
        self.core.bandit = self.policy

    async def load(self) -> None:
        async with self._lock:
            if not self._stale:
                return
            stored = await self.store.load()
            if stored is not None:
                learner = Learner(self.policy.config.epsilon, self.policy.config.seed, stored.model, stored.version)
                self.policy.restore(learner, stored.stats)
                log.info("bandit model version %d loaded", stored.version)
            config = self.policy.config
            for point, store in self.point_stores.items():
                other = await store.load()
                if other is not None:
                    side = self._point(point)
                    side.learner = Learner(config.epsilon, config.seed, other.model, other.version)
                    side.stats = Stats(**{k: v for k, v in other.stats.items() if k in Stats.__dataclass_fields__})
            self._stale = False

    async def after_pass(self, result: PassResult) -> None:
        for event in result.bandit:
            await self.bus.audit(event)
        due = self.policy is not None and self.clock.now() - self._saved_at >= self.policy.config.save_every_s
        if due and self.core.bandit is not None and (self._saving is None or self._saving.done()):
            self._saved_at = self.clock.now()
            self._saving = asyncio.ensure_future(self._save_quietly())  # no pass waits on the write

    async def _save_quietly(self) -> None:
        try:
            await self.save()
        except Exception as err:  # noqa: BLE001 - the next write tries again
            log.warning("bandit model not written: %s", err)

    async def save(self) -> bool:
        """Write the learner (the leader only); False when not written."""
        fence, policy = self.fence, self.policy
        if policy is None or fence is None or self._stale:
            return False
        async with self._lock:
            now = self.clock.now()
            self._saved_at = now
            saved = await self.store.save(
                policy.learner.to_bytes(), policy.learner.version, policy.status(now), fence, self.leadership.instance
            )
            if not saved.written:
                log.warning("bandit model not written: a newer leader holds it")
                self._stale = True
                return False
            for point, store in self.point_stores.items():
                side = self._point(point)
                await store.save(
                    side.learner.to_bytes(), side.learner.version, side.status(), fence, self.leadership.instance
                )
            if saved.reset_by is not None:
                await self._reset(saved.reset_by, fence, now)
            return True

    def _point(self, point: str):
        return self.policy.memory if point == MEMORY else self.policy.knobs

    async def _reset(self, by: str, fence: int, now: float) -> None:
        policy = self.policy
        version = policy.learner.version
        policy.reset()
        for point, store in self.point_stores.items():
            side = self._point(point)
            await store.reset(side.learner.to_bytes(), fence, side.status(), self.leadership.instance)
        if await self.store.reset(policy.learner.to_bytes(), fence, policy.status(now), self.leadership.instance):
            await self.bus.audit(
                AuditEvent(
                    ts=now,
                    source="decider",
                    kind="bandit.reset",
                    rule="bandit",
                    reason=f"bandit model reset as {by} asked (it had learned {version} update(s))",
                    data={"requested_by": by, "previous_version": version, "instance": self.leadership.instance},
                )
            )
