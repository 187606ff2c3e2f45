"""Builds the accelmon wheel on the controller, one build at a time per source tree: `build_wheel.py SOURCE WHEELS
PIP-ARGS...`.

setuptools builds in SOURCE/build and never deletes from it (a module removed from the tree would still be packaged),
so each build starts by removing it; two deploys from one checkout at once (parallel Molecule scenarios, two
operators) removed each other's files mid-build ("rmtree failed: No such file or directory"). An exclusive lock on
SOURCE/.accelmon-build.lock makes the removal and the build one step. The wheel is built in a directory of its own
and then renamed into WHEELS: pip's copy over an existing wheel is not atomic, and another deploy (a shard of
scripts/deploy_fleet.py) may be copying that wheel to its hosts at that moment. Exits with pip's status.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile


def main(argv: list[str]) -> int:
    source, wheels, *pip_args = argv
    with open(os.path.join(source, ".accelmon-build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        shutil.rmtree(os.path.join(source, "build"), ignore_errors=True)
        os.makedirs(wheels, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".build-") as built:
            command = [sys.executable, "-m", "pip", "wheel", *pip_args, "--wheel-dir", built, source]
            status = subprocess.call(command)
            for name in os.listdir(built) if status == 0 else ():
                # Same filesystem: a reader has the old file or the new one, never part of one.
                os.replace(os.path.join(built, name), os.path.join(wheels, name))
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
