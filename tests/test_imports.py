"""The package's import graph: no cycle (lazy imports inside functions and typing-only imports count too: each
hides a cycle rather than removing it), and no collector that reaches a command-line module."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

PACKAGE = ROOT / "exporters" / "accelmon"
# The command-line modules: they parse arguments and call the library; nothing below them may import them.
COMMAND_LINES = {
    "accelmon.cli",
    "accelmon.drills.drill",
    "accelmon.schedulers.slurm.health",
    "accelmon.schedulers.oar.health",
    "accelmon.schedulers.slurm.remediation_cli",
    "accelmon.report.cli",
}
# Front doors that may import a command line: `python -m` modules, and the report package, whose `main` is the
# accelmon-report console script.
FRONT_DOORS = {"accelmon.__main__", "accelmon.report", "accelmon.report.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports anywhere in its text."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                # `from accelmon import health` imports the module accelmon.health; `from accelmon.x import y`, x.
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    imported.add(submodule if submodule in modules else base)
        graph[name] = {target for target in imported if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_cycle_finder_finds_a_cycle_and_a_lazy_import() -> None:
    # The checker itself: a cycle of three, beside a module that is in none.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions(tmp_path: Path) -> None:
    graph = import_graph()
    # accelmon.collectors.collectors() imports each collector by name (importlib), not by an import statement.
    assert (
        "accelmon.exporter.registry" in graph and "accelmon.collectors.nvml" not in graph["accelmon.exporter.registry"]
    )
    # An edge the package certainly has, written `from accelmon import x`.
    assert "accelmon.health" in graph["accelmon.collectors.health"]


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_library_module_reaches_a_command_line() -> None:
    graph = import_graph()
    for name in graph:
        if name in COMMAND_LINES | FRONT_DOORS:
            continue
        assert not reachable(graph, name) & COMMAND_LINES, f"{name} reaches {reachable(graph, name) & COMMAND_LINES}"


def test_the_metric_model_runs_nothing_and_each_job_source_stands_alone() -> None:
    """The layering the splits made: the metric model (specs, samples, exposition) reaches neither the runtime
    that samples collectors on threads nor any collector; each scheduler's job source reads its own files, never
    another's (what they share is the record's keys)."""
    graph = import_graph()
    assert reachable(graph, "accelmon.exporter.metrics") <= {"accelmon"}
    sources = {"accelmon.job_sources.slurm", "accelmon.job_sources.oar", "accelmon.job_sources.cgroups"}
    for source in sources:
        assert not reachable(graph, source) & (sources | {"accelmon.job_sources"}), source
    assert not any(target.startswith("accelmon.collectors") for target in reachable(graph, "accelmon.exporter.runtime"))
