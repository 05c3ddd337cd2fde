"""Which rules watch which windows: each enabled rule's `watches` under the config in force, handed
to the cluster view (which fires a watch when its predicate becomes true), and the rules an urgent
pass runs for the watches fired."""

from __future__ import annotations

import logging

from services.decider.cluster_view import ClusterView, Watch
from services.decider.plugin import Rule
from services.decider.rule_loader import RuleRegistry
from shared.infra.config import AdcConfig

log = logging.getLogger(__name__)


class RuleWatches:
    def __init__(self, view: ClusterView, registry: RuleRegistry) -> None:
        self.view = view
        self.registry = registry
        self.owners: dict[Watch, set[str]] = {}  # the rules that asked for each watch
        self._key: tuple | None = None  # the config and rules the watches were last worked out for

    def forget(self) -> None:
        """Work the watches out again at the next `update` (the config changed)."""
        self._key = None

    def update(self, config: AdcConfig) -> None:
        key = (id(config), id(self.registry.rules))
        if key == self._key:
            return
        watches: list[Watch] = []
        owners: dict[Watch, set[str]] = {}
        for name, rule in self.registry.rules.items():
            if rule.watches is None:
                continue
            try:
                typed = rule.configure(config)
                if typed.enabled:
                    for watch in rule.watches(typed):
                        watches.append(watch)
                        owners.setdefault(watch, set()).add(name)
            except Exception as err:  # noqa: BLE001 - a watch is an optimization; the tick still evaluates
                log.warning("watches of rule %s unavailable: %s", rule.name, err)
        self.view.set_watches(watches)
        self.owners = owners
        self._key = key

    def rules_of(self, watches: set[Watch]) -> dict[str, Rule]:
        names = set().union(*(self.owners.get(w, ()) for w in watches))
        return {n: r for n, r in self.registry.rules.items() if n in names}
