"""Schedules: strategy overrides that hold only in a daily time window.

A schedule names a window (start and end as HH:MM in its timezone, optionally only on some
days) and strategy keys to merge over `strategies` while it is active, e.g. no preemption at
night or low-priority jobs growing into idle GPUs at night. A window whose end is before its
start runs overnight (22:00-06:00) and belongs to the day it starts on. Schedules apply in
the order written; a later one wins on the same key. Pure: the time is an argument.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from shared.infra.config import AdcConfig, Schedule, Strategies, merge_sections

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _hhmm(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def is_active(schedule: Schedule, now: float) -> bool:
    local = datetime.fromtimestamp(now, ZoneInfo(schedule.timezone))
    start, end, t = _hhmm(schedule.start), _hhmm(schedule.end), local.time()

    def day_ok(day: datetime) -> bool:
        return schedule.days is None or _DAYS[day.weekday()] in schedule.days

    if start == end:
        return day_ok(local)
    if start < end:
        return start <= t < end and day_ok(local)
    if t >= start:
        return day_ok(local)
    return t < end and day_ok(local - timedelta(days=1))


def active_schedules(config: AdcConfig, now: float) -> tuple[str, ...]:
    return tuple(s.name for s in config.schedules if is_active(s, now))


class ScheduledConfig:
    """The config in force at a given time: the base with active schedules merged over it.

    The merged config is cached per set of active schedules, so a tick costs a clock lookup."""

    def __init__(self, config: AdcConfig) -> None:
        self.base = config
        self._cache: dict[tuple[str, ...], AdcConfig] = {(): config}

    def at(self, now: float) -> tuple[AdcConfig, tuple[str, ...]]:
        active = active_schedules(self.base, now)
        if active not in self._cache:
            strategies = self.base.strategies.model_dump()
            for schedule in self.base.schedules:
                if schedule.name in active:
                    strategies = merge_sections(strategies, schedule.strategies)
            merged = Strategies.model_validate(strategies)  # validated when the config loaded
            self._cache[active] = self.base.model_copy(update={"strategies": merged})
        return self._cache[active], active
