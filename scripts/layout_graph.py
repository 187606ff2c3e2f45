"""The exporter package's folders and what each imports, read from the code (docs/architecture.md holds its output).

    python scripts/layout_graph.py            prints the folder graph, lowest folder first
    python scripts/layout_graph.py --check    also fails (status 1) on an import against the allowed directions,
                                              a private name imported across folders, or health reaching Slurm
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

# Lowest first; each folder may import those named, nothing above it. docs/architecture.md says why.
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
# (the Slurm integration adapts Slurm's nodes to them).
FORBIDDEN_PREFIXES = {"accelmon.health": ("accelmon.host.slurm_", "accelmon.schedulers")}


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(module: str, package: Path) -> str | None:
    """The folder a module belongs to; None for the package's __init__ (the version only)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return parts[1] if (package / parts[1]).is_dir() else ROOT


def imports(package: Path) -> list[tuple[str, str, str]]:
    """(importing module, imported module, imported name or "") for every import of an accelmon module."""
    modules = {module_name(package, path) for path in package.rglob("*.py")}
    found = []
    for path in sorted(package.rglob("*.py")):
        name = module_name(package, path)
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found += [(name, alias.name, "") for alias in node.names if alias.name.split(".")[0] == "accelmon"]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*here.split(".")[: len(here.split(".")) - node.level + 1], base]).strip(".")
                if base.split(".")[0] != "accelmon":
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"  # `from accelmon import health` imports a module
                    found.append((name, submodule, "") if submodule in modules else (name, base, alias.name))
    return found


def folder_graph(package: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {folder: set() for folder in ALLOWED}
    for source, target, name in imports(package):
        if target == "accelmon" and name == "__version__":
            continue
        a, b = folder_of(source, package), folder_of(target, package)
        if a is not None and b is not None and a != b:
            graph.setdefault(a, set()).add(b)
    return graph


def problems(package: Path) -> list[str]:
    found = []
    graph = folder_graph(package)
    for folder, targets in sorted(graph.items()):
        if folder not in ALLOWED:
            found.append(f"{folder}: a folder docs/architecture.md and ALLOWED do not place")
        for target in sorted(targets - ALLOWED.get(folder, set())):
            found.append(f"{folder} imports {target}: against the allowed directions")
    for source, target, name in imports(package):
        a, b = folder_of(source, package), folder_of(target, package)
        if name.startswith("_") and not name.startswith("__") and a != b:
            found.append(f"{source} imports the private {target}.{name} across folders")
        for prefix, banned in FORBIDDEN_PREFIXES.items():
            if source.startswith(prefix) and (target.startswith(banned) or f"{target}.{name}".startswith(banned)):
                found.append(f"{source} imports {target}: health and repair know no scheduler")
    return sorted(set(found))


def render(graph: dict[str, set[str]]) -> str:
    width = max(len(folder) for folder in graph)
    lines = ["folder".ljust(width + 2) + "imports (lowest folder first)"]
    for folder in [*ALLOWED, *sorted(set(graph) - set(ALLOWED))]:
        targets = [t for t in ALLOWED if t in graph.get(folder, set())]
        lines.append(f"{folder.ljust(width + 2)}{', '.join(targets) if targets else '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail on an import against the layout")
    parser.add_argument("--package", type=Path, default=PACKAGE, help="the package folder (exporters/accelmon)")
    args = parser.parse_args(argv)
    print(render(folder_graph(args.package)))
    if args.check:
        found = problems(args.package)
        for problem in found:
            print(f"layout: {problem}", file=sys.stderr)
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
