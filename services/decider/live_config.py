"""The config in force, changed without a restart: adc_config.yaml (hot reloaded when its
content changes) with the API's policy document over it.

The policy document (`policies`, newest version; written by admins through `PUT /v1/policies`)
replaces the file's `controller`, `strategies` and `schedules`; everything else comes from the
file. A candidate is validated whole (every problem at once) and by the caller's check (every
loaded rule must bind its section) before it replaces the current one in one assignment; on
any problem the previous config stays in force and the change says why, for the audit log.
`bus` and `database` are kept as started: changing them needs a restart, and the change says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.decider.schedules import ScheduledConfig
from shared.infra.config import AdcConfig, ConfigError, apply_policy, load_config

Check = Callable[[AdcConfig], list[str]]


@dataclass(frozen=True)
class ConfigChange:
    kind: str  # config.reloaded | config.reload_failed | policy.applied | policy.apply_failed
    reason: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.kind.endswith("failed")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class LiveConfig:
    def __init__(self, path: Path, config: AdcConfig) -> None:
        self.path = path
        self.file_config = config
        self._file_digest = _digest(path)
        self.policy_version = 0
        self._policy: dict[str, Any] | None = None
        self.current = config
        self.scheduled = ScheduledConfig(config)

    def _compose(self, file_config: AdcConfig, policy: dict[str, Any] | None) -> AdcConfig:
        return apply_policy(file_config, policy, f"policy version {self.policy_version}")  # the api's check too

    def _swap(self, candidate: AdcConfig, check: Check, source: str) -> tuple[list[str], list[str]]:
        """Validate and install; returns (changed sections, sections that need a restart)."""
        problems = check(candidate)
        if problems:
            raise ConfigError(source, problems)
        old = self.current
        restart = [k for k in ("bus", "database") if getattr(candidate, k) != getattr(old, k)]
        if candidate.decider.window_s != old.decider.window_s:
            restart.append("decider.window_s")
        candidate = candidate.model_copy(update={"bus": old.bus, "database": old.database})
        changed = [k for k in AdcConfig.model_fields if getattr(candidate, k) != getattr(old, k)]
        self.current = candidate
        self.scheduled = ScheduledConfig(candidate)
        return changed, restart

    def check_file(self, check: Check) -> ConfigChange | None:
        """Apply adc_config.yaml if its content changed since last looked at."""
        digest = _digest(self.path)
        if digest is None or digest == self._file_digest:
            return None
        self._file_digest = digest
        where = str(self.path)
        try:
            file_config = load_config(self.path)
            changed, restart = self._swap(self._compose(file_config, self._policy), check, where)
        except ConfigError as err:
            return ConfigChange(
                "config.reload_failed",
                f"{where}: not applied, the previous config stays in force: {'; '.join(err.problems)}",
                {"file": where, "problems": err.problems},
            )
        self.file_config = file_config
        note = f"; needs a restart to change: {', '.join(restart)}" if restart else ""
        return ConfigChange(
            "config.reloaded",
            f"{where}: applied (changed: {', '.join(changed) or 'nothing'}){note}",
            {"file": where, "changed": changed, "restart_needed": restart},
        )

    def apply_policy(self, version: int, body: dict[str, Any] | None, check: Check) -> ConfigChange | None:
        """Apply the newest policy document (None: back to the file's own sections)."""
        if version == self.policy_version:
            return None
        previous = self.policy_version
        self.policy_version = version
        try:
            changed, _ = self._swap(self._compose(self.file_config, body), check, f"policy version {version}")
        except ConfigError as err:
            return ConfigChange(
                "policy.apply_failed",
                f"policy version {version} not applied, version {previous} stays in force: {'; '.join(err.problems)}",
                {"version": version, "problems": err.problems},
            )
        self._policy = body
        return ConfigChange(
            "policy.applied",
            f"policy version {version} applied (changed: {', '.join(changed) or 'nothing'})",
            {"version": version, "changed": changed},
        )
