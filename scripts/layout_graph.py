"""The exporter package's folders and what each imports, read from the code (docs/architecture.md holds its output).

    python scripts/layout_graph.py            prints the folder graph, lowest folder first
    python scripts/layout_graph.py --check    also fails (status 1) on an import against the allowed directions,
                                              allowed directions that could make a cycle, one scheduler's folder
                                              importing another's, a private name used across folders, or health
                                              reaching Slurm's code through any chain of imports
    --package DIR                             another copy of exporters/accelmon (the tests' checker test)

Every import counts, those inside functions and under TYPE_CHECKING included: a lazy import hides a cycle, it
does not remove it. The package's own modules (cli, config, scan, catalogue) are the folder `accelmon`;
`accelmon/__init__.py` holds the version only and belongs to no folder.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exporters" / "accelmon"
ROOT = "accelmon"  # the modules directly in the package: the exporter's command line, its config, the scan

# Lowest first; each folder may import those named, all of them listed before it (so no two folders can import
# each other, directly or round a longer loop: `unordered` checks it). docs/architecture.md says why.
ALLOWED: dict[str, set[str]] = {
    "exporter": set(),
    "host": {"exporter"},
    "job_sources": {"exporter"},
    "cloudwatch": {"exporter"},
    "report": set(),
    "health": {"exporter", "host"},
    "collectors": {"exporter", "host", "job_sources", "health"},
    ROOT: {"exporter", "host", "job_sources", "cloudwatch", "health", "collectors"},
    "drills": {"exporter", "host", "job_sources", "health", "collectors", ROOT},
    "schedulers": {"exporter", "host", "job_sources", "health", "collectors", ROOT},
}
# Module-level rules the folder graph cannot say: the repair policy and the health verdicts know no scheduler
# (the Slurm integration adapts Slurm's nodes to them), not even through a host library that would.
FORBIDDEN_PREFIXES = {"accelmon.health": ("accelmon.host.slurm_", "accelmon.schedulers")}
# Folders whose subfolders stand side by side: Slurm's integration and OAR's import nothing of each other.
SIDE_BY_SIDE = ("schedulers",)


def module_name(package: Path, path: Path) -> str:
    """The module's name as the package imports it, whatever the folder of a copy is called."""
    parts = (ROOT, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(module: str, package: Path) -> str | None:
    """The folder a module belongs to; None for the package's __init__ (the version only)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return parts[1] if (package / parts[1]).is_dir() else ROOT


def modules_of(package: Path) -> dict[str, Path]:
    return {module_name(package, path): path for path in sorted(package.rglob("*.py"))}


def imports(package: Path) -> list[tuple[str, str, str]]:
    """(importing module, imported module, name) for every import of an accelmon module, and for every attribute
    read through an imported module (`nvidia._x`): the name imported or read, "" where a module is imported whole."""
    modules = modules_of(package)
    found = []
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> the accelmon module it is
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == ROOT:
                        found.append((name, alias.name, ""))
                        # `import accelmon.host.nvidia` binds accelmon; `... as nvidia` binds the module itself
                        bound[alias.asname or ROOT] = alias.name if alias.asname else ROOT
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*here.split(".")[: len(here.split(".")) - node.level + 1], base]).strip(".")
                if base.split(".")[0] != ROOT:
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"  # `from accelmon import health` imports a module
                    if submodule in modules:
                        found.append((name, submodule, ""))
                        bound[alias.asname or alias.name] = submodule
                    else:
                        found.append((name, base, alias.name))
        found += [(name, *read) for read in attributes_read(tree, bound, modules)]
    return found


def attributes_read(tree: ast.AST, bound: dict[str, str], modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, name) for each `alias.a.b.name` that reads a name of an accelmon module through an import."""
    read = []
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if not chain or not isinstance(node, ast.Name) or node.id not in bound:
            continue
        module = bound[node.id]
        for attribute in reversed(chain):
            if f"{module}.{attribute}" not in modules:
                read.append((module, attribute))
                break
            module = f"{module}.{attribute}"
    return read


def folder_graph(package: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {folder: set() for folder in ALLOWED}
    for source, target, name in imports(package):
        if target == ROOT and name == "__version__":
            continue
        a, b = folder_of(source, package), folder_of(target, package)
        if a is not None and b is not None and a != b:
            graph.setdefault(a, set()).add(b)
    return graph


def side_by_side(module: str, package: Path) -> str | None:
    """The subfolder of a SIDE_BY_SIDE folder a module is in (schedulers/slurm: "schedulers/slurm"), else None."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in SIDE_BY_SIDE and (package / parts[1] / parts[2]).is_dir():
        return f"{parts[1]}/{parts[2]}"
    return None


def unordered(allowed: dict[str, set[str]]) -> list[str]:
    """Allowed directions that could close a loop: a folder allowed to import one listed at or after it."""
    order = list(allowed)
    return [
        f"{folder} may import {target}, not listed before it in ALLOWED: folders could import each other"
        for position, folder in enumerate(order)
        for target in sorted(allowed[folder])
        if target not in order[:position]
    ]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), set()) - seen:
            seen.add(target)
            todo.append(target)
    return seen


def problems(package: Path) -> list[str]:
    found = unordered(ALLOWED)
    graph = folder_graph(package)
    for folder, targets in sorted(graph.items()):
        if folder not in ALLOWED:
            found.append(f"{folder}: a folder docs/architecture.md and ALLOWED do not place")
        for target in sorted(targets - ALLOWED.get(folder, set())):
            found.append(f"{folder} imports {target}: against the allowed directions")
    modules = set(modules_of(package))
    module_graph: dict[str, set[str]] = {}
    for source, target, name in imports(package):
        a, b = folder_of(source, package), folder_of(target, package)
        if name.startswith("_") and not name.startswith("__") and a != b:
            found.append(f"{source} uses the private {target}.{name} across folders")
        mine, theirs = side_by_side(source, package), side_by_side(target, package)
        if mine and theirs and mine != theirs:
            found.append(f"{source} imports {target}: one {a} folder imports nothing of another")
        imported = f"{target}.{name}" if f"{target}.{name}" in modules else target
        # Importing a module runs the packages above it first: their imports are reached too.
        parents = {".".join(imported.split(".")[:n]) for n in range(1, imported.count(".") + 1)}
        module_graph.setdefault(source, set()).update({imported, *(parents & modules)})
    for prefix, banned in FORBIDDEN_PREFIXES.items():
        for source in sorted(m for m in module_graph if m.startswith(prefix)):
            for target in sorted(m for m in reachable(module_graph, source) if m.startswith(banned)):
                found.append(f"{source} reaches {target}: health and repair know no scheduler")
    return sorted(set(found))


def render(graph: dict[str, set[str]]) -> str:
    """A line a folder: the folders it imports, lowest first, and in parentheses those it may but does not."""
    width = max(len(folder) for folder in graph)
    lines = ["folder".ljust(width + 2) + "imports, lowest first (in parentheses: allowed, not imported now)"]
    for folder in [*ALLOWED, *sorted(set(graph) - set(ALLOWED))]:
        imported, allowed = graph.get(folder, set()), ALLOWED.get(folder, set())
        targets = [t if t in imported else f"({t})" for t in [*ALLOWED, *sorted(imported - set(ALLOWED))]]
        targets = [t for t in targets if t.strip("()") in imported | allowed]
        lines.append(f"{folder.ljust(width + 2)}{', '.join(targets) if targets else '-'}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail on an import against the layout")
    parser.add_argument("--package", type=Path, default=PACKAGE, help="the package folder (exporters/accelmon)")
    args = parser.parse_args(argv)
    if not (args.package / "__init__.py").is_file():
        parser.error(f"{args.package}: not a copy of exporters/accelmon (no __init__.py): nothing would be checked")
    print(render(folder_graph(args.package)))
    if args.check:
        found = problems(args.package)
        for problem in found:
            print(f"layout: {problem}", file=sys.stderr)
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
