"""The decider: the cluster view fed from the bus, a pass each `controller.interval` and on
relevant events, decisions out to the executor, everything audited.

`DeciderEngine` is the composition of its parts, each with one job (after Kueue's scheduler and
Ray autoscaler v2's Reconciler / InstanceManager / Scheduler):
- ingest: the bus handlers, which keep the cluster view and the job book current and wake passes;
- pass_scheduler: when passes run, the regular one (interval, wakes, the gap between passes) and
  the urgent one (a watched window just satisfied: its rules at once, beside the regular pass);
- decision_pass: what a pass does (read, settle expectations, snapshot, evaluate with `EngineCore`);
- publishing: decisions to the executor, decisions, incidents and held proposals to the audit,
  pending reasons to the board;
- hot_reload: rules and adc_config.yaml checked, validated, swapped, audited; policies and schedules;
- leadership: whether this instance decides, and the fencing token its decisions carry.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import asyncpg

from services.decider.bandit.keeper import BanditKeeper
from services.decider.bandit.store import BanditStore
from services.decider.cluster_view import ClusterView
from services.decider.core import EngineCore, PassResult
from services.decider.decision_pass import DecisionPass
from services.decider.hot_reload import HotReload, rule_folders
from services.decider.ingest import Ingest, IngestGate
from services.decider.leadership import Leadership
from services.decider.live_config import LiveConfig
from services.decider.pass_scheduler import PassScheduler
from services.decider.plugin import Rule
from services.decider.publishing import Publisher
from services.decider.rule_loader import ReloadEvent, RuleRegistry
from services.decider.rule_watches import RuleWatches
from services.decider.snapshot import Snapshot
from services.decider.snapshot_source import SnapshotSource
from shared.infra.bus import Bus
from shared.infra.clock import Clock, SystemClock
from shared.infra.config import DEFAULT_CONFIG_FILE, AdcConfig

log = logging.getLogger(__name__)


class DeciderEngine:
    def __init__(
        self,
        bus: Bus,
        pool: asyncpg.Pool,
        config: AdcConfig,
        clock: Clock | None = None,
        config_path: str | Path | None = None,
    ) -> None:
        self.bus = bus
        self.pool = pool
        self.clock = clock or SystemClock()
        self.live = LiveConfig(Path(config_path or os.environ.get("ADC_CONFIG") or DEFAULT_CONFIG_FILE), config)
        d = config.decider
        self.view = ClusterView(
            window_s=d.window_s,
            sample_interval_s=config.collector.interval,
            max_gap_s=d.max_gap_s,
            stale_after_s=d.stale_after_s,
            on_wake=lambda reason: self.passes.window_satisfied(reason),
        )
        self.registry = RuleRegistry(rule_folders(config))
        self.core = EngineCore(
            decision_timeout_s=3 * config.controller.timeout, max_disruptions_per_minute=d.max_disruptions_per_minute
        )
        self.source = SnapshotSource(pool, self.view, reconcile_s=d.reconcile_s)
        self.watches = RuleWatches(self.view, self.registry)
        self.leadership = Leadership(bus, config, self.clock, on_leading=self._leading)
        self.instance = self.leadership.instance
        self.publisher = Publisher(bus, pool, self.clock, self.core, self.source, self.leadership)
        self.bandit = BanditKeeper(BanditStore(pool), bus, self.clock, self.core, self.leadership)
        gate = IngestGate(self.clock)
        # `tick` is looked up at each call, so a subclass's or a test's own tick is the one the passes run.
        self.passes = PassScheduler(
            self.clock,
            lambda: self.config,
            self.view,
            self.core,
            self.watches,
            gate,
            tick=lambda only: self.tick(only),
            leads=lambda: self.leadership.leads,
            paused=lambda: self.decision_pass.paused,
        )
        self.ingest = Ingest(bus, self.clock, self.view, self.source, gate, wake=self.passes.woken)
        self.reloader = HotReload(
            bus,
            self.clock,
            self.live,
            self.registry,
            self.core,
            self.view,
            self.source,
            self.watches,
            wake=self.passes.woken,
            last_snapshot=lambda: self.last_snapshot,
        )
        self.decision_pass = DecisionPass(
            self.clock,
            self.live,
            self.source,
            self.core,
            self.view,
            self.publisher,
            config_at=self.reloader.config_at,
            rules=lambda: self.registry.rules,
        )

    @property
    def config(self) -> AdcConfig:
        return self.live.current

    @property
    def last_snapshot(self) -> Snapshot | None:
        return self.decision_pass.last_snapshot

    @property
    def last_pass(self) -> PassResult | None:
        return self.decision_pass.last_pass

    @property
    def paused(self) -> str | None:
        return self.decision_pass.paused

    async def run(self, stop: asyncio.Event) -> None:
        await self.reload()
        subs = await self.ingest.subscribe()
        tasks = [
            asyncio.create_task(self.reloader.reload_loop(stop)),
            asyncio.create_task(self.passes.wake_on(stop)),
            asyncio.create_task(self.passes.urgent_loop(stop)),
            asyncio.create_task(self.leadership.keep(stop)),
        ]
        try:
            await self.passes.regular_loop(stop)
        finally:
            try:  # what the bandit learned since its last write, while this decider still leads
                await self.bandit.save()
            except Exception as err:  # noqa: BLE001 - stopping anyway; the last periodic write stands
                log.warning("bandit model not written at stop: %s", err)
            for task in tasks:  # the lease's own task releases it as it ends
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sub in subs:
                await sub.unsubscribe()

    async def tick(self, only: dict[str, Rule] | None = None) -> PassResult:
        """One pass: every rule, or `only` these (an urgent pass; see DecisionPass.run)."""
        await self.bandit.before_pass(self.config.bandit)
        result = await self.decision_pass.run(only)
        await self.bandit.after_pass(result)
        return result

    async def reload(self) -> list[ReloadEvent]:
        """Pick up a changed adc_config.yaml and changed rule plugins; audit what happened."""
        return await self.reloader.reload()

    def _leading(self) -> None:
        """This instance leads now: whatever it expected before is stale, and its view of the tables
        is read whole by a regular pass before it decides (no urgent pass before that one)."""
        self.passes.ready.clear()
        self.core.in_flight.clear()
        self.bandit.leading()
        self.source.book.expire()
        self.source.tables_changed(self.clock.now())
        self.passes.woken("leading")
