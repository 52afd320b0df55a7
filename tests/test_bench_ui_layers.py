"""The bench family and the web UI import one way: no cycles, counting imports inside functions (only
``if TYPE_CHECKING:`` imports are left out), and the workload vocabulary imports nothing above it.

Read from the source with ``ast`` (nothing is imported), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"localspec": ROOT / "localspec", "localspec.ui": ROOT / "ui"}
BENCH_FAMILY = {
    "localspec.bench",
    "localspec.benchmath",
    "localspec.peer",
    "localspec.report",
    "localspec.tune",
    "localspec.workloads",
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


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
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
    assert "localspec.workloads" in graph and "localspec.ui.common" in graph
    mine = sorted(m for m in graph if m in BENCH_FAMILY or m.startswith("localspec.ui"))
    cycles = {m: c for m in mine if (c := _cycles_through(graph, m))}
    assert cycles == {}, "import cycles: " + "; ".join(" -> ".join(c[0]) for c in cycles.values())


def test_the_workload_vocabulary_imports_nothing_of_the_bench_family():
    graph = _graph()
    assert graph["localspec.workloads"] & BENCH_FAMILY == set()
    for low in ("localspec.benchmath", "localspec.peer", "localspec.report"):
        assert "localspec.bench" not in graph[low] and "localspec.tune" not in graph[low], low
    assert "localspec.ui.app" not in graph["localspec.ui.bench_tab"]


def test_no_import_cycle_anywhere():
    """Arrows run one way across the whole package (docs/architecture.md draws the layers)."""
    graph = _graph()
    cycles = {m: c for m in sorted(graph) if (c := _cycles_through(graph, m))}
    assert cycles == {}, "import cycles: " + "; ".join(" -> ".join(c[0]) for c in cycles.values())


LOWER_LAYERS = {
    "localspec.errors",
    "localspec.constants",
    "localspec.units",
    "localspec.settings",
    "localspec.gguf_meta",
    "localspec.vocab",
    "localspec.pairing",
    "localspec.sampling",
    "localspec.drafters",
    "localspec.suffix",
    "localspec.store",
    "localspec.costs",
    "localspec.llama_build",
    "localspec.runtime",
    "localspec.chat_tokens",
    "localspec.engine",
}


def test_lower_layers_never_import_the_api_the_cli_the_server_or_the_ui():
    graph = _graph()
    upper = {m for m in graph if m.startswith(("localspec.cli", "localspec.ui"))}
    upper |= {"localspec.api", "localspec.server", "localspec.bench", "localspec.session_bench"}
    for low in LOWER_LAYERS:
        assert graph[low] & upper == set(), f"{low} imports {sorted(graph[low] & upper)}"
