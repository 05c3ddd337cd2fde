"""The shape of the code: no import cycles, services apart, one writer of job state, one read model of
the jobs, and tools that use only what the services make public."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "worker", "shared", "cli", "sim", "bench")


def _module(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _edges(root: Path = REPO) -> list[tuple[str, str, str | None]]:
    """(importer, first-party module imported, the name taken from it or None) for every import at run
    time (TYPE_CHECKING blocks are imports too)."""
    files = {_module(p, root): p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py")}
    edges = []
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges += [(name, a.name, None) for a in node.names if a.name in files]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in files:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    edges.append((name, sub, None) if sub in files else (name, node.module, a.name))
    return [e for e in edges if e[0] != e[1]]


def _imports(root: Path = REPO) -> dict[str, set[str]]:
    """module -> first-party modules it imports."""
    graph: dict[str, set[str]] = {}
    for importer, target, _ in _edges(root):
        graph.setdefault(importer, set()).add(target)
    return graph


def _service(module: str) -> str | None:
    """The service a module belongs to: `services.<name>`'s name, or `worker`; None for the rest."""
    parts = module.split(".")
    if parts[0] == "services" and len(parts) > 1:
        return parts[1]
    return "worker" if parts[0] == "worker" else None


def service_crossings(edges) -> list[str]:
    """A service importing another's code (the collector reaching into the worker, say): what two
    services share is a contract, and contracts live in shared/."""
    return [
        f"{importer} imports {target} (another service)"
        for importer, target, _ in edges
        if _service(importer) and _service(target) and _service(importer) != _service(target)
    ]


def cli_into_the_api(edges) -> list[str]:
    """The CLI talks to the api over REST; what both need (token creation, say) lives in shared/."""
    return [
        f"{importer} imports {target} (the api's code)"
        for importer, target, _ in edges
        if importer.startswith("cli") and (target == "services.api" or target.startswith("services.api."))
    ]


def private_names_across_packages(edges) -> list[str]:
    """sim/, bench/, cli/ and the services import only public names of another package's modules
    (the simulator takes the decider's public API, never a function behind an underscore)."""
    found = []
    for importer, target, name in edges:
        if not name or not name.startswith("_") or name.startswith("__"):
            continue
        apart = importer.split(".")[0] != target.split(".")[0] or _service(importer) != _service(target)
        if apart:
            found.append(f"{importer} imports {name} from {target} (private)")
    return found


def shared_layers(edges) -> list[str]:
    """shared/ comes in layers: contracts import only contracts (a message or an action is a shape,
    not a connection); nothing in shared/ imports a service, the worker or a tool."""
    found = []
    for importer, target, _ in edges:
        if not importer.startswith("shared."):
            continue
        if importer.startswith("shared.contracts") and not target.startswith("shared.contracts"):
            found.append(f"{importer} imports {target} (a contract depends on more than contracts)")
        elif not target.startswith("shared"):
            found.append(f"{importer} imports {target} (shared code depends on a service or tool)")
    return found


BOUNDARIES = (service_crossings, cli_into_the_api, private_names_across_packages, shared_layers)


def boundary_violations(root: Path = REPO) -> list[str]:
    edges = _edges(root)
    return [v for check in BOUNDARIES for v in check(edges)]


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
    assert service_crossings(_edges()) == []


def test_the_cli_talks_to_the_api_over_rest_only():
    assert cli_into_the_api(_edges()) == []


def test_sim_bench_and_cli_use_only_public_names_of_other_packages():
    assert private_names_across_packages(_edges()) == []


def test_the_checks_see_sim_bench_and_cli():
    graph = _imports()
    assert "services.decider.core" in graph["sim.simulator"]
    assert any(m.startswith("bench.") for m in graph) and any(m.startswith("cli.") for m in graph)


# Each boundary with the import that would break it: the checker must name exactly that one.
VIOLATIONS = [
    ("services/collector/main.py", "from worker.inventory import parse_size\n", "another service"),
    ("services/api/views.py", "from services.decider.core import EngineCore\n", "another service"),
    ("worker/agent.py", "import services.executor.store\n", "another service"),
    ("cli/stack.py", "from services.api.auth import create_token\n", "the api's code"),
    ("sim/simulator.py", "from services.decider.rule_runner import _describe\n", "private"),
    ("bench/scale.py", "from shared.infra.bus import _connect\n", "private"),
    ("shared/contracts/actions.py", "from shared.infra.bus import Bus\n", "more than contracts"),
    ("shared/infra/db.py", "from services.executor.store import Job\n", "service or tool"),
]
TARGETS = {
    "worker/inventory.py": "def parse_size(text): ...\n",
    "services/decider/core.py": "class EngineCore: ...\n",
    "services/api/auth.py": "def create_token(): ...\n",
    "services/decider/rule_runner.py": "def _describe(err): ...\n",
    "shared/infra/bus.py": "def _connect(): ...\nclass Bus: ...\n",
    "services/executor/store.py": "class Job: ...\n",
    "shared/contracts/reason_codes.py": "class ReasonCode: ...\n",
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("path", "source", "kind"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_each_boundary_check_fails_on_its_violation_put_back(tmp_path, path, source, kind):
    allowed = (
        "import shared.contracts.reason_codes\n" if path.startswith("shared/contracts") else "import shared.infra.bus\n"
    )
    clean = _tree(tmp_path / "clean", TARGETS | {path: allowed})
    assert boundary_violations(clean) == []
    broken = _tree(tmp_path / "broken", TARGETS | {path: source})
    [violation] = boundary_violations(broken)
    assert violation.startswith(_module(broken / path, broken)) and kind in violation


def test_job_state_is_written_by_the_store_only():
    """No `UPDATE jobs` / history insert in the code outside the executor's store (tests set up state)."""
    store = REPO / "services" / "executor" / "store.py"
    writes = re.compile(r"UPDATE\s+jobs\b|INSERT\s+INTO\s+job_status_history", re.I)
    offenders = [
        str(p.relative_to(REPO))
        for pkg in PACKAGES
        for p in (REPO / pkg).rglob("*.py")
        if p != store and writes.search(p.read_text())
    ]
    assert offenders == []
    assert writes.search(store.read_text())


STORE = Path("services/executor/store.py")
READ_MODEL = Path("shared/infra/job_reads")
JOB_READ = re.compile(r"\b(FROM|JOIN)\s+(\w+\.)?\"?jobs\"?(?![\w.\"])", re.I)


def _string_literals(source: str):
    """Each string literal of a module as Python joins it (SQL spread over adjacent literals is one
    string), an f-string's fields as {}."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            yield "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _reads_jobs(path: Path) -> bool:
    return any(JOB_READ.search(text) for text in _string_literals(path.read_text()))


def raw_job_reads(root: Path = REPO) -> list[str]:
    """Modules with `FROM jobs` / `JOIN jobs` SQL outside the read model and the executor's store."""
    return [
        str(path.relative_to(root))
        for pkg in PACKAGES
        for path in sorted((root / pkg).rglob("*.py"))
        if path.relative_to(root) != STORE
        and not path.relative_to(root).is_relative_to(READ_MODEL)
        and _reads_jobs(path)
    ]


def test_jobs_are_read_through_the_read_model_only():
    """The api, the decider, the audit sink and the tools read `jobs` through shared/infra/job_reads;
    the executor's store, its one writer, keeps its own reads."""
    assert raw_job_reads() == []
    assert any(_reads_jobs(p) for p in (REPO / READ_MODEL).rglob("*.py")) and _reads_jobs(REPO / STORE)


READ_VIOLATIONS = {
    "split": 'SQL = (\n    "SELECT id FROM"\n    " jobs WHERE team = $1"\n)\n',
    "joined": 'SQL = "SELECT h.n FROM job_status_history h JOIN jobs j ON j.id = h.job_id"\n',
    "f-string": 'SQL = f"SELECT {COLUMNS} FROM public.jobs WHERE id = $1"\n',
}


@pytest.mark.parametrize("source", READ_VIOLATIONS.values(), ids=READ_VIOLATIONS.keys())
def test_the_read_check_fails_on_a_raw_read_put_back(tmp_path, source):
    allowed = {
        "shared/infra/job_reads/one_job.py": 'SQL = "SELECT * FROM jobs WHERE id = $1"\n',
        str(STORE): 'SQL = "SELECT * FROM jobs WHERE id = $1"\n',
        "services/api/jobs.py": 'SQL = "SELECT * FROM jobs_archive; INSERT INTO jobs (id) VALUES ($1)"\n',
        "bench/failover.py": 'SQL = "SELECT count(*) FROM job_status_history"\n',
    }
    assert raw_job_reads(_tree(tmp_path / "clean", allowed)) == []
    assert raw_job_reads(_tree(tmp_path / "broken", allowed | {"services/api/quotas.py": source})) == [
        "services/api/quotas.py"
    ]


# SQL that leaves state on a session: pooled connections go back without a reset query
# (shared/infra/db.PooledConnection), so only a connection of its own may hold any.
SESSION_STATE = re.compile(
    r"(^|;)\s*(SET|RESET|LISTEN|DECLARE|PREPARE)\s+\w|pg_advisory_lock(_shared)?\s*\(|set_config\s*\("
)  # SQL keywords in capitals, as the code writes them
OWN_CONNECTION = {
    Path("shared/infra/db.py"),  # the migrator's advisory lock, on asyncpg.connect's connection
    Path("services/api/audit_feed.py"),  # LISTEN, on a connection of its own
}


def _docstrings(source: str) -> set[str]:
    return {
        doc
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and (doc := ast.get_docstring(node, clean=False)) is not None
    }


def _holds_session_state(path: Path) -> bool:
    """Whether its SQL (its string literals but docstrings, which may quote SQL) or code would."""
    text = path.read_text()
    prose = _docstrings(text)
    return "add_listener(" in text or any(SESSION_STATE.search(t) for t in _string_literals(text) if t not in prose)


def session_state(root: Path = REPO) -> list[str]:
    """Modules whose SQL (or asyncpg's add_listener) would leave state on a pooled connection."""
    return [
        str(path.relative_to(root))
        for pkg in PACKAGES
        for path in sorted((root / pkg).rglob("*.py"))
        if path.relative_to(root) not in OWN_CONNECTION and _holds_session_state(path)
    ]


def test_no_pooled_connection_is_left_with_session_state():
    assert session_state() == []
    assert all(_holds_session_state(REPO / p) for p in OWN_CONNECTION)


@pytest.mark.parametrize(
    "source",
    [
        'SQL = "SET statement_timeout = 0"\n',
        'SQL = "SELECT pg_advisory_lock($1)"\n',
        'SQL = "BEGIN; LISTEN x"\n',
        "async def f(conn):\n    await conn.add_listener('x', print)\n",
        "SQL = \"SELECT set_config('a.b', $1, false)\"\n",
        '"""Prose that quotes asyncpg\'s RESET ALL."""\nSQL = "RESET ALL; SET search_path TO x"\n',
    ],
)
def test_the_session_state_check_fails_on_it_put_back(tmp_path, source):
    allowed = {
        "services/executor/store.py": 'SQL = "UPDATE jobs SET status = $2 WHERE id = $1"\n',
        "services/api/quotas.py": 'SQL = "SELECT pg_advisory_xact_lock(hashtext($1))"\n',
        "bench/pool_reset.py": '"""asyncpg sends `CLOSE ALL; UNLISTEN *; RESET ALL` (prose)."""\n',
    }
    assert session_state(_tree(tmp_path / "clean", allowed)) == []
    assert session_state(_tree(tmp_path / "broken", allowed | {"services/decider/pass_loop.py": source})) == [
        "services/decider/pass_loop.py"
    ]


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
