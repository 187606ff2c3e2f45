#!/usr/bin/env python3
"""Makes the wheelhouse of an air-gapped fleet: every wheel the exporter's dependencies and its optional extras
(auth: bcrypt; cloudwatch: boto3; amd: amdsmi) need, for every Python version and architecture the workers run.

    .venv/bin/python scripts/wheelhouse.py wheels                        # 3.9-3.13 x x86_64, aarch64
    .venv/bin/python scripts/wheelhouse.py wheels --python 3.11 --platform aarch64
    .venv/bin/python scripts/wheelhouse.py wheels --dry-run              # the pip commands, nothing downloaded

One `pip download --require-hashes --only-binary=:all: --no-deps` of the role's lock files (the exact versions and
hashes the workers install: scripts/lock_requirements.py writes them) per (Python version, architecture), into one
directory: set accelmon_exporter_wheelhouse_dir to it, and each worker installs from it with --no-index (pip there
picks the wheels of its own Python and architecture, and checks each against the lock's hashes). pip checks every
file it downloads here against them too. docs/deploying.md, "Air-gapped clusters".

A lock pins some packages per Python (urllib3 1.26 for botocore on Python 3.9, 2.x from 3.10), with environment
markers. pip evaluates markers for the interpreter it runs in whatever --python-version says, so each download runs
pip with the markers' environment of its target (PIP_FOR_TARGET: pip's own resolver and requirement-file parser,
its marker environment replaced); afterwards every locked file that target needs, the markers evaluated here with
`packaging` for that target, must be in the directory, or the script fails.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: pip's own copy
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
ARCHITECTURES = ("x86_64", "aarch64")
# The extras the worker role installs where they are used (vars/main.yml's __accelmon_exporter_extras).
EXTRAS = ("auth", "cloudwatch", "amd")
# The role's lock files (scripts/lock_requirements.py): the dependencies', then one per extra.
LOCK_DIR = ROOT / "ansible" / "roles" / "accelmon_exporter" / "files"
LOCK_FILES = {"": "requirements.lock", **{extra: f"requirements-{extra}.lock" for extra in EXTRAS}}
# The manylinux tags a worker's pip accepts, down to the oldest glibc of the supported systems (RHEL 8: 2.28);
# pure-Python wheels (py3-none-any) match every target.
MANYLINUX = ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
# pip run with the environment markers of a target worker (a JSON marker environment, its first argument) rather than
# this interpreter's: packaging's Marker.evaluate reads default_environment() at each call, pip's resolver included.
PIP_FOR_TARGET = (
    "import json, sys; from pip._vendor.packaging import markers; target = json.loads(sys.argv.pop(1)); "
    "markers.default_environment = lambda: dict(target); from pip._internal.cli.main import main; sys.exit(main())"
)


def marker_environment(python: str, architecture: str, patch: str = "0") -> dict[str, str]:
    """The environment markers (PEP 508) of CPython `python` (patch level `patch`) on a Linux `architecture` host."""
    return {
        "implementation_name": "cpython", "implementation_version": f"{python}.{patch}", "os_name": "posix",
        "platform_machine": architecture, "platform_release": "", "platform_system": "Linux", "platform_version": "",
        "python_full_version": f"{python}.{patch}", "platform_python_implementation": "CPython",
        "python_version": python, "sys_platform": "linux",
    }  # fmt: skip


def pip_for_target(python: str, architecture: str) -> list[str]:
    """The start of a pip command whose markers are evaluated for that target (the rest: pip's arguments)."""
    return [sys.executable, "-c", PIP_FOR_TARGET, json.dumps(marker_environment(python, architecture))]


def locked_for(locks: list[Path], python: str, architecture: str) -> dict[str, str]:
    """{name: version} the lock files install on that target: each line whose markers hold there, one per name."""
    pins: dict[str, str] = {}
    for lock in locks:
        logical = lock.read_text().replace("\\\n", " ").splitlines()
        for line in filter(str.strip, (line for line in logical if not line.startswith("#"))):
            requirement = Requirement(line.split(" --hash")[0])
            if requirement.marker is None or requirement.marker.evaluate(marker_environment(python, architecture)):
                name = canonicalize_name(requirement.name)
                if name in pins:
                    raise SystemExit(f"wheelhouse: {lock.name}: {name} twice for Python {python} {architecture}")
                pins[name] = next(iter(requirement.specifier)).version
    return pins


def requirements(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = EXTRAS) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"wheelhouse: pyproject.toml has no extra {', '.join(unknown)}")
    return [*project["dependencies"], *(r for extra in extras for r in optional[extra])]


def python_version(value: str) -> str:
    if not re.fullmatch(r"3\.(9|1[0-9])", value):
        raise argparse.ArgumentTypeError(f"{value!r}: a Python version 3.9 or later, such as 3.11")
    return value


def download_command(dest: Path, python: str, architecture: str, locks: list[Path]) -> list[str]:
    platforms = [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_{architecture}")]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--require-hashes", "--only-binary=:all:", "--no-deps", "--implementation", "cp", "--python-version", python,
        *platforms, "--dest", str(dest), *(arg for lock in locks for arg in ("-r", str(lock))),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the wheelhouse directory (made if missing)")
    parser.add_argument(
        "--python",
        nargs="+",
        type=python_version,
        default=list(PYTHONS),
        metavar="X.Y",
        help=f"the workers' Python versions (default: {' '.join(PYTHONS)})",
    )
    parser.add_argument(
        "--platform",
        nargs="+",
        choices=ARCHITECTURES,
        default=list(ARCHITECTURES),
        help=f"the workers' architectures (default: {' '.join(ARCHITECTURES)})",
    )
    parser.add_argument("--no-extras", action="store_true", help="no bcrypt, boto3, amdsmi")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands, download nothing")
    args = parser.parse_args(argv)  # fmt: skip

    locks = [LOCK_DIR / LOCK_FILES[group] for group in ("", *(() if args.no_extras else EXTRAS))]
    targets = [(python, architecture) for python in dict.fromkeys(args.python) for architecture in args.platform]
    for python, architecture in targets:
        command = download_command(args.dest, python, architecture, locks)
        print(f"wheelhouse: Python {python} {architecture}: {' '.join(command[1:])}", flush=True)
        if not args.dry_run:
            args.dest.mkdir(parents=True, exist_ok=True)
            # pip's arguments as printed, its markers evaluated for the target.
            if subprocess.run([*pip_for_target(python, architecture), *command[3:]]).returncode != 0:
                print(f"wheelhouse: Python {python} {architecture}: pip download failed", file=sys.stderr)
                return 1
            have = set()
            for wheel in args.dest.glob("*.whl"):
                name, version, _, _ = parse_wheel_filename(wheel.name)
                have.add((canonicalize_name(name), str(version)))
            missing = sorted(set(locked_for(locks, python, architecture).items()) - have)
            if missing:
                print(f"wheelhouse: Python {python} {architecture}: no wheel of {missing}", file=sys.stderr)
                return 1
    if not args.dry_run:
        wheels = sorted(args.dest.glob("*.whl"))
        size = sum(wheel.stat().st_size for wheel in wheels)
        print(f"wheelhouse: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
