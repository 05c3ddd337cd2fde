"""Rule plugins from folders, hot reloaded: import, validate, swap atomically.

Every `*.py` file in a rules folder (names starting with `_` excepted) is a plugin defining
`RULE = Rule(...)` or `RULES = [...]`. A scan notices new, changed and removed files by
content hash. A changed file is compiled and executed as a fresh module, its rules are
checked and handed to a validator (the engine binds their config and dry-runs them); only
if every step passes do they replace the file's previous rules. On any error the previous
version stays in force and the scan reports the file and the error, for the audit log.
The active set is an immutable mapping replaced in one assignment: a pass never sees half
a reload.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import sys
import traceback
import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from services.decider.plugin import Rule, check_rule

log = logging.getLogger(__name__)
_module_ids = itertools.count(1)

Validator = Callable[[Rule], Awaitable[list[str]]]


@dataclass(frozen=True)
class ReloadEvent:
    kind: str  # rule.loaded | rule.unloaded | rule.reload_failed
    file: str
    rules: tuple[str, ...] = ()
    error: str | None = None

    def describe(self) -> str:
        names = ", ".join(self.rules) or "no rules"
        if self.kind == "rule.reload_failed":
            return f"{self.file}: not loaded, the previous version stays in force: {self.error}"
        return f"{self.file}: {'loaded' if self.kind == 'rule.loaded' else 'removed'} {names}"


class PluginError(Exception):
    pass


@dataclass(frozen=True)
class _Loaded:
    digest: str
    rules: tuple[Rule, ...]
    module: str


def _short_traceback(err: BaseException, path: Path) -> str:
    if isinstance(err, SyntaxError):
        return f"SyntaxError: {err.msg} (line {err.lineno})"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(path)]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def load_plugin(path: Path, source: str) -> tuple[tuple[Rule, ...], str]:
    """Execute a plugin file as a fresh module; return its rules and the module name."""
    name = f"adc_rule_plugins.{path.stem}_{next(_module_ids)}"
    try:
        code = compile(source, str(path), "exec")
        module = types.ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module  # pydantic and dataclasses resolve annotations through it
        exec(code, module.__dict__)
    except BaseException as err:  # noqa: BLE001 - anything a plugin raises is reported, never fatal
        sys.modules.pop(name, None)
        raise PluginError(_short_traceback(err, path)) from None
    found = getattr(module, "RULES", None)
    if found is None:
        found = [module.RULE] if hasattr(module, "RULE") else []
    if not isinstance(found, (list, tuple)) or not found:
        sys.modules.pop(name, None)
        raise PluginError("defines no rules: set RULE = Rule(...) or RULES = [...]")
    problems = [p for rule in found for p in check_rule(rule)]
    if problems:
        sys.modules.pop(name, None)
        raise PluginError("; ".join(problems))
    return tuple(replace(rule, source=str(path)) for rule in found), name


class RuleRegistry:
    """The active rules by name, and the files they came from."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = [Path(f) for f in folders]
        self._files: dict[Path, _Loaded] = {}
        self._failed: dict[Path, str] = {}  # digest of a version already reported as failing
        self.rules: Mapping[str, Rule] = MappingProxyType({})

    def set_folders(self, folders: list[Path]) -> None:
        self.folders = [Path(f) for f in folders]

    def _plugin_files(self) -> dict[Path, str]:
        files = {}
        for folder in self.folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.py")):
                if path.name.startswith("_"):
                    continue
                try:
                    files[path.resolve()] = path.read_text()
                except OSError:
                    continue  # being written; the next scan sees it
        return files

    async def scan(self, validate: Validator) -> list[ReloadEvent]:
        """Load what changed; report what happened. Unchanged files cost a read and a hash."""
        events: list[ReloadEvent] = []
        files = self._plugin_files()
        current = dict(self._files)
        for path in [p for p in current if p not in files]:
            gone = current.pop(path)
            sys.modules.pop(gone.module, None)
            events.append(ReloadEvent("rule.unloaded", str(path), tuple(r.name for r in gone.rules)))
        for path, source in files.items():
            digest = hashlib.sha256(source.encode()).hexdigest()
            if (path in current and current[path].digest == digest) or self._failed.get(path) == digest:
                continue
            try:
                rules, module = load_plugin(path, source)
                taken = {r.name: p for p, loaded in current.items() if p != path for r in loaded.rules}
                problems = [
                    f"rule name {r.name!r} is already registered by {taken[r.name]}" for r in rules if r.name in taken
                ]
                if len({r.name for r in rules}) != len(rules):
                    problems.append("the file registers one name twice")
                for rule in rules if not problems else ():
                    problems += await validate(rule)
                if problems:
                    sys.modules.pop(module, None)
                    raise PluginError("; ".join(problems))
            except PluginError as err:
                self._failed[path] = digest
                events.append(ReloadEvent("rule.reload_failed", str(path), error=str(err)))
                log.warning("rule plugin %s not loaded: %s", path, err)
                continue
            self._failed.pop(path, None)
            if path in current:
                sys.modules.pop(current[path].module, None)
            current[path] = _Loaded(digest, rules, module)
            events.append(ReloadEvent("rule.loaded", str(path), tuple(r.name for r in rules)))
        if events:
            self._files = current
            self.rules = MappingProxyType({r.name: r for loaded in current.values() for r in loaded.rules})
        return events
