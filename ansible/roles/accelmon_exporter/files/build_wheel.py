"""Builds the accelmon wheel on the controller, one build at a time per source tree: `build_wheel.py SOURCE WHEELS
[--input PATH]... PIP-ARGS...`.

setuptools builds in SOURCE/build and never deletes from it (a module removed from the tree would still be packaged),
so each build starts by removing it; two deploys from one checkout at once (parallel Molecule scenarios, two
operators) removed each other's files mid-build ("rmtree failed: No such file or directory"). An exclusive lock on
SOURCE/.accelmon-build.lock makes the removal and the build one step. The wheel is built in a directory of its own
and then renamed into WHEELS: pip's copy over an existing wheel is not atomic, and another deploy (a shard of
scripts/deploy_fleet.py) may be copying that wheel to its hosts at that moment. Exits with pip's status.

With --input PATHs (what the wheel is made from: the package, pyproject.toml, the readme), a build whose inputs,
interpreter, setuptools and pip arguments equal those of the wheel last built into WHEELS is skipped: a play with
`serial` runs its run-once build once per batch, and each shard of scripts/deploy_fleet.py runs its own, so a fleet
deploy built the same wheel dozens of times, one at a time under the lock. The record is WHEELS/.accelmon-build
(the digest, then the wheel's name), written after the wheel is in place; a wheel since removed is built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version

RECORD = ".accelmon-build"


def inputs_digest(inputs: list[str], pip_args: list[str]) -> str:
    """What decides the wheel's content: its inputs' files (deploy_fingerprint.py's reading, which skips build and
    cache leftovers), this interpreter, its setuptools and the pip arguments."""
    from deploy_fingerprint import digest  # this script's directory is first on sys.path

    try:
        setuptools = version("setuptools")
    except PackageNotFoundError:  # pip's own error says so when it builds
        setuptools = "absent"
    extra = "\0".join([sys.executable, setuptools, *pip_args])
    return hashlib.sha256(f"{digest(inputs, [])}\0{extra}".encode()).hexdigest()


def unchanged(wheels: str, wanted: str) -> bool:
    try:
        with open(os.path.join(wheels, RECORD)) as f:
            recorded, wheel = f.read().split()
    except (OSError, ValueError):
        return False
    return recorded == wanted and os.path.isfile(os.path.join(wheels, wheel))


def main(argv: list[str]) -> int:
    source, wheels, *rest = argv
    inputs: list[str] = []
    while rest[:1] == ["--input"] and len(rest) > 1:
        inputs.append(rest[1])
        rest = rest[2:]
    pip_args = rest
    with open(os.path.join(source, ".accelmon-build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        wanted = inputs_digest(inputs, pip_args) if inputs else ""
        if wanted and unchanged(wheels, wanted):
            print("the wheel in place was built from these inputs: not built again")
            return 0
        if wanted:  # a build stopped between the wheel's rename and the new record must not leave the old one
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(wheels, RECORD))
        shutil.rmtree(os.path.join(source, "build"), ignore_errors=True)
        os.makedirs(wheels, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".build-") as built:
            command = [sys.executable, "-m", "pip", "wheel", *pip_args, "--wheel-dir", built, source]
            status = subprocess.call(command)
            names = os.listdir(built) if status == 0 else []
            for name in names:
                # Same filesystem: a reader has the old file or the new one, never part of one.
                os.replace(os.path.join(built, name), os.path.join(wheels, name))
        if wanted and len(names) == 1:
            with open(os.path.join(wheels, RECORD + ".new"), "w") as f:
                f.write(f"{wanted} {names[0]}\n")
            os.replace(os.path.join(wheels, RECORD + ".new"), os.path.join(wheels, RECORD))
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
