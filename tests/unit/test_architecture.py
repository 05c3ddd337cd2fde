"""The shape of the code: no import cycles, services apart, one writer of job state."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "worker", "shared", "cli")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> first-party modules it imports at run time (TYPE_CHECKING blocks are imports too)."""
    files = {_module(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found |= {t for t in targets if t in files}
        graph[name] = found - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    graph = _imports()
    assert "services.executor.executor" in graph and graph["services.executor.executor"]
    assert _cycle({m: d for m, d in graph.items() if not m.startswith("cli")}) is None


def test_no_service_imports_another_service():
    crossings = []
    for module, deps in _imports().items():
        if module.startswith("services.") and module.count(".") >= 1:
            own = module.split(".")[1]
            crossings += [(module, d) for d in deps if d.startswith("services.") and d.split(".")[1] != own]
    assert crossings == []


def test_job_state_is_written_by_the_store_only():
    """No `UPDATE jobs` / history insert in the code outside the executor's store (tests set up state)."""
    store = REPO / "services" / "executor" / "store.py"
    writes = re.compile(r"UPDATE\s+jobs\b|INSERT\s+INTO\s+job_status_history", re.I)
    offenders = [
        str(p.relative_to(REPO))
        for pkg in (*PACKAGES, "bench")
        for p in (REPO / pkg).rglob("*.py")
        if p != store and writes.search(p.read_text())
    ]
    assert offenders == []
    assert writes.search(store.read_text())


def test_the_executor_reads_no_trainer_folders():
    for path in (REPO / "services" / "executor").rglob("*.py"):
        assert "worker.trainer" not in path.read_text(), path


DECIDER = REPO / "services" / "decider"
MAX_MODULE_LINES = 300
MAX_CLASS_LINES = 200


def _oversized(root: Path, base: Path = REPO) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES lines under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(base))
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                found.append(f"{name}: class {node.name}, {size} lines")
    return found


def test_the_size_check_finds_a_long_module_and_a_long_class(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "short.py").write_text("class Small:\n    pass\n")
    (root / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (root / "wide.py").write_text("class Wide:\n" + "    a = 1\n" * MAX_CLASS_LINES)
    assert _oversized(root, tmp_path) == [
        f"pkg/long.py: {MAX_MODULE_LINES + 1} lines",
        f"pkg/wide.py: class Wide, {MAX_CLASS_LINES + 1} lines",
    ]


def test_the_decider_comes_in_parts_a_reader_can_hold():
    """No module of the decider over MAX_MODULE_LINES lines, no class over MAX_CLASS_LINES: each part
    does one job (ingest, the pass scheduler, publishing, reload, leadership, placement, ...)."""
    oversized = _oversized(DECIDER)
    assert oversized == [], "\n".join(oversized)
