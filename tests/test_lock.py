"""The worker role's lock files (ansible/roles/accelmon_exporter/files/requirements*.lock, written by
scripts/lock_requirements.py): every dependency at one exact version per Python (environment markers where the
versions differ) with its wheels' sha256, satisfying pyproject.toml, installed by the role with hashes required and
binary wheels only (issue 66, point 5). tests/test_lock_extras.py installs them with every extra on Python 3.9."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # the Python 3.9 tier: pip's own copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

try:
    import tomllib
except ImportError:  # Python < 3.11
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

FILES = ROOT / "ansible" / "roles" / "accelmon_exporter" / "files"
GROUPS = {"": "requirements.lock", "auth": "requirements-auth.lock", "cloudwatch": "requirements-cloudwatch.lock",
          "amd": "requirements-amd.lock"}  # fmt: skip
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)$")
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
ARCHITECTURES = ("x86_64", "aarch64")


def target_environment(python: str, architecture: str) -> dict[str, str]:
    """The environment markers of a worker's CPython `python` on Linux `architecture` (not this interpreter's)."""
    return {
        "implementation_name": "cpython", "implementation_version": f"{python}.0", "os_name": "posix",
        "platform_machine": architecture, "platform_release": "", "platform_system": "Linux", "platform_version": "",
        "python_full_version": f"{python}.0", "platform_python_implementation": "CPython", "python_version": python,
        "sys_platform": "linux", "extra": "",
    }  # fmt: skip


def read_lock(path: Path) -> list[tuple[str, str, Marker | None, list[str]]]:
    """[(name, version, marker, [sha256, ...]), ...] of a lock file; anything but a pin (with its environment
    markers) and its hashes fails the test."""
    entries = []
    logical = [line for line in path.read_text().replace("\\\n", " ").splitlines() if not line.startswith("#")]
    for line in filter(str.strip, logical):
        text, *options = line.split(" --hash=")
        requirement = Requirement(text)
        match = PIN.match(f"{requirement.name}{requirement.specifier}")
        assert match and not requirement.extras and not requirement.url, f"{path.name}: {text!r} is not one pin"
        hashes = [option.strip().removeprefix("sha256:") for option in options]
        assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in hashes), f"{path.name}: {line}"
        assert hashes, f"{path.name}: {text} has no hash"
        entries.append((canonicalize_name(requirement.name), match.group(2), requirement.marker, hashes))
    return entries


def locked_for(python: str, architecture: str, groups: tuple[str, ...] = tuple(GROUPS)) -> dict[str, str]:
    """{name: version} the role installs on that worker from these groups' locks: the pins whose markers hold."""
    pins: dict[str, str] = {}
    for group in groups:
        for name, version, marker, _ in read_lock(FILES / GROUPS[group]):
            if marker is None or marker.evaluate(target_environment(python, architecture)):
                assert name not in pins, f"{name} twice for Python {python} {architecture}"
                pins[name] = version
    return pins


def test_every_locked_package_is_pinned_with_its_wheels_hashes():
    locks = {group: read_lock(FILES / name) for group, name in GROUPS.items()}
    assert all(locks.values())
    # One pin of a package for each worker, in one group only: the role installs the base lock with each extra's
    # on top (locked_for fails on a second one).
    for python in PYTHONS:
        for architecture in ARCHITECTURES:
            assert locked_for(python, architecture)
    # The compiled ones carry a wheel per Python version and architecture (PyYAML: 5 x 2 at least).
    hashes = {name: [] for lock in locks.values() for name, *_ in lock}
    for lock in locks.values():
        for name, _, _, digests in lock:
            hashes[name] += digests
    assert len(hashes["pyyaml"]) >= 10 and len(hashes["bcrypt"]) >= 2


def test_per_python_pins_name_the_pythons_they_are_for():
    """botocore requires urllib3<1.27 on Python < 3.10 (urllib3 2 from 3.10): the cloudwatch lock pins each, with
    the markers pip evaluates on the worker."""
    for architecture in ARCHITECTURES:
        assert locked_for("3.9", architecture, ("", "cloudwatch"))["urllib3"].startswith("1.26.")
        for python in PYTHONS[1:]:
            assert locked_for(python, architecture, ("", "cloudwatch"))["urllib3"].startswith("2.")
    urllib3 = [entry for entry in read_lock(FILES / GROUPS["cloudwatch"]) if entry[0] == "urllib3"]
    assert [str(marker) for _, _, marker, _ in urllib3] == ['python_version < "3.10"', 'python_version >= "3.10"']


def test_the_lock_satisfies_pyprojects_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for python in PYTHONS:
        for architecture in ARCHITECTURES:
            for group in GROUPS:
                wanted = project["dependencies"] if group == "" else project["optional-dependencies"][group]
                pins = locked_for(python, architecture, tuple(dict.fromkeys(("", group))))
                for text in wanted:
                    requirement = Requirement(text)
                    version = pins.get(canonicalize_name(requirement.name), "")
                    assert version and requirement.specifier.contains(version, prereleases=True), (python, text)


def task(tasks: list[dict], name: str) -> dict:
    return next(entry for entry in tasks if entry.get("name") == name)


@pytest.mark.e2e
def test_the_role_installs_the_locked_dependencies_with_hashes_and_binary_wheels_only(tmp_path):
    """The install commands as the role renders them: the lock files of the extras in use, --require-hashes and
    --only-binary :all:; accelmon's own wheel from no index, so its dependencies can only be the locked ones."""
    from tests.support.ansible import run_local_play

    role = ROOT / "ansible" / "roles" / "accelmon_exporter"
    out = tmp_path / "commands.json"
    names = [
        "__accelmon_exporter_locks",
        "__accelmon_exporter_pip_install_locked",
        "__accelmon_exporter_pip_install_wheel",
        "__accelmon_exporter_pip_check",
        "__accelmon_exporter_pip_environment",
    ]
    content = "{{ {" + ", ".join(f"'{name}': {name}" for name in names) + "} | to_json }}"
    play = {
        "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": content}}],
    }
    variables = {
        "accelmon_exporter_basic_auth_users": {"prometheus": "$2b$12$" + "x" * 53},
        "accelmon_exporter_cloudwatch": {"enabled": True},
        "accelmon_exporter_wheelhouse_dir": "/srv/wheels",
        # A mirror signed by a private CA: its bundle, since the role's pip reads no pip.conf's `cert =`.
        "accelmon_exporter_pip_cert": "/etc/pki/mirror-ca.pem",
    }
    result = run_local_play(play, variables, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    rendered = json.loads(out.read_text())
    assert rendered["__accelmon_exporter_locks"] == ["requirements.lock", "requirements-auth.lock",
                                                     "requirements-cloudwatch.lock"]  # fmt: skip
    locked = rendered["__accelmon_exporter_pip_install_locked"]
    assert locked[:4] == ["/opt/accelmon/venv/bin/python", "-m", "pip", "install"]
    assert "--require-hashes" in locked and locked[locked.index("--only-binary") + 1] == ":all:"
    assert ["-r", "/opt/accelmon/dist/requirements-cloudwatch.lock"] == locked[-2:]
    assert locked.count("-r") == 3 and "--no-index" in locked
    assert locked[locked.index("--cert") + 1] == "/etc/pki/mirror-ca.pem"
    # accelmon's wheel: no index and no dependencies (they are the locked ones); pip check after it.
    wheel = rendered["__accelmon_exporter_pip_install_wheel"]
    assert "--no-index" in wheel and "--no-deps" in wheel
    assert rendered["__accelmon_exporter_pip_check"][:4] == ["/opt/accelmon/venv/bin/python", "-m", "pip", "check"]
    # No pip configuration of the host's: --isolated (PIP_* variables, the user's pip.conf) and every pip.conf.
    assert all("--isolated" in argv for argv in (locked, wheel, rendered["__accelmon_exporter_pip_check"]))
    assert rendered["__accelmon_exporter_pip_environment"] == {"PIP_CONFIG_FILE": "/dev/null"}
    # Every lock file the role may name is in the role, and the tasks run the commands in that order.
    for extra in ("auth", "cloudwatch", "amd"):
        assert (role / "files" / f"requirements-{extra}.lock").is_file()
    tasks = yaml.safe_load((role / "tasks" / "install.yml").read_text())
    order = [entry.get("name") for entry in tasks]
    copy = "Copy the lock files of the dependencies"
    deps = "Install the locked dependencies into the virtualenv"
    wheel = "Install accelmon into the virtualenv"
    check = "Check the virtualenv's dependencies"
    assert order.index(copy) < order.index(deps) < order.index(wheel) < order.index(check)
    assert task(tasks, deps)["ansible.builtin.command"]["argv"] == "{{ __accelmon_exporter_pip_install_locked }}"
    assert task(tasks, check)["ansible.builtin.command"]["argv"] == "{{ __accelmon_exporter_pip_check }}"
    assert task(tasks, check)["changed_when"] is False  # reads only: the role stays idempotent
    pip_tasks = [entry for entry in tasks if "__accelmon_exporter_pip_" in str(entry.get("ansible.builtin.command"))]
    assert len(pip_tasks) == 4  # the locked install, the wheel's, its reinstall, the check
    assert all(entry["environment"] == "{{ __accelmon_exporter_pip_environment }}" for entry in pip_tasks)
    assert task(tasks, copy)["loop"] == "{{ __accelmon_exporter_locks }}"


@pytest.mark.e2e
def test_the_locked_wheels_install_offline_and_a_tampered_one_is_refused(tmp_path):
    """scripts/wheelhouse.py fetches the locked wheels of this Python and architecture (checked against the lock
    as pip downloads them); a fresh virtualenv installs them with no index, as a worker does, and they import. A
    wheel whose bytes differ from the lock's is refused. Needs the package index (or pip's cache) once."""
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    machine = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(__import__("platform").machine())
    if machine is None:
        pytest.skip("the lock covers x86_64 and aarch64 only")
    wheels = tmp_path / "wheels"
    fetch = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), str(wheels), "--python", python,
         "--platform", machine],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if fetch.returncode != 0 and "Could not" in fetch.stderr and "HTTPSConnection" in fetch.stderr:
        pytest.skip(f"no package index reachable: {fetch.stderr[-300:]}")
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    pip = [str(environment / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
           "--require-hashes", "--only-binary", ":all:", "--no-deps", "--find-links", str(wheels)]  # fmt: skip
    locks = [arg for name in GROUPS.values() for arg in ("-r", str(FILES / name))]
    installed = subprocess.run([*pip, *locks], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    check = subprocess.run(
        [str(environment / "bin" / "python"), "-c", "import prometheus_client, pynvml, yaml, bcrypt, boto3, amdsmi"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # amdsmi loads libamd_smi.so at import where ROCm is absent: its import error is that, not a missing package.
    assert check.returncode == 0 or "amd_smi" in check.stderr, check.stderr

    # One byte more in PyYAML's wheel: pip refuses it, naming the hash that does not match.
    tampered = tmp_path / "tampered"
    shutil.copytree(wheels, tampered)
    yaml_wheel = next(tampered.glob("[Pp]y[Yy][Aa][Mm][Ll]-*.whl"))
    yaml_wheel.write_bytes(yaml_wheel.read_bytes() + b"\0")
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    pip[0] = str(fresh / "bin" / "python")
    pip[pip.index(str(wheels))] = str(tampered)
    refused = subprocess.run([*pip, "-r", str(FILES / GROUPS[""])], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr, refused.stderr

    # pip checks hashes only of what it downloads: a package already installed at the locked version stays as it
    # is, whatever its files hold (here a file of PyYAML changed after the install, as an install before the lock
    # or a hand's pip may have left it). So the role makes anew a virtualenv it did not fill with hashes required.
    installed_yaml = next((environment / "lib").glob("python*/site-packages/yaml/__init__.py"))
    installed_yaml.write_text(installed_yaml.read_text() + "\n# not what the locked wheel holds\n")
    pip[0] = str(environment / "bin" / "python")
    pip[pip.index(str(tampered))] = str(wheels)
    again = subprocess.run([*pip, *locks], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Successfully installed" not in again.stdout, again.stdout + again.stderr
    assert "not what the locked wheel holds" in installed_yaml.read_text(), "the premise: pip kept the file"
    venv.create(environment, with_pip=True, clear=True)  # the role's `python -m venv --clear`
    remade = subprocess.run([*pip, *locks], capture_output=True, text=True, timeout=600)
    assert remade.returncode == 0, remade.stdout + remade.stderr
    assert "not what the locked wheel holds" not in installed_yaml.read_text()


def test_a_virtualenv_not_filled_with_hashes_required_is_made_anew():
    """The role's install tasks: the virtualenv is made anew (--clear) unless its marker says this role filled it
    with hashes required, and the marker is written only after the locked install, so an install that fails
    leaves no marker and the next deploy clears it again (pip's side of this: the test above)."""
    tasks = yaml.safe_load((ROOT / "ansible" / "roles" / "accelmon_exporter" / "tasks" / "install.yml").read_text())
    order = [entry.get("name") for entry in tasks]
    create = "Create the virtualenv"
    deps = "Install the locked dependencies into the virtualenv"
    record = "Record that the virtualenv holds only hash-checked packages"
    assert order.index(create) < order.index(deps) < order.index(record)
    command = task(tasks, create)["ansible.builtin.command"]
    assert "--clear" in command["argv"] and "when" not in task(tasks, create)
    # The marker is what spares it: absent (a virtualenv of a release before the lock, or none), it is made anew.
    assert command["creates"] == task(tasks, record)["ansible.builtin.copy"]["dest"]
    variables = yaml.safe_load((ROOT / "ansible" / "roles" / "accelmon_exporter" / "vars" / "main.yml").read_text())
    assert variables["__accelmon_exporter_venv_hashed"].startswith("{{ accelmon_exporter_install_dir }}/venv/")
