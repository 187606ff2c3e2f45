#!/usr/bin/env python3
"""Writes the lock files the worker role installs the exporter's dependencies from, hashes required.

    .venv/bin/python scripts/lock_requirements.py            # resolve, fetch the hashes, rewrite the lock files
    .venv/bin/python scripts/lock_requirements.py --index-url https://mirror.example/simple

One lock file per group the role installs: requirements.lock (pyproject.toml's dependencies) and
requirements-EXTRA.lock for each extra a worker may need (auth: bcrypt; cloudwatch: boto3 and its dependencies;
amd: amdsmi), in ansible/roles/accelmon_exporter/files/. Each package at one exact version for every Python
(3.9-3.13) and architecture (x86_64, aarch64) the fleet runs, with the sha256 of every binary wheel of that version
a worker of those can install (any manylinux glibc level: a newer system's pip prefers a newer wheel), so
`pip install --require-hashes --only-binary :all:` accepts exactly these files and nothing else.

How: pip resolves the requirements for the oldest Python (3.9) on x86_64 (`pip install --dry-run --report`, no
install), each group on its own for what it adds; then every other (Python, architecture) is resolved again with
those versions pinned and must install exactly the same packages (a version without a wheel for one of them, or a
dependency that only one Python needs, stops the script and says which). The hashes come from the index's JSON
API (PEP 691), never from a file downloaded here. The update policy is in docs/security.md, "Supply chain".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from wheelhouse import ARCHITECTURES, EXTRAS, LOCK_DIR, LOCK_FILES, PYTHONS, ROOT, requirements

try:
    from packaging.tags import Tag, compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pip's own copy
    from pip._vendor.packaging.tags import Tag, compatible_tags, cpython_tags  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]

# glibc levels a worker may have, newest first: RHEL 8's 2.28 is the oldest supported, and a newer system's pip
# picks a wheel built for its own level when there is one (bcrypt ships manylinux_2_34 beside manylinux_2_28).
GLIBC_MINORS = range(60, 4, -1)
LEGACY = {"x86_64": ("manylinux2014", "manylinux2010", "manylinux1"), "aarch64": ("manylinux2014",)}


def target_tags(python: str, architecture: str) -> set[Tag]:
    """Every wheel tag CPython `python` on a manylinux `architecture` host accepts."""
    version = tuple(int(part) for part in python.split("."))
    platforms = [f"manylinux_2_{minor}_{architecture}" for minor in GLIBC_MINORS]
    platforms += [f"{legacy}_{architecture}" for legacy in LEGACY[architecture]]
    abi = f"cp{version[0]}{version[1]}"
    return set(cpython_tags(version, abis=[abi], platforms=platforms)) | set(
        compatible_tags(version, interpreter=abi, platforms=platforms)
    )


def resolve(wanted: list[str], python: str, architecture: str, index_url: str) -> dict[str, str]:
    """{name: version} that pip installs for `wanted` on that target (nothing installed or downloaded but metadata)."""
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        command = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--report", str(report), "--target", str(Path(work) / "target"),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            *(arg for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
              for arg in ("--platform", f"{tag}_{architecture}")),
            "--index-url", index_url, *wanted,
        ]  # fmt: skip
        # Only the index given: no site's pip.conf adds other indexes or local wheel directories.
        env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
        result = subprocess.run(command, capture_output=True, text=True, env={**env, "PIP_CONFIG_FILE": os.devnull})
        if result.returncode != 0:
            raise SystemExit(f"lock: Python {python} {architecture}: pip could not resolve:\n{result.stderr}")
        installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def wheel_hashes(name: str, version: str, index_url: str, targets: list[tuple[str, str]]) -> list[str]:
    """The sha256 of every wheel of name==version that one of the targets can install; each target must have one."""
    request = urllib.request.Request(
        f"{index_url.rstrip('/')}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    tags = {target: target_tags(*target) for target in targets}
    hashes, covered = set(), set()
    for file in files:
        if not file["filename"].endswith(".whl") or file.get("yanked"):
            continue
        _, wheel_version, _, wheel_tags = parse_wheel_filename(file["filename"])
        if str(wheel_version) != version:
            continue
        fits = [target for target in targets if wheel_tags & tags[target]]
        if fits:
            hashes.add(file["hashes"]["sha256"])
            covered.update(fits)
    missing = [f"{python} {architecture}" for python, architecture in targets if (python, architecture) not in covered]
    if missing:
        raise SystemExit(f"lock: {name}=={version} has no wheel for Python {', '.join(missing)}")
    return sorted(hashes)


def render(group: str, pins: dict[str, str], hashes: dict[str, list[str]]) -> str:
    what = "accelmon's dependencies" if group == "" else f"The `{group}` extra's dependencies"
    lines = [
        "# Generated by scripts/lock_requirements.py from pyproject.toml: do not edit, re-run it (docs/security.md,",
        '# "Supply chain"). ' + f"{what}, for CPython {PYTHONS[0]}-{PYTHONS[-1]} on manylinux "
        f"{' and '.join(ARCHITECTURES)}:",
        "# one version each, with the sha256 of every binary wheel of it such a worker may install.",
    ]
    for name in sorted(pins):
        lines.append(f"{name}=={pins[name]} \\")
        lines.extend(f"    --hash=sha256:{digest}" + (" \\" if n < len(hashes[name]) - 1 else "")
                     for n, digest in enumerate(hashes[name]))  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default="https://pypi.org/simple", help="the package index (PEP 691 JSON)")
    parser.add_argument("--dest", type=Path, default=LOCK_DIR, help="where the lock files are written")
    args = parser.parse_args(argv)

    oldest = (PYTHONS[0], ARCHITECTURES[0])
    everything = requirements(extras=EXTRAS)
    pins = resolve(everything, *oldest, args.index_url)
    # Which group brings which package: the dependencies first, then what each extra adds to them.
    groups = {"": resolve(requirements(extras=()), *oldest, args.index_url)}
    for extra in EXTRAS:
        added = resolve(requirements(extras=(extra,)), *oldest, args.index_url)
        groups[extra] = {name: version for name, version in added.items() if name not in groups[""]}
    for group, found in groups.items():
        changed = {name for name, version in found.items() if pins.get(name) != version}
        if changed:
            raise SystemExit(f"lock: {group or 'dependencies'} resolve {', '.join(sorted(changed))} otherwise alone")
    # Every other target installs exactly these versions, and nothing more.
    targets = [(python, architecture) for python in PYTHONS for architecture in ARCHITECTURES]
    pinned = [f"{name}=={version}" for name, version in sorted(pins.items())]
    for target in targets[1:]:
        found = resolve(pinned, *target, args.index_url)
        if found != pins:
            differ = sorted(set(found.items()) ^ set(pins.items()))
            raise SystemExit(f"lock: Python {' '.join(target)} installs otherwise: {differ}")
        print(f"lock: Python {' '.join(target)}: the same {len(found)} packages", flush=True)

    hashes = {name: wheel_hashes(name, version, args.index_url, targets) for name, version in pins.items()}
    args.dest.mkdir(parents=True, exist_ok=True)
    for group, members in groups.items():
        path = args.dest / LOCK_FILES[group]
        path.write_text(render(group, members, hashes))
        count = sum(len(hashes[name]) for name in members)
        print(f"lock: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{len(members)} packages, {count} hashes")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
