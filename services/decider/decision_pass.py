"""What one pass does, after Kueue's `schedule()` phases: read what changed (controller state, the
config in force, jobs, the executor's word on decisions in flight), settle the expectations that
are over, build the snapshot, evaluate the rules (`EngineCore`: arbitration, cooldowns, the rate
limit, decisions in flight), and hand the result to the publisher. The regular and the urgent pass
(pass_scheduler) both come here; arbitration is synchronous, so one pass's decisions are in flight
before the other arbitrates, and devices either books count as taken for both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from services.decider.cluster_view import ClusterView
from services.decider.core import EngineCore, PassResult
from services.decider.live_config import LiveConfig
from services.decider.plugin import Rule
from services.decider.publishing import Publisher
from services.decider.snapshot import Snapshot
from services.decider.snapshot_source import SnapshotSource
from shared.contracts.reason_codes import Reason, ReasonCode
from shared.infra.clock import Clock
from shared.infra.config import AdcConfig

log = logging.getLogger(__name__)

ConfigAt = Callable[[float, int], Awaitable[tuple[AdcConfig, tuple[str, ...]]]]


class DecisionPass:
    def __init__(
        self,
        clock: Clock,
        live: LiveConfig,
        source: SnapshotSource,
        core: EngineCore,
        view: ClusterView,
        publisher: Publisher,
        config_at: ConfigAt,
        rules: Callable[[], dict[str, Rule]],
    ) -> None:
        self.clock = clock
        self.live = live
        self.source = source
        self.core = core
        self.view = view
        self.publisher = publisher
        self._config_at = config_at  # the config in force at a time, given the policy version read
        self._rules = rules  # every loaded rule (reloads replace them)
        self.last_snapshot: Snapshot | None = None
        self.last_pass: PassResult | None = None  # the last regular pass's result
        self.paused: str | None = None  # why the controller was paused at the last pass (None: it was not)

    async def run(self, only: dict[str, Rule] | None = None) -> PassResult:
        """One pass: every rule, or `only` these (the rules whose watched window was just satisfied:
        arbitration, cooldowns, the limiter and the decisions in flight apply as in any pass; the
        pending reasons, which come from all rules, are left as the last full pass wrote them).

        An urgent pass (`only`) asks Postgres what it asks at once (controller state, the jobs events
        named, decisions in flight), and leaves the periodic reconcile of the job view to the regular
        pass: its cost does not grow with the cluster beyond building the snapshot."""
        now = self.clock.now()
        flying = [f.decision_id for f in self.core.in_flight.values()]
        if only is None:
            version, paused = await self.source.controller_state(now)
            config, active = await self._config_at(now, version)
            jobs = await self.source.jobs(config, now)
            states = await self.source.decision_states(flying)
        else:
            guess, _ = self.live.scheduled.at(now)
            state = self.source.recent_controller_state(now, self.live.current.controller.interval)
            if state is None or flying:
                reads = [self.source.jobs(guess, now, whole=False), self.source.decision_states(flying)]
                if state is None:
                    reads.append(self.source.controller_state(now))
                jobs, states, *read = await asyncio.gather(*reads)
                state = read[0] if read else state
            else:  # what events named is read again, if anything; else nothing is asked at all
                jobs, states = await self.source.jobs(guess, now, whole=False), {}
            version, paused = state
            config, active = await self._config_at(now, version)
            if config is not guess:  # a new policy meanwhile: the jobs as its priority levels make them
                jobs = await self.source.jobs(config, now, whole=False)
        live = self.source.book.jobs  # only the jobs of decisions in flight are looked up
        statuses = {j: live[j].status for j in self.core.in_flight if j in live}
        for job_id, why in self.core.resolve(statuses, states, now):
            log.debug("expectation for %s settled: %s", job_id, why)
        snap = await self.source.build(now, config, jobs, self.core.booked(), active)
        self.last_snapshot = snap
        self.paused = paused
        if paused:  # decide nothing; say so to everyone who asks why their job waits
            why = Reason(ReasonCode.PENDING_CONTROLLER_PAUSED, f"{paused}; no new decisions")
            result = PassResult(snapshot_ts=now, pending={j.id: {"controller": why} for j in snap.pending()})
        else:
            result = await self.core.evaluate(snap, self._rules() if only is None else only, config)
        await self.publisher.publish(result, snap)
        unreadable = await self.publisher.report_unreadable(now)
        unreadable |= await self.publisher.waiting.report(now, decide=not paused)
        if only is not None:
            return result
        self.last_pass = result
        self.view.prune(now, config.decider.window_s)
        await self.publisher.publish_pending(result, snap, now, unreadable)
        return result
