"""The lock files with every extra the worker role installs (auth, cloudwatch, amd), for the workers' oldest Python
(3.9, RHEL 9's) and this one: what each Python needs, per-Python pins where they differ (botocore requires
urllib3<1.27 on Python < 3.10), installed offline the role's way, then `pip check`. Downloads the locked wheels
once for the module (scripts/wheelhouse.py: exactly the locked files), so e2e."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.test_lock import FILES, GROUPS, locked_for, target_environment

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # the Python 3.9 tier: pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]

try:
    import tomllib
except ImportError:  # Python < 3.11
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

pytestmark = pytest.mark.e2e

THIS = f"{sys.version_info[0]}.{sys.version_info[1]}"
MACHINE = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine())
EXTRAS = ("auth", "cloudwatch", "amd")
# The role's commands, rendered with this install directory, then moved to each test's.
INSTALL = "/INSTALL-DIR"


def interpreter(version: str) -> str:
    """A CPython `version` on this machine: this one, python3.X on PATH, or pyenv's; skips the test if none runs
    (pyenv's shim on PATH answers for a version it does not select with an error)."""
    if version == THIS:
        return sys.executable
    candidates = [
        shutil.which(f"python{version}"),
        *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")),
    ]
    for candidate in filter(None, candidates):
        answer = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        if answer.returncode == 0 and answer.stdout.strip() == version:
            return str(candidate)
    pytest.skip(f"no Python {version} interpreter here (python{version} on PATH or under ~/.pyenv/versions)")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The locked wheels of Python 3.9, this one and 3.13 on this machine's architecture (scripts/wheelhouse.py)."""
    if MACHINE is None:
        pytest.skip("the lock covers x86_64 and aarch64 only")
    wheels = tmp_path_factory.mktemp("wheelhouse")
    fetch = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), str(wheels),
         "--python", *sorted({"3.9", THIS, "3.13"}), "--platform", MACHINE],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if fetch.returncode != 0 and "Could not" in fetch.stderr and "HTTPSConnection" in fetch.stderr:
        pytest.skip(f"no package index reachable: {fetch.stderr[-300:]}")
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    return wheels


def requires_dist(wheelhouse: Path, name: str, version: str) -> list[str]:
    """The Requires-Dist of name==version, read from its wheel's METADATA."""
    for wheel in wheelhouse.glob("*.whl"):
        wheel_name, wheel_version, _, _ = parse_wheel_filename(wheel.name)
        if canonicalize_name(wheel_name) == name and str(wheel_version) == version:
            with zipfile.ZipFile(wheel) as archive:
                path = next(item for item in archive.namelist() if item.endswith(".dist-info/METADATA"))
                return Parser().parsestr(archive.read(path).decode()).get_all("Requires-Dist") or []
    raise AssertionError(f"no wheel of {name} {version} in the wheelhouse")


@pytest.mark.parametrize("python", ["3.9", "3.13"])
def test_the_lock_meets_every_requirement_of_every_package_it_locks(python, wheelhouse):
    """From accelmon[auth,cloudwatch,amd]'s requirements (pyproject.toml), every Requires-Dist of every locked
    package whose markers hold on that Python (evaluated for it here, not for this interpreter) names a package the
    lock pins for that Python at a version it accepts, and the lock holds nothing else for it."""
    environment = target_environment(python, MACHINE)
    pins = locked_for(python, MACHINE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roots = [*project["dependencies"], *(text for extra in EXTRAS for text in project["optional-dependencies"][extra])]
    stack = [(Requirement(text), "", "accelmon") for text in roots]
    needed, done, unmet = set(), set(), []
    while stack:
        requirement, extra, source = stack.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        version = pins.get(name)
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{source} requires {requirement}; the lock has {name} {version}")
            continue
        needed.add(name)
        for wanted in ("", *sorted(canonicalize_name(each) for each in requirement.extras)):
            if (name, wanted) not in done:
                done.add((name, wanted))
                stack.extend((Requirement(text), wanted, f"{name} {version}")
                             for text in requires_dist(wheelhouse, name, version))  # fmt: skip
    assert not unmet, unmet
    assert needed == set(pins), f"locked for Python {python} but needed by none: {set(pins) - needed}"


@pytest.fixture(scope="module")
def accelmon_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """accelmon's wheel, built as the role builds it (no build isolation, no index) from a copy of the tree."""
    work = tmp_path_factory.mktemp("accelmon-wheel")
    for name in ("exporters", "pyproject.toml", "README.md", "LICENSE"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, work / "src" / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(work / "dist"), str(work / "src")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return next((work / "dist").glob("accelmon-*.whl"))


@pytest.fixture(scope="module")
def role_commands(tmp_path_factory: pytest.TempPathFactory, accelmon_wheel: Path) -> dict:
    """The role's pip commands and their environment (vars/main.yml), rendered by Ansible for a worker with basic
    auth, CloudWatch and AMD GPUs that installs from a wheelhouse."""
    from tests.support.ansible import run_local_play

    role = ROOT / "ansible" / "roles" / "accelmon_exporter"
    work = tmp_path_factory.mktemp("role-commands")
    out = work / "commands.json"
    names = [f"__accelmon_exporter_{name}" for name in ("locks", "pip_install_locked", "pip_install_wheel",
                                                         "wheel_spec", "pip_check", "pip_environment")]  # fmt: skip
    content = "{{ {" + ", ".join(f"'{name}': {name}" for name in names) + "} | to_json }}"
    play = {
        "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": content}}],
    }
    variables = {
        "accelmon_exporter_install_dir": INSTALL,
        "accelmon_exporter_basic_auth_users": {"prometheus": "$2b$12$" + "x" * 53},
        "accelmon_exporter_cloudwatch": {"enabled": True},
        "__accelmon_exporter_amd": True,
        "accelmon_exporter_wheelhouse_dir": "/srv/wheels",
        "__accelmon_exporter_wheel": str(accelmon_wheel),
    }
    result = run_local_play(play, variables, work)
    assert result.returncode == 0, result.stdout[-3000:]
    rendered = json.loads(out.read_text())
    assert rendered["__accelmon_exporter_locks"] == list(GROUPS.values())
    return rendered


@pytest.mark.parametrize("python", ["3.9", THIS])
def test_accelmon_with_every_extra_installs_offline_the_roles_way_and_pip_check_passes(
    python, wheelhouse, accelmon_wheel, role_commands, tmp_path
):
    """A virtualenv of that Python; the role's locked install (hashes required, binary wheels, no index, the
    wheelhouse), then accelmon's wheel with the role's arguments, then the role's `pip check`: all pass, with the
    pins of that Python (urllib3 1.x on 3.9). A host pip configuration (the user's pip.conf, the virtualenv's,
    PIP_* variables) is not read by any of them: each would have pip write a log file."""
    install = tmp_path / "opt"
    (install / "dist").mkdir(parents=True)
    for name in role_commands["__accelmon_exporter_locks"]:
        shutil.copy(FILES / name, install / "dist" / name)
    shutil.copy(accelmon_wheel, install / "dist" / accelmon_wheel.name)
    (install / "wheelhouse").symlink_to(wheelhouse)
    made = subprocess.run([interpreter(python), "-m", "venv", str(install / "venv")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    # What the host may have: a user's and a virtualenv's pip.conf, PIP_* variables (here, each only writes a log).
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nlog = {tmp_path / 'user-config.log'}\n")
    (install / "venv" / "pip.conf").write_text(f"[global]\nlog = {tmp_path / 'venv-config.log'}\n")
    host = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PIP_LOG": str(tmp_path / "environment.log"),
    }
    environment = {**host, **role_commands["__accelmon_exporter_pip_environment"]}

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        argv = [arg.replace(INSTALL, str(install)) for arg in argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=environment)

    locked = run(role_commands["__accelmon_exporter_pip_install_locked"])
    assert locked.returncode == 0, locked.stdout + locked.stderr
    spec = role_commands["__accelmon_exporter_wheel_spec"]
    assert spec.endswith(f"{accelmon_wheel.name}[auth,cloudwatch,amd]"), spec
    wheel = run([*role_commands["__accelmon_exporter_pip_install_wheel"], spec])
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    assert "Successfully installed accelmon-" in wheel.stdout, wheel.stdout
    check = run(role_commands["__accelmon_exporter_pip_check"])
    assert check.returncode == 0, check.stdout + check.stderr
    listed = run([str(install / "venv" / "bin" / "python"), "-m", "pip", "list", "--format", "json", "--isolated"])
    versions = {canonicalize_name(item["name"]): item["version"] for item in json.loads(listed.stdout)}
    for name, version in locked_for(python, MACHINE).items():
        assert versions.get(name) == version, (name, version, versions.get(name))
    assert versions["urllib3"].startswith("1.26." if python == "3.9" else "2.")
    imported = run([str(install / "venv" / "bin" / "python"), "-c", "import accelmon, boto3, bcrypt, yaml"])
    assert imported.returncode == 0, imported.stderr
    assert not [log.name for log in tmp_path.glob("*.log")], "pip read the host's configuration"


def test_the_lock_script_resolves_each_python_with_that_pythons_environment_markers():
    """scripts/lock_requirements.py, run on this Python, resolves the locked boto3 for Python 3.9 with 3.9's markers
    (botocore: urllib3<1.27 where python_version < "3.10"), as the lock pins it; and its own check refuses a
    resolution made with another Python's markers (3.13's: urllib3 2) for 3.9. Needs the package index."""
    if MACHINE is None:
        pytest.skip("the lock covers x86_64 and aarch64 only")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lock_requirements
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    boto3 = [f"boto3=={locked_for('3.9', MACHINE, ('cloudwatch',))['boto3']}"]
    try:
        found = lock_requirements.resolve(boto3, "3.9", MACHINE, "https://pypi.org/simple")
        here = lock_requirements.resolve(boto3, "3.13", MACHINE, "https://pypi.org/simple")
    except SystemExit as error:
        if "HTTPSConnection" in str(error) or "Could not find" in str(error):
            pytest.skip(f"no package index reachable: {str(error)[-300:]}")
        raise
    assert found["urllib3"][0] == locked_for("3.9", MACHINE)["urllib3"], found["urllib3"]
    assert lock_requirements.needed(boto3, found, ("3.9", MACHINE)) == set(found)
    assert here["urllib3"][0].startswith("2."), here["urllib3"]
    with pytest.raises(SystemExit, match="urllib3"):
        lock_requirements.needed(boto3, here, ("3.9", MACHINE))
