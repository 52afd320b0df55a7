"""The package's rooms stand on floors and every import runs down them: no cycles at any level, counting
imports inside functions and ``if TYPE_CHECKING:`` ones (a type-level cycle is a cycle), and the workload
vocabulary imports nothing above it.

Read from the source with ``ast`` (nothing is imported), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"localspec": ROOT / "localspec", "localspec.ui": ROOT / "ui"}
BENCH_FAMILY = {
    "localspec.bench.single",
    "localspec.bench.arithmetic",
    "localspec.bench.peer",
    "localspec.bench.report",
    "localspec.bench.tune",
    "localspec.bench.tuning",
    "localspec.bench.workloads",
    "localspec.cli.bench",
    "localspec.cli.ui",
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if pkg == "localspec" and parts[:1] == ["ui"]:
                continue
            out[name] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:  # every import: module level, in functions, under TYPE_CHECKING
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = module if is_pkg else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        parent = parent.rpartition(".")[0]
                    base = f"{parent}.{base}" if base else parent
                for alias in child.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
            visit(child)

    visit(tree)
    resolved = {resolve(n) for n in found}
    # the package's own __init__ is lazy (``localspec.__getattr__``): importing it pulls nothing in
    return {r for r in resolved if r and r != "localspec" and r != module}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items()}


def _cycles_through(graph: dict[str, set[str]], start: str) -> list[list[str]]:
    """Every simple path start -> ... -> start (enough to name one cycle per first step)."""
    out: list[list[str]] = []
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                out.append([*path, start])
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return out


def test_no_import_cycle_through_the_bench_family_or_the_ui():
    graph = _graph()
    assert "localspec.bench.workloads" in graph and "localspec.ui.common" in graph
    mine = sorted(m for m in graph if m in BENCH_FAMILY or m.startswith("localspec.ui"))
    cycles = {m: c for m in mine if (c := _cycles_through(graph, m))}
    assert cycles == {}, "import cycles: " + "; ".join(" -> ".join(c[0]) for c in cycles.values())


def test_the_workload_vocabulary_imports_nothing_of_the_bench_family():
    graph = _graph()
    assert graph["localspec.bench.workloads"] & BENCH_FAMILY == set()
    for low in (
        "localspec.bench.arithmetic",
        "localspec.bench.peer",
        "localspec.bench.report",
        "localspec.bench.tuning",
    ):
        assert "localspec.bench.single" not in graph[low] and "localspec.bench.tune" not in graph[low], low
    assert "localspec.ui.app" not in graph["localspec.ui.bench_tab"]


def test_no_import_cycle_anywhere():
    """Arrows run one way across the whole package (docs/architecture.md draws the layers)."""
    graph = _graph()
    cycles = {m: c for m in sorted(graph) if (c := _cycles_through(graph, m))}
    assert cycles == {}, "import cycles: " + "; ".join(" -> ".join(c[0]) for c in cycles.values())


# The floors of the house, bottom first: a room (a top-level module or folder of localspec, or one of the
# SUB_ROOMS) imports only from its own room and from rooms on lower floors. docs/architecture.md draws the
# same floors.
FLOORS: list[set[str]] = [
    {"errors", "constants", "units", "embedded"},  # the project's vocabulary
    {"settings", "gguf"},  # how drafting runs; files, fingerprints, pairs
    {"hub", "llama.logs", "llama.sampling"},  # presets, downloads; llama.cpp's log, the target's distribution
    {"llama", "constrain"},  # the llama.cpp boundary; beside it, the grammars every emitted token keeps
    {"decoding"},  # the verify loop, drafters, costs
    {"suffix"},  # the suffix cache and its store
    {"pipeline"},  # load / generate / Pipeline
    {"bench", "serve"},  # measuring; the OpenAI-compatible server
    {"ui"},  # the Gradio page
    {"cli"},  # the localspec command
    {"__main__"},
]


#: Modules of ``llama/`` that stand a floor below the rest of it: what grammars and the model both use (what
#: llama.cpp says, the target's distribution), so that ``constrain/`` stands beside the model, not above it.
SUB_ROOMS = {"llama.logs", "llama.sampling"}


def _room(module: str) -> str:
    if module.startswith("localspec.ui"):
        return "ui"
    parts = module.split(".")[1:]
    return sub if (sub := ".".join(parts[:2])) in SUB_ROOMS else parts[0]


def _floor(room: str) -> int:
    for i, rooms in enumerate(FLOORS):
        if room in rooms:
            return i
    raise AssertionError(f"localspec/{room} is on no floor: give it one in FLOORS (and docs/architecture.md)")


def test_every_import_runs_down_the_floors():
    graph = _graph()
    wrong = []
    for module, imported in sorted(graph.items()):
        if module == "localspec" or module.startswith("localspec.data"):
            continue  # the package's lazy facade re-exports the API; data/ holds a workload's sample files
        here = _room(module)
        for other in sorted(imported):
            there = _room(other)
            if there != here and _floor(there) >= _floor(here):
                wrong.append(f"{module} -> {other}")
    assert wrong == [], "imports that do not run down: " + "; ".join(wrong)


def test_there_are_about_a_dozen_rooms():
    rooms = {_room(m) for m in _graph() if not m.startswith("localspec.data") and m != "localspec"}
    assert rooms <= set().union(*FLOORS), sorted(rooms - set().union(*FLOORS))
    assert len(rooms) <= 20


def test_one_model_of_speed_below_its_users():
    """Every speedup is computed by localspec.decoding.speed (issue 47): it imports nothing of localspec, and
    auto's routing, the adaptive controller, the measured costs, the suffix cache's draft sizing and the
    bench's ceilings call it."""
    graph = _graph()
    assert graph["localspec.decoding.speed"] == set()
    users = [
        "localspec.decoding.routing",
        "localspec.decoding.adaptive",
        "localspec.decoding.costs",
        "localspec.suffix.confidence",
        "localspec.bench.arithmetic",
    ]
    assert [u for u in users if "localspec.decoding.speed" not in graph[u]] == []


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` reads from (relative ones resolved against ``module``)."""
    base = node.module or ""
    if node.level:
        parent = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            parent = parent.rpartition(".")[0]
        base = f"{parent}.{base}" if base else parent
    return base


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def test_no_private_name_is_imported_from_another_module():
    """A name one module shares with another is its interface: public. Counts every import (module level,
    inside functions, under ``if TYPE_CHECKING:``)."""
    wrong = []
    for module, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = _base(module, path, node)
                if base.split(".")[0] != "localspec" or base == module:
                    continue
                names = [f"{base}.{a.name}" for a in node.names if _private(a.name) or _private(base)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("localspec.") and _private(a.name)]
            else:
                continue
            wrong += [f"{module}:{node.lineno} imports {name}" for name in names]
    assert wrong == [], "private names imported across modules: " + "; ".join(wrong)


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_80_lines():
    """Orchestration reads as named steps: no function or method of localspec/ or ui/ over 80 lines
    (``def`` to its last line, docstring included), nested ones counted on their own too."""
    long = []
    for path in sorted(_modules().values()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)


def test_grammars_stand_beside_the_model():
    """``constrain/`` takes llama.cpp's log and the target's distribution from the floor below, nothing of the
    model (loading a grammar needs no model runtime), and the model nothing of grammars."""
    graph = _graph()
    across = sorted(
        f"{module} -> {other}"
        for module, imported in graph.items()
        if module != "localspec"
        for other in imported
        if {_room(module), _room(other)} == {"constrain", "llama"}
    )
    assert across == []
    assert "localspec.llama.logs" in graph["localspec.constrain.grammar"]


def test_production_takes_llama_cpp_programs_from_llama_not_from_the_bench():
    """``localspec rpc-server`` and the local RPC servers build and supervise llama.cpp's programs through
    ``llama/`` (programs, processes); only the bench's own llama-server client lives in ``bench/peer``."""
    graph = _graph()
    for module in ("localspec.cli.rpc", "localspec.bench.rpc_local", "localspec.bench.wide_target"):
        assert "localspec.bench.peer" not in graph[module], module
    assert {"localspec.llama.programs", "localspec.llama.processes"} <= graph["localspec.cli.rpc"]


def test_the_tests_write_gguf_files_in_one_module():
    """Every GGUF file a test writes goes through ``tests/_gguf_build.py`` (its writer, its copy of another
    file's header): no second hand-written writer to keep in step with the gguf package."""
    writers = sorted(
        path.name
        for path in (ROOT / "tests").glob("*.py")
        if "GGUFWriter(" in path.read_text(encoding="utf-8") and path.name != Path(__file__).name
    )
    assert writers == ["_gguf_build.py"]
