"""Rules and configuration, hot reloaded: adc_config.yaml and the rule plugins are checked every
`decider.reload_interval`, a policy the api stored is picked up by the first pass that sees its
version; each candidate is validated (every rule binds its config, schedules applied; a new rule
version survives a dry run within its budget) and swapped atomically. Failures keep the previous
version and are audited with the file and the error, as is each schedule starting and ending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from services.decider.cluster_view import ClusterView
from services.decider.core import EngineCore
from services.decider.live_config import ConfigChange, LiveConfig
from services.decider.plugin import Rule
from services.decider.rule_loader import ReloadEvent, RuleRegistry
from services.decider.rule_runner import RuleRunner
from services.decider.rule_watches import RuleWatches
from services.decider.snapshot import Snapshot
from services.decider.snapshot_source import SnapshotSource
from services.decider.telemetry import TelemetryView
from shared.contracts.messages import AuditEvent
from shared.contracts.strategies import unknown_names
from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.config import AdcConfig, Strategies, merge_sections

log = logging.getLogger(__name__)
BUILTIN_RULES = Path(__file__).resolve().parent / "rules"


def rule_folders(config: AdcConfig) -> list[Path]:
    return [BUILTIN_RULES] + ([Path(config.decider.rules_dir)] if config.decider.rules_dir else [])


class HotReload:
    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        live: LiveConfig,
        registry: RuleRegistry,
        core: EngineCore,
        view: ClusterView,
        source: SnapshotSource,
        watches: RuleWatches,
        wake: Callable[[str], None],
        last_snapshot: Callable[[], Snapshot | None],
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.live = live
        self.registry = registry
        self.core = core
        self.view = view
        self.source = source
        self.watches = watches
        self._woken = wake  # run a regular pass soon, for this reason
        self._last_snapshot = last_snapshot  # a real snapshot to dry-run new rule versions on, once there is one
        self._policy_lock = asyncio.Lock()  # the two passes apply a new policy or schedule once
        self._active_schedules: tuple[str, ...] = ()

    @property
    def config(self) -> AdcConfig:
        return self.live.current

    async def reload_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.clock.wait(stop, self.config.decider.reload_interval)
            if stop.is_set():
                return
            try:
                await self.reload()
            except Exception:  # the next check tries again
                log.exception("reload failed")

    async def reload(self) -> list[ReloadEvent]:
        """Pick up a changed adc_config.yaml and changed rule plugins; audit what happened."""
        await self._config_changed(self.live.check_file(self.check_rules))
        events = await self.registry.scan(self.validate_rule)
        for event in events:
            await self.bus.audit(
                AuditEvent(
                    ts=self.clock.now(),
                    source="decider",
                    kind=event.kind,
                    rule=", ".join(event.rules) or None,
                    reason=event.describe(),
                    data={"file": event.file, "rules": list(event.rules), "error": event.error},
                )
            )
            log.log(logging.WARNING if event.error else logging.INFO, "%s", event.describe())
        if events:
            self._woken("rules reloaded")
        return events

    async def config_at(self, now: float, version: int) -> tuple[AdcConfig, tuple[str, ...]]:
        """The config in force now: a newer policy applied first (once, whichever pass sees it first:
        versions only grow), schedules noted, watches updated."""
        async with self._policy_lock:
            if version > self.live.policy_version:
                policy = await self.source.latest_policy(self.live.policy_version, version)
                if policy is not None:
                    await self._config_changed(self.live.apply_policy(*policy, self.check_rules))
            config, active = self.live.scheduled.at(now)
            await self._note_schedules(active, now)
        self.watches.update(config)
        return config, active

    async def _note_schedules(self, active: tuple[str, ...], now: float) -> None:
        if active == self._active_schedules:
            return
        for name, kind in [(n, "schedule.started") for n in active if n not in self._active_schedules] + [
            (n, "schedule.ended") for n in self._active_schedules if n not in active
        ]:
            await self.bus.audit(
                AuditEvent(
                    ts=now,
                    source="decider",
                    kind=kind,
                    reason=f"schedule {name} {kind.split('.')[1]}",
                    data={"schedule": name},
                )
            )
        self._active_schedules = active

    def check_rules(self, config: AdcConfig) -> list[str]:
        """Every loaded rule must bind its section of `config`, with each schedule applied too, and
        every section must belong to a loaded rule (plugin names are known only here)."""
        loaded = self.registry.rules
        problems = unknown_names(config.strategies.model_extra or {}, loaded)
        for i, schedule in enumerate(config.schedules):
            problems += [f"schedules.{i}.{p}" for p in unknown_names(schedule.strategies, loaded)]
        for name, strategies in self._variants(config):
            variant = config.model_copy(update={"strategies": strategies})
            for rule in self.registry.rules.values():
                try:
                    rule.configure(variant)
                except Exception as err:  # noqa: BLE001 - the config's problem, reported
                    problems.append(f"rule {rule.name}{name}: {err}")
        return problems

    @staticmethod
    def _variants(config: AdcConfig) -> list[tuple[str, Strategies]]:
        variants = [("", config.strategies)]
        for schedule in config.schedules:
            merged = merge_sections(config.strategies.model_dump(), schedule.strategies)
            variants.append((f" (schedule {schedule.name})", Strategies.model_validate(merged)))
        return variants

    async def validate_rule(self, rule: Rule) -> list[str]:
        """A new rule version must bind its config and survive a dry run within its budget."""
        try:
            typed = rule.configure(self.config)
            for _, strategies in self._variants(self.config)[1:]:
                rule.configure(self.config.model_copy(update={"strategies": strategies}))
        except Exception as err:  # noqa: BLE001 - the plugin's problem, reported
            return [f"config: {err}"]
        runner = RuleRunner()
        now = self.clock.now()
        trials = [Snapshot(ts=now, telemetry=TelemetryView.empty(now))]
        if (last := self._last_snapshot()) is not None:
            trials.append(last)
        for snap in trials:
            run = await runner.run(rule, snap, typed, typed.budget_ms / 1000.0)
            if run.overrun:
                return [f"dry run took longer than its budget of {typed.budget_ms:g} ms"]
            if run.error:
                return [f"dry run raised {run.error}"]
        return []

    async def _config_changed(self, change: ConfigChange | None) -> None:
        if change is None:
            return
        await self.bus.audit(
            AuditEvent(ts=self.clock.now(), source="decider", kind=change.kind, reason=change.reason, data=change.data)
        )
        log.log(logging.WARNING if change.failed else logging.INFO, "%s", change.reason)
        if change.failed:
            return
        new = self.config
        self.core.limiter.per_minute = new.decider.max_disruptions_per_minute
        self.core.decision_timeout_s = 3 * new.controller.timeout
        self.view.max_gap_s, self.view.stale_after_s = new.decider.max_gap_s, new.decider.stale_after_s
        self.registry.set_folders(rule_folders(new))
        self.watches.forget()
        self._woken("config changed")
