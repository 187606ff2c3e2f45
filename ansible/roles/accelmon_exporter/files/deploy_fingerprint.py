"""Prints one sha256 of what a worker's deploy is made from on the controller: the roles' own files, the playbook,
the exporter's source and the wheelhouse.

The workers' play ends a host at once when this digest, with the host's variables, rendered configuration and
controller-side certificate (tasks/unchanged.yml), equals the fingerprint the last complete deploy recorded there
(tasks/stamp.yml). Files are read whole and in path order, so any edit to a template, task, lock file or module
changes it; editors' and Python's leftovers (__pycache__, *.pyc, *.egg-info, build/, .cache/) do not. A
wheelhouse is named by its files' names and sizes: a wheel's name carries its version, the lock files (hashed
here with the role) carry each wheel's sha256, and reading hundreds of MiB at every deploy would cost more than
the fast path saves.

Usage: deploy_fingerprint.py PATH... [--listing DIR]...  ->  "<sha256 hex>". The controller's Python, standard
library only. A path that does not exist counts as absent (its name is hashed), never as an error.
"""

from __future__ import annotations

import hashlib
import os
import sys

SKIPPED_DIRS = {"__pycache__", ".cache", "build", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _files(root: str) -> list[str]:
    """Every file under `root` (or `root` itself), sorted, without the build and cache leftovers."""
    if os.path.isfile(root):
        return [root]
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        found.extend(os.path.join(directory, n) for n in names if not n.endswith((".pyc", ".pyo")))
    return sorted(found)


def digest(paths: list[str], listings: list[str]) -> str:
    total = hashlib.sha256()
    for root in paths:
        total.update(b"path\0" + root.encode() + b"\0")
        for path in _files(root):
            total.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                total.update(hashlib.sha256(f.read()).digest())
    for root in listings:
        total.update(b"listing\0" + root.encode() + b"\0")
        for path in _files(root):
            total.update(f"{os.path.relpath(path, root)}\0{os.path.getsize(path)}\0".encode())
    return total.hexdigest()


def main(argv: list[str]) -> int:
    paths: list[str] = []
    listings: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--listing":
            listings.append(next(args))
        else:
            paths.append(arg)
    print(digest(paths, listings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
