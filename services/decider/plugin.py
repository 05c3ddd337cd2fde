"""The rule plugin contract.

A rule is a pure function over an immutable snapshot and its typed config:

    decide(snapshot: Snapshot, config: MyConfig) -> RuleOutput | list[Action]

It never touches NATS, Postgres, files or the clock (the snapshot carries the time). A plugin is
a Python file in a rules folder that defines `RULE = Rule(...)` (or `RULES = [...]`):

    from services.decider.plugin import Rule, RuleConfig

    class Config(RuleConfig):            # RuleConfig brings enabled, shadow, cooldown_s, budget_ms
        threshold: float = 0.5

    def decide(snapshot, config):
        return []

    RULE = Rule(name="my_rule", decide=decide, config=Config, description="what it does")

Its config comes from `strategies.<name>` in adc_config.yaml, validated by `config`; with no
section the model's defaults apply. A built-in rule's model is in shared/contracts/strategies.py (the api
validates policies with it); a plugin's is its own, and a section no loaded rule claims is refused. The engine owns everything else: windows, cooldowns,
hysteresis, arbitration, shadow mode, time budget, isolation and audit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from services.decider.cluster_view import Watch
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Action
from shared.contracts.strategies import RuleControls
from shared.infra.config import AdcConfig

RuleConfig = RuleControls  # the base every rule's config model extends
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class RuleOutput(NamedTuple):
    """What a rule returns: actions, and for jobs it looked at but leaves waiting, why."""

    actions: list[Any]
    pending: dict[str, str] = {}


@dataclass(frozen=True)
class Rule:
    name: str
    decide: Callable[[Snapshot, Any], RuleOutput | Sequence[Action]]
    config: type[RuleControls] = RuleControls
    description: str = ""
    precedence: int = 100
    # Builds the typed config from the whole config, for a rule that also reads other sections
    # (e.g. controller.enable_auto_scale). Default: strategies.<name> validated by `config`.
    bind: Callable[[AdcConfig], RuleControls] | None = None
    # Window predicates worth waking the engine for, e.g. memory above the threshold for for_s.
    watches: Callable[[Any], list[Watch]] | None = None
    # Seconds between evaluations (e.g. load_balance's rebalance_interval); None: every pass.
    period: Callable[[Any], float | None] | None = None
    source: str = field(default="", compare=False)

    def configure(self, config: AdcConfig) -> RuleControls:
        """This rule's typed config from the whole config; raises ValueError naming the problems."""
        if self.bind is not None:
            return self.bind(config)
        return section_config(config, self.name, self.config)


def section_config(config: AdcConfig, name: str, model: type[RuleControls]) -> RuleControls:
    value = config.strategies.section(name)
    if isinstance(value, model):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    try:
        return model.model_validate(value or {})
    except ValidationError as err:
        problems = [f"strategies.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]
        raise ValueError("; ".join(problems)) from None


def check_rule(rule: Any) -> list[str]:
    """Why `rule` is not a usable Rule (empty if it is)."""
    if not isinstance(rule, Rule):
        return [f"expected a Rule, got {type(rule).__name__}"]
    problems = []
    if not NAME_PATTERN.match(rule.name or ""):
        problems.append(f"rule name {rule.name!r} must match {NAME_PATTERN.pattern}")
    if not callable(rule.decide):
        problems.append(f"rule {rule.name}: decide is not callable")
    if not (isinstance(rule.config, type) and issubclass(rule.config, RuleControls)):
        problems.append(f"rule {rule.name}: config must be a subclass of RuleConfig")
    return problems


def normalize(output: Any) -> RuleOutput:
    """A rule may return RuleOutput, (actions, pending), or a bare list of actions."""
    if isinstance(output, RuleOutput):
        return output
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], dict):
        return RuleOutput(list(output[0]), dict(output[1]))
    if isinstance(output, (list, tuple)):
        return RuleOutput(list(output), {})
    raise TypeError(f"a rule returns a list of actions or RuleOutput, not {type(output).__name__}")
