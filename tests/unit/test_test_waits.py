"""Tests wait on conditions, not on the wall clock: this fails if a checked test file sleeps a fixed
time (`time.sleep(<number>)`, `asyncio.sleep(<number>)`) or reads a clock for a deadline or an
elapsed time (`time.monotonic()`, `time.perf_counter()`, `time.time()` in a sum or a comparison)
instead of waiting through `tests/waits.py` or advancing a `ManualClock`. A sleep that is itself
the behaviour under test stays, on a line that says `# not a wait: <why>`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.waits import until, until_async

REPO = Path(__file__).resolve().parents[2]
CHECKED = (
    "tests/e2e/test_restarts.py",
    "tests/e2e/test_protocols.py",
    "tests/unit/decider/test_rule_threads.py",
    "tests/integration/api/test_audit_tail.py",
    "tests/integration/api/test_cli_live.py",
    "tests/integration/api/test_jobs_api.py",
    "tests/integration/test_db_and_audit.py",
    "tests/integration/api/test_cli.py",
    "tests/integration/executor/test_outage_reconcile.py",
    "tests/integration/api/test_cluster_view.py",
    "tests/unit/decider/test_engine_turns.py",
    "tests/integration/test_bad_input_fuzz.py",
    "tests/integration/test_redelivery.py",
    "tests/integration/decider/test_engine_core.py",
    "tests/integration/trainer/test_warm_start.py",
)
SLEEPS = {"time.sleep", "asyncio.sleep"}
CLOCKS = {"time.monotonic", "time.monotonic_ns", "time.perf_counter", "time.perf_counter_ns"}
WALL_TIME = {"time.time", "time.time_ns"}  # a timestamp is fine; a duration or a deadline is not
KEPT = "# not a wait:"


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it stands for (`from time import sleep`, `import time as t`)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name: a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return names


def _called(func: ast.expr, names: dict[str, str]) -> str | None:
    """The dotted name a call's function is, with an imported name resolved; None for anything else."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    return ".".join([names.get(func.id, func.id), *reversed(parts)])


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def _is_zero(node: ast.expr) -> bool:
    """`asyncio.sleep(0)` is a turn of the event loop, not a wait."""
    return isinstance(node, ast.Constant) and node.value == 0


def wall_waits(source: str) -> list[str]:
    """Each fixed sleep and each clock read for a duration in `source`, as 'line N: name(...)'."""
    tree = ast.parse(source)
    names, lines = _imported_names(tree), source.splitlines()
    in_arithmetic = {
        id(operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp | ast.Compare)
        for operand in ([node.left, node.right] if isinstance(node, ast.BinOp) else [node.left, *node.comparators])
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or KEPT in lines[node.lineno - 1]:
            continue
        name = _called(node.func, names)
        fixed_sleep = name in SLEEPS and node.args and _is_number(node.args[0]) and not _is_zero(node.args[0])
        if fixed_sleep or name in CLOCKS or (name in WALL_TIME and id(node) in in_arithmetic):
            found.append((node.lineno, f"line {node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


@pytest.mark.parametrize("path", CHECKED)
def test_the_checked_tests_wait_on_conditions(path):
    found = wall_waits((REPO / path).read_text())
    assert found == [], (
        f"{path} waits on the wall clock: wait for what the sleep stands for with tests.waits.until, "
        f"advance a ManualClock, or say on the line why it is not a wait ({KEPT} ...): {found}"
    )


@pytest.mark.parametrize(
    "line",
    [
        "time.sleep(2)",
        "time.sleep(0.5 * 2)",
        "asyncio.run(asyncio.sleep(1.0))",
        "sleep(3)",
        "nap(3)",
        "deadline = time.monotonic() + 20",
        "started = perf_counter()",
        "assert time.time() - started < 2",
        "elapsed = t.time() - started",
    ],
)
def test_the_check_finds_each_kind_of_wall_wait(line):
    imports = "import asyncio\nimport time\nimport time as t\nfrom time import perf_counter, sleep\n"
    [found] = wall_waits(f"{imports}from asyncio import sleep as nap\n{line}\n")
    assert found.startswith("line 6: ")


def test_the_check_lets_waits_timestamps_and_kept_sleeps_be():
    source = (
        "import asyncio\nimport time\nfrom tests.waits import until\n"
        "until(lambda: True, 'a row')\n"
        "async def turn():\n    await asyncio.sleep(0)\n"  # a turn of the loop, not a wait
        "time.sleep(poll)\n"  # a poll interval, as in tests/waits.py
        "event = Decision(ts=time.time())\n"
        "clock.sleep(30)\n"  # a ManualClock's sleep advances it
        f"time.sleep(2)  {KEPT} nothing may happen in these two seconds, on the host's clock\n"
    )
    assert wall_waits(source) == []


def test_the_check_fails_on_a_sleep_between_kills_put_back():
    source = (REPO / "tests/e2e/test_restarts.py").read_text()
    kill = '    live.stack.kill("executor")  # again, mid-training this time\n'
    assert kill in source and wall_waits(source) == []
    lines = source.splitlines(keepends=True)
    at = lines.index(kill) + 1
    broken = "".join([*lines[:at], "    time.sleep(2)\n", *lines[at:]])
    assert wall_waits(broken) == [f"line {at + 1}: time.sleep(2)"]


def test_until_returns_the_first_truthy_value_and_names_what_never_happened():
    looks = iter([None, 0, {"id": "j1"}])
    assert until(lambda: next(looks), "a job row", poll=0) == {"id": "j1"}
    with pytest.raises(AssertionError, match=r"never: the row of j2 \(last seen: none\)"):
        until(lambda: None, lambda: "the row of j2 (last seen: none)", timeout=0.05, poll=0.01)


async def test_until_async_awaits_a_coroutine_predicate_and_names_what_never_happened():
    looks = iter([False, True])

    async def look() -> bool:
        return next(looks)

    assert await until_async(look, "a second look", poll=0) is True
    with pytest.raises(AssertionError, match="never: an audit event"):
        await until_async(lambda: [], "an audit event", timeout=0.05, poll=0.01)
