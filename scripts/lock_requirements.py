#!/usr/bin/env python3
"""Writes the lock files the worker role installs the exporter's dependencies from, hashes required.

    .venv/bin/python scripts/lock_requirements.py            # resolve, fetch the hashes, rewrite the lock files
    .venv/bin/python scripts/lock_requirements.py --index-url https://mirror.example/simple

One lock file per group the role installs: requirements.lock (pyproject.toml's dependencies) and
requirements-EXTRA.lock for each extra a worker may need (auth: bcrypt; cloudwatch: boto3 and its dependencies;
amd: amdsmi), in ansible/roles/accelmon_exporter/files/. For every Python (3.9-3.13) and architecture (x86_64,
aarch64) the fleet runs, exactly the packages that Python needs, each at one exact version, with the sha256 of every
binary wheel of it such a worker can install (any manylinux glibc level: a newer system's pip prefers a newer wheel),
so `pip install --require-hashes --only-binary :all:` accepts exactly these files and nothing else. Where a version
(or a package) differs by Python, the lock holds each pin with environment markers, `urllib3==1.26.20 ;
python_version < "3.10" --hash=...` beside `urllib3==2.6.3 ; python_version >= "3.10" --hash=...` (botocore needs
urllib3<1.27 on Python < 3.10), which pip evaluates on the worker.

How: pip resolves everything (`pip install --dry-run --report`, nothing installed) for each (Python, architecture)
on its own, the newest versions that Python accepts, as an unlocked pip there would install them. pip evaluates
environment markers (`; python_version < "3.10"`) with the interpreter it runs in whatever --python-version says,
so this interpreter alone would lock 3.11's dependencies for 3.9; the script runs pip's resolver with the marker
environment of each target instead (wheelhouse.PIP_FOR_TARGET). Why this way: it needs no interpreter of each
version (CI and most machines have one Python), it evaluates platform_machine for aarch64 too (a 3.9 interpreter on
an x86_64 host would not), and it keeps pip's own resolver and its rules, where resolving ourselves from the
packages' metadata would re-implement them. It leans on pip's internals, so it is checked: every (Python,
architecture)'s resolution must satisfy every Requires-Dist of every package in it (pip's report), markers evaluated
here with `packaging` and that target's full environment, and hold nothing beyond what they need; a requirement
whose markers depend on the patch level (python_full_version) stops the script. A group's lock holds what its
requirements need beyond the dependencies', per target. The hashes come from the index's JSON API (PEP 691), never
from a file downloaded here. The update policy is in docs/security.md, "Supply chain".
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from wheelhouse import (
    ARCHITECTURES,
    EXTRAS,
    LOCK_DIR,
    LOCK_FILES,
    PYTHONS,
    ROOT,
    marker_environment,
    pip_for_target,
    requirements,
)

try:
    from packaging.requirements import Requirement
    from packaging.tags import Tag, compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.tags import Tag, compatible_tags, cpython_tags  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]

Target = tuple[str, str]  # (Python version, architecture)

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


def resolve(wanted: list[str], python: str, architecture: str, index_url: str) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, Requires-Dist)} that pip installs for `wanted` on that target, its markers evaluated for
    the target (nothing installed or downloaded but metadata)."""
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        command = [
            *pip_for_target(python, architecture), "install", "--dry-run", "--ignore-installed", "--quiet",
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
    return {
        canonicalize_name(item["metadata"]["name"]):
            (item["metadata"]["version"], item["metadata"].get("requires_dist", []))
        for item in installs
    }  # fmt: skip


def needed(roots: list[str], found: dict[str, tuple[str, list[str]]], target: Target) -> set[str]:
    """The packages of `found` that `roots` need on `target`, following every Requires-Dist whose markers hold
    there (evaluated here, for the target's full environment); each must be in `found` at a version it accepts."""
    where = f"lock: Python {' '.join(target)}"
    names: set[str] = set()
    done: set[tuple[str, str]] = set()
    stack = [(Requirement(text), "", "pyproject.toml") for text in roots]
    while stack:
        requirement, extra, source = stack.pop()
        if requirement.marker is not None:
            holds = {requirement.marker.evaluate({**marker_environment(*target, patch), "extra": extra})
                     for patch in ("0", "99")}  # fmt: skip
            if len(holds) > 1:
                raise SystemExit(f"{where}: {source} requires {requirement}: depends on the patch level")
            if not holds.pop():
                continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            raise SystemExit(f"{where}: {source} requires {requirement}, which pip's resolution lacks")
        version, requires = found[name]
        if not requirement.specifier.contains(version, prereleases=True):
            raise SystemExit(f"{where}: {source} requires {requirement}, pip's resolution has {name} {version}")
        names.add(name)
        for wanted_extra in ("", *sorted(canonicalize_name(e) for e in requirement.extras)):
            if (name, wanted_extra) not in done:
                done.add((name, wanted_extra))
                stack.extend((Requirement(text), wanted_extra, f"{name} {version}") for text in requires)
    return names


@functools.cache
def index_files(name: str, index_url: str) -> list[dict]:
    request = urllib.request.Request(
        f"{index_url.rstrip('/')}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["files"]


def wheel_hashes(name: str, version: str, index_url: str, targets: list[Target]) -> list[str]:
    """The sha256 of every wheel of name==version that one of the targets can install; each target must have one."""
    files = index_files(name, index_url)
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


def marker(where: set[Target], targets: list[Target]) -> str:
    """The environment marker that holds on the targets `where` among `targets` (none: on all of them)."""
    if where == set(targets):
        return ""
    pythons = [python for python in PYTHONS if all((python, arch) in where for arch in ARCHITECTURES)]
    if where != {(python, arch) for python in pythons for arch in ARCHITECTURES}:  # by architecture too
        return " or ".join(f'python_version == "{python}" and platform_machine == "{arch}"'
                           for python, arch in targets if (python, arch) in where)  # fmt: skip
    first, last = PYTHONS.index(pythons[0]), PYTHONS.index(pythons[-1])
    if last - first + 1 != len(pythons):
        return " or ".join(f'python_version == "{python}"' for python in pythons)
    bounds = ([f'python_version >= "{pythons[0]}"'] if first > 0 else []) + (
        [f'python_version < "{PYTHONS[last + 1]}"'] if last + 1 < len(PYTHONS) else []
    )
    return " and ".join(bounds)


def render(group: str, entries: dict[tuple[str, str], set[Target]], hashes: dict, targets: list[Target]) -> str:
    what = "accelmon's dependencies" if group == "" else f"The `{group}` extra's dependencies"
    lines = [
        "# Generated by scripts/lock_requirements.py from pyproject.toml: do not edit, re-run it (docs/security.md,",
        '# "Supply chain"). ' + f"{what}, for CPython {PYTHONS[0]}-{PYTHONS[-1]} on manylinux "
        f"{' and '.join(ARCHITECTURES)}:",
        "# what each needs, one version each (markers where it differs), with the sha256 of every binary wheel of it",
        "# such a worker may install.",
    ]
    order = {target: n for n, target in enumerate(targets)}
    for name, version in sorted(entries, key=lambda key: (key[0], min(order[t] for t in entries[key]))):
        condition = marker(entries[name, version], targets)
        digests = hashes[name, version]
        lines.append(f"{name}=={version}" + (f" ; {condition}" if condition else "") + " \\")
        lines.extend(f"    --hash=sha256:{digest}" + (" \\" if n < len(digests) - 1 else "")
                     for n, digest in enumerate(digests))  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default="https://pypi.org/simple", help="the package index (PEP 691 JSON)")
    parser.add_argument("--dest", type=Path, default=LOCK_DIR, help="where the lock files are written")
    args = parser.parse_args(argv)

    targets = [(python, architecture) for python in PYTHONS for architecture in ARCHITECTURES]
    # {group: {(name, version): the targets that install it from that group's lock}}
    groups: dict[str, dict[tuple[str, str], set[Target]]] = {group: {} for group in LOCK_FILES}
    for target in targets:
        found = resolve(requirements(extras=EXTRAS), *target, args.index_url)
        # Which group brings which package there: the dependencies first, then what each extra adds to them.
        members = {"": needed(requirements(extras=()), found, target)}
        for extra in EXTRAS:
            members[extra] = needed(requirements(extras=(extra,)), found, target) - members[""]
            for other in EXTRAS[: EXTRAS.index(extra)]:
                if members[extra] & members[other]:
                    raise SystemExit(f"lock: {extra} and {other} both need {members[extra] & members[other]}")
        extraneous = set(found) - set().union(*members.values())
        if extraneous:
            raise SystemExit(f"lock: Python {' '.join(target)}: pip's resolution has {extraneous}, which none needs")
        for group, names in members.items():
            for name in names:
                groups[group].setdefault((name, found[name][0]), set()).add(target)
        print(f"lock: Python {' '.join(target)}: {len(found)} packages", flush=True)

    every = {key: where for entries in groups.values() for key, where in entries.items()}
    hashes = {(name, version): wheel_hashes(name, version, args.index_url, sorted(where, key=targets.index))
              for (name, version), where in every.items()}  # fmt: skip
    args.dest.mkdir(parents=True, exist_ok=True)
    for group, entries in groups.items():
        path = args.dest / LOCK_FILES[group]
        path.write_text(render(group, entries, hashes, targets))
        count = sum(len(hashes[key]) for key in entries)
        print(f"lock: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{len(entries)} pins, {count} hashes")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
