"""Rules own their config: one registry of rule config models (shared/contracts/strategies.py) that agrees
with the built-in rules, unknown strategies refused naming the registered ones, one validation for
adc_config.yaml and policies, and no config key that nothing reads."""

from __future__ import annotations

import importlib
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from shared.contracts.strategies import BUILTIN, RuleControls
from shared.infra.config import AdcConfig, ConfigError, apply_policy, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
RULES = sorted(p.stem for p in (REPO / "services" / "decider" / "rules").glob("*.py") if not p.stem.startswith("_"))


def _rule(module: str):
    return importlib.import_module(f"services.decider.rules.{module}").RULE


def test_the_registry_is_exactly_the_built_in_rules_and_their_models():
    rules = {_rule(m).name: _rule(m) for m in RULES}
    assert set(rules) == set(BUILTIN)
    for name, rule in rules.items():
        # A rule that also reads other sections (e.g. controller.enable_auto_scale) extends its model.
        assert issubclass(rule.config, BUILTIN[name]), name
        assert rule.configure(AdcConfig()) == rule.configure(parse_config({}, env={})), name


def test_a_misspelt_strategy_is_refused_naming_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        parse_config({"strategies": {"oom_protecton": {"for_s": 3}}}, env={})
    [problem] = err.value.problems
    assert problem.startswith("strategies.oom_protecton: no rule is registered under this name")
    assert all(name in problem for name in BUILTIN)


def test_a_schedule_overriding_an_unknown_strategy_is_refused():
    with pytest.raises(ConfigError, match=r"schedules\.0\.strategies\.priority_sched: no rule"):
        parse_config(
            {
                "schedules": [
                    {
                        "name": "night",
                        "start": "22:00",
                        "end": "06:00",
                        "strategies": {"priority_sched": {"enabled": False}},
                    }
                ]
            },
            env={},
        )


def test_with_a_plugin_folder_other_sections_are_kept_for_the_decider_to_check():
    cfg = parse_config({"decider": {"rules_dir": "plugins"}, "strategies": {"my_rule": {"limit": 3}}}, env={})
    assert cfg.strategies.section("my_rule") == {"limit": 3}
    with pytest.raises(ConfigError, match=r"strategies: .*a rule's section is a mapping"):
        parse_config({"decider": {"rules_dir": "plugins"}, "strategies": {"my_rule": 3}}, env={})


def test_a_policy_gets_the_same_check_as_the_file():
    base = load_config(env={})
    applied = apply_policy(base, {"strategies": {"oom_protection": {"for_s": 7}}})
    assert applied.strategies.oom_protection.for_s == 7 and applied.bus == base.bus
    with pytest.raises(ConfigError) as err:
        apply_policy(
            base, {"strategies": {"oom_protecton": {}}, "bus": {"url": "nats://x"}, "controller": {"interval": 0}}
        )
    fields = {".".join(path) for path, _ in err.value.fields()}
    assert fields == {"bus"}  # not a policy section: the rest is not looked at
    with pytest.raises(ConfigError) as err:
        apply_policy(base, {"controller": {"interval": 0}, "strategies": {"drain": {"cooldown_s": -1}}})
    assert {".".join(path) for path, _ in err.value.fields()} == {"controller.interval", "strategies.drain.cooldown_s"}


# --- every key is read by something ----------------------------------------------------------

# A rule's own section is read by name (`Rule.configure`): the registry test above covers those.
SECTIONS_READ_BY_NAME = {f"strategies.{name}" for name in BUILTIN}


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, key) of every key in the config, sections and leaves."""
    keys = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        keys.append((path, name))
        for sub in _models(field.annotation):
            keys += _keys(sub, path + ".")
    return keys


def _readers() -> str:
    files = [p for pkg in ("services", "shared", "worker", "cli", "sim") for p in (REPO / pkg).rglob("*.py")]
    return "\n".join(p.read_text() for p in files)


def test_every_config_key_is_read_by_something():
    code = _readers()
    unread = sorted(
        {
            path
            for path, key in _keys(AdcConfig)
            if path not in SECTIONS_READ_BY_NAME and not re.search(rf"\.{key}\b|\[[\"']{key}[\"']\]", code)
        }
    )
    assert unread == [], f"config keys that no code reads: {unread}"


def test_the_unread_key_finder_finds_one():
    class Section(RuleControls):
        never_read_anywhere_xyz: int = 1

    assert ("never_read_anywhere_xyz", "never_read_anywhere_xyz") in _keys(Section)
    assert not re.search(r"\.never_read_anywhere_xyz\b", _readers())
