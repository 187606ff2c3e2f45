"""Static checks of the Ansible roles and the deploy playbook's argument validation (no hosts changed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.support.ansible import render_role_template
from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

ROLES = sorted(p.name for p in (ROOT / "ansible" / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_have_the_same_keys(role):
    defaults = yaml.safe_load((ROOT / "ansible" / "roles" / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROOT / "ansible" / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert all(name.startswith(role + "_") for name in options), "public variables carry the role's name"
    assert all(option.get("description") for option in options.values())
    # A default lives in defaults/main.yml alone; the specs give types, choices and descriptions.
    assert not [name for name, option in options.items() if "default" in option]


@pytest.mark.parametrize("role", ROLES)
def test_the_docs_list_every_variable_with_its_default(role):
    """docs/deploying.md's variable blocks are the roles' defaults, verbatim: a new default shows up there."""
    defaults = (ROOT / "ansible" / "roles" / role / "defaults" / "main.yml").read_text().removeprefix("---\n")
    assert f"```yaml\n{defaults}```" in (ROOT / "docs" / "deploying.md").read_text(), (
        f"docs/deploying.md: update {role}'s block"
    )


@pytest.mark.parametrize("role", ROLES)
def test_each_role_has_a_readme_whose_variables_are_its_argument_spec(role):
    """The README's table is generated from meta/argument_specs.yml and defaults/main.yml: a variable added, removed
    or redescribed in the spec and not in the README (or the reverse) fails here."""
    readme = (ROOT / "ansible" / "roles" / role / "README.md").read_text()
    assert readme.startswith(f"# Role `{role}`\n")
    for section in ("## What it installs and opens", "## Example", "## Variables"):
        assert section in readme, f"{role}/README.md has no {section!r}"
    assert f"- role: {role}" in readme  # the example uses it
    checked = subprocess.run(
        [sys.executable, "scripts/role_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout
    spec = yaml.safe_load((ROOT / "ansible" / "roles" / role / "meta" / "argument_specs.yml").read_text())
    for name in spec["argument_specs"]["main"]["options"]:
        assert f"| `{name}` |" in readme, name


def controller_env(work: Path, **extra: str) -> dict[str, str]:
    """The controller's environment for a test's ansible-playbook: HOME in `work`, so that what a deploy keeps in
    the controller's home (~/.accelmon: the scrape PKI, Grafana's secret key), even in --check, is the test's and
    never the real home's of whoever runs the tests."""
    (work / "home").mkdir(exist_ok=True)
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(work / "home"),
            **extra}  # fmt: skip


def deploy(
    tmp_path: Path, *variables: str, group: str = "worker", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook --check of deploy.yaml with this machine as the only host of `group` (and `env` added to
    the controller's environment)."""
    host = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = tmp_path / "host.ini"
    # No master here: the workers' Prometheus is named by address, as a remote one is (the preflight refuses an
    # empty scraper group).
    scraper = '[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n'
    inventory.write_text(
        "".join(f"[{name}]\n{host if group == name else ''}\n\n" for name in ("master", "worker", "store")) + scraper
    )
    env = controller_env(tmp_path, **(env or {}))
    args = [arg for variable in variables for arg in ("-e", variable)]
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            "--check",
            str(ROOT / "ansible" / "deploy.yaml"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


# Each bad value must stop the deploy in its preflight, before any host changes, naming the variable. One
# ansible-playbook run checks every case of a group: a host of its own per case (this machine, by a local
# connection), given the case's variables as -e would give them; each host fails on its own.
WORKER_CASES = [
    # A variable of an earlier version is refused, not silently ignored.
    ("accelmon_exporter_nvml=enabled", "accelmon_exporter_nvml: no longer read"),
    ("accelmon_exporter_log_level=loud", "accelmon_exporter_log_level"),
    ("accelmon_exporter_collectors=[]", "accelmon_exporter_collectors"),
    # The exporter's own validation, run on the controller, names the setting.
    ("accelmon_exporter_listen_address=nowhere", "listen address 'nowhere'"),
    ('{"accelmon_exporter_allowed_clients": ["10.0.0.0/33"]}', "web.allowed_clients: '10.0.0.0/33' is no address"),
    ('{"accelmon_exporter_collectors": {"nvml": {"interval_seconds": 0}}}', "collectors.nvml.interval_seconds"),
    ('{"accelmon_exporter_collectors": {"gpu": {}}}', "collectors: unknown key(s) gpu"),
    ('{"accelmon_exporter_collectors": {"profiling": {"backend": "cupti"}}}', "expected one of auto, dcgm, gpm"),
    (
        '{"accelmon_exporter_tls_cert": "C", "accelmon_exporter_tls_key": "K",'
        ' "accelmon_exporter_tls_client_ca": "A", "accelmon_exporter_basic_auth_users": {"prometheus": "hunter2"}}',
        "never to clear passwords",
    ),
    ('{"accelmon_exporter_tls_cert": "C"}', "accelmon_exporter_tls_cert and accelmon_exporter_tls_key go together"),
    ("accelmon_exporter_cloudwatch=on", "accelmon_exporter_cloudwatch"),
    (
        '{"accelmon_exporter_cloudwatch": {"enabled": true, "endpoint_url": "monitoring.internal"}}',
        "cloudwatch.endpoint_url: expected an http:// or https:// URL",
    ),
    (
        '{"accelmon_exporter_cloudwatch": {"metrics": [{"metric": "accelmon_gpu_power_watts", "name": "P",'
        ' "unit": "Watts"}]}}',
        "cloudwatch.metrics[0].unit",
    ),
    ("accelmon_exporter_aws_access_key_id=AKIAIOSFODNN7EXAMPLE", "go together"),
    ('{"accelmon_exporter_nccl_inspector": true}', "accelmon_exporter_nccl_inspector needs accelmon_exporter_jobs"),
    # Issue 66 review: the allow-list. A scraper group without a host answered the loopback alone (each case host
    # names an address of its own, batch_deploy); a string was read character by character; a typo's host bits
    # under /0 answered everyone; a zone never matched; the plain-HTTP choice of the first host was every host's.
    ('{"accelmon_exporter_allowed_clients": []}', "accelmon_exporter_scraper_group=master names a group with no host"),
    (
        '{"accelmon_exporter_scraper_group": "masters", "accelmon_exporter_allowed_clients": []}',
        "accelmon_exporter_scraper_group=masters names no group of this inventory",
    ),
    ("accelmon_exporter_allowed_clients=10.0.0.9", "accelmon_exporter_allowed_clients must be a list"),
    ('{"accelmon_exporter_allowed_clients": ["10.0.0.5/0"]}', "'10.0.0.5/0' is no address or network"),
    ('{"accelmon_exporter_allowed_clients": ["fe80::1%eth0"]}', "give the address without its zone"),
    ("accelmon_exporter_plain_http=true", "so set it for all of them or none"),
    # An open list is warned (test_an_open_allow_list_is_warned), then this host fails in node_exporter's preflight.
    (
        '{"accelmon_exporter_allowed_clients": ["0.0.0.0/0", "::/0"], "accelmon_node_exporter_memory_max": "lots"}',
        "accelmon_node_exporter_memory_max is a size such as 512M",
    ),
    # node_exporter's own plain HTTP is warned (test_node_exporters_own_plain_http_is_warned), then this host fails.
    (
        '{"accelmon_node_exporter_plain_http": true, "accelmon_node_exporter_memory_max": "lots"}',
        "accelmon_node_exporter_memory_max is a size such as 512M",
    ),
    # node_exporter's own checks (its role's preflight), in the same play.
    ("accelmon_node_exporter_listen_address=9100", "must be HOST:PORT or :PORT"),
    ('{"accelmon_node_exporter_extra_args": ["--web.listen-address=:9101"]}', "without --web.listen-address"),
    ('{"accelmon_node_exporter_disabled_collectors": ["InfiniBand; rm"]}', "names collectors"),
    # Issue 66: a limit systemd cannot read would leave node_exporter unbounded (its journal only warns).
    ("accelmon_node_exporter_memory_max=lots", "accelmon_node_exporter_memory_max is a size such as 512M"),
    # Issue 66, point 5: node_exporter pinned, by the distribution's version or a release checked by its sha256.
    ('{"accelmon_node_exporter_package_versions": {"Debian-11": "1.1.2+ds-2.1"}}', "no version pinned for Debian-12"),
    (
        '{"accelmon_node_exporter_package_versions": {"Debian-12": "9.9.9-1"}}',
        "9.9.9-1 (accelmon_node_exporter_package",
    ),
    (
        "accelmon_node_exporter_tarball_url=https://mirror.example/node_exporter-1.9.1.linux-amd64.tar.gz",
        "accelmon_node_exporter_tarball_sha256 (its 64 hex digits",
    ),
    (
        (
            "accelmon_node_exporter_tarball_url=https://mirror.example/node_exporter.zip",
            f"accelmon_node_exporter_tarball_sha256={'a' * 64}",
        ),
        "an https:// or file:// release .tar.gz",
    ),
    # The tarball is fetched and checked on the controller in the preflight: one not there stops every host first.
    (
        (
            "accelmon_node_exporter_tarball_url=file:///nowhere/node_exporter-1.10.2.linux-amd64.tar.gz",
            f"accelmon_node_exporter_tarball_sha256={'a' * 64}",
        ),
        "could not be had on the controller as the file whose sha256 accelmon_node_exporter_tarball_sha256 gives",
    ),
]
MASTER_CASES = [
    ('{"accelmon_master_remote_write": [{"url": "vm:8428/api/v1/write"}]}', "url must be http:// or https://"),
    (
        '{"accelmon_master_remote_write": [{"url": "https://vm.example/write", "basic_auth_username": "u"}]}',
        "basic_auth_username and basic_auth_password go together",
    ),
    (
        '{"accelmon_master_remote_write": [{"url": "https://a/w", "bearer_token": "t", "basic_auth_username": "u",'
        ' "basic_auth_password": "p"}]}',
        "basic auth or bearer_token, not both",
    ),
    ('{"accelmon_master_remote_write": [{"uri": "https://a/w"}]}', "url"),
    ("accelmon_master_replicas=zero", "accelmon_master_replicas"),
    ("accelmon_master_query_url=store-01:8428", "must be empty or an http:// or https:// URL"),
    ("accelmon_master_fleet_rules=shard", "accelmon_master_fleet_rules"),
    # Grafana's credentials for the global store.
    ("accelmon_master_query_bearer_token=secret", "they need the URL set"),
    (
        '{"accelmon_master_query_url": "https://vm:8428", "accelmon_master_query_basic_auth_password": "secret"}',
        "basic_auth_username and basic_auth_password go together",
    ),
    (
        '{"accelmon_master_query_url": "https://vm:8428", "accelmon_master_query_basic_auth_username": "u",'
        ' "accelmon_master_query_basic_auth_password": "secret", "accelmon_master_query_bearer_token": "secret"}',
        "basic auth or bearer_token, not both",
    ),
    (
        '{"accelmon_master_query_url": "https://mimir", "accelmon_master_query_headers": {"X Scope": "secret"}}',
        "a mapping of header names",
    ),
    (
        '{"accelmon_master_query_url": "https://m", "accelmon_master_query_headers": {"authorization": "secret"}}',
        "no Authorization",
    ),
    (
        '{"accelmon_master_query_url": "http://vm:8428", "accelmon_master_query_tls_ca": "secret"}',
        "a PEM certificate, for an https:// URL",
    ),
    ("accelmon_master_query_headers=secret", "accelmon_master_query_headers"),
    # Issue 66, point 4: a password or token never crosses the network in clear, nor sits in a URL.
    (
        '{"accelmon_master_remote_write": [{"url": "http://vm:8428/api/v1/write", "basic_auth_username": "u",'
        ' "basic_auth_password": "secret"}]}',
        "a password or token only over https://",
    ),
    (
        '{"accelmon_master_remote_write": [{"url": "http://mimir/api/v1/push", "bearer_token": "secret"}]}',
        "a password or token only over https://",
    ),
    ('{"accelmon_master_remote_write": [{"url": "https://u:secret@vm/api/v1/write"}]}', "never inside the URL"),
    (
        '{"accelmon_master_query_url": "http://vm:8428", "accelmon_master_query_basic_auth_username": "u",'
        ' "accelmon_master_query_basic_auth_password": "secret"}',
        "a password or token only over https://",
    ),
    (
        '{"accelmon_master_query_url": "http://vm:8428", "accelmon_master_query_bearer_token": "secret"}',
        "only over https",
    ),
    # A header's value is one of Grafana's secrets too (secureJsonData): an API key is no safer in clear.
    (
        '{"accelmon_master_query_url": "http://vm:8428", "accelmon_master_query_headers": {"X-Api-Key": "secret"}}',
        "accelmon_master_query_headers only over https://",
    ),
    ("accelmon_master_query_url=https://u:secret@vm:8428", "never inside the URL"),
    # Issue 66, point 3: Grafana's certificate goes with its key (neither value printed).
    (
        '{"accelmon_master_grafana_tls_cert": "-----BEGIN CERTIFICATE-----secret"}',
        "accelmon_master_grafana_tls_cert and accelmon_master_grafana_tls_key go together",
    ),
    ("accelmon_master_grafana_secret_key=secret", "16 characters or more"),
    # HTTPS is the default: plain HTTP is asked for alone, never beside a certificate; extra names are names.
    (
        '{"accelmon_master_grafana_plain_http": true,'
        ' "accelmon_master_grafana_tls_cert": "-----BEGIN CERTIFICATE-----",'
        ' "accelmon_master_grafana_tls_key": "-----BEGIN PRIVATE KEY-----"}',
        "HTTPS or plain HTTP: choose one",
    ),
    ('{"accelmon_master_grafana_tls_names": ["*.example.com"]}', "are DNS names or IP addresses"),
    ("accelmon_master_live_jobs_straggler_sm_clock_ratio=1.5", "must be a ratio above 0 and at most 1"),
    ("accelmon_master_live_jobs_idle_utilization=0", "must be a ratio above 0 and at most 1"),
    ("accelmon_master_live_jobs_interval=often", "must be empty or a Prometheus duration such as 30s or 1m"),
    (
        "accelmon_master_live_jobs_hung_for=ten",
        "accelmon_master_live_jobs_hung_for=ten must be a Prometheus duration",
    ),
    # A digest does not make latest a pin, nor does a digest of the wrong length.
    ("accelmon_master_prometheus_image=docker.io/prom/prometheus:latest@sha256:" + "a" * 64, "need a pinned tag"),
    ("accelmon_master_grafana_image=docker.io/grafana/grafana:11.6.16@sha256:abc", "need a pinned tag"),
]
STORE_CASES = [
    ((), "missing required arguments: accelmon_store_listen_address"),
    (("accelmon_store_listen_address=store.example.com",), "must be IP addresses"),
    (("accelmon_store_listen_address=10.0.0.5", "accelmon_store_retention_period=forever"), "retention_period"),
    (("accelmon_store_listen_address=10.0.0.5", "accelmon_store_dedup_interval=often"), "dedup_interval"),
    (("accelmon_store_listen_address=10.0.0.5", "accelmon_store_package_version=9.9.9-1"), "is not offered"),
    (
        ("accelmon_store_listen_address=10.0.0.5", "accelmon_store_basic_auth_password=secret-secret-1"),
        "go together",
    ),
    (
        (
            "accelmon_store_listen_address=10.0.0.5",
            "accelmon_store_basic_auth_username=fleet",
            "accelmon_store_basic_auth_password=secret",
        ),
        "a password of 12 or more",
    ),
    (
        (
            "accelmon_store_listen_address=10.0.0.5",
            "accelmon_store_basic_auth_username=fleet",
            "accelmon_store_basic_auth_password='secret secret$1'",
        ),
        "a password of 12 or more",
    ),
    (("accelmon_store_listen_address=10.0.0.5", "accelmon_store_tls_cert=secret"), "a PEM certificate"),
    # Issue 66, point 4: off the loopback, basic auth and TLS both (VictoriaMetrics authenticates nothing itself).
    (("accelmon_store_listen_address=10.0.0.5",), "is not a loopback address"),
    (
        (
            "accelmon_store_listen_address=0.0.0.0",
            "accelmon_store_basic_auth_username=fleet",
            "accelmon_store_basic_auth_password=secret-secret-1",
        ),
        "is not a loopback address",
    ),
    (
        (
            "accelmon_store_listen_address=::",
            "accelmon_store_tls_cert='-----BEGIN CERTIFICATE-----secret'",
            "accelmon_store_tls_key='-----BEGIN PRIVATE KEY-----secret'",
        ),
        "is not a loopback address",
    ),
    (
        ("accelmon_store_listen_address=127.0.0.1", "accelmon_store_vmalert_listen_address=0.0.0.0"),
        "must be a loopback address (vmalert serves plain HTTP)",
    ),
]


@pytest.fixture(scope="module")
def preflight(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[list[str], str]]:
    """preflight(group): the output lines of each case's host and the whole output, of one --check deploy of every
    case of that group (run once per module and group)."""
    runs: dict[str, tuple[list[str], str]] = {}

    def run(group: str) -> tuple[list[str], str]:
        if group not in runs:
            cases = {"worker": WORKER_CASES, "master": MASTER_CASES, "store": STORE_CASES}[group]
            runs[group] = batch_deploy(tmp_path_factory.mktemp(f"preflight-{group}"), group, cases)
        return runs[group]

    return run


def batch_deploy(work: Path, group: str, cases: list[tuple[Any, str]]) -> tuple[list[str], str]:
    from ansible.parsing.splitter import parse_kv  # the controller's package: absent where only the exporter is

    hosts = {}
    for number, (variables, _) in enumerate(cases):
        host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        if group == "worker":  # the inventory has no master: its Prometheus named by address, as a remote one is
            host["accelmon_exporter_allowed_clients"] = ["192.0.2.10"]
        for variable in (variables,) if isinstance(variables, str) else variables:
            # What `-e` makes of it: JSON as JSON, key=value as ansible-playbook parses it.
            host.update(json.loads(variable) if variable.startswith("{") else parse_kv(variable))
        hosts[f"case-{number:02d}"] = host
    inventory = work / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {name: {"hosts": hosts if name == group else {}}
                                             for name in ("master", "worker", "store")}}})
    )  # fmt: skip
    env = controller_env(work, ANSIBLE_FORKS="8")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "--check",
         str(ROOT / "ansible" / "deploy.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    output = result.stdout
    assert result.returncode != 0, output[-3000:]
    # A failure's message comes first (ansible-core 2.19: "[ERROR]: Task failed: ..." naming no host), then the
    # line naming its host: each host's lines are the ones naming it and those just before them.
    per_host: dict[str, list[str]] = {host: [] for host in hosts}
    pending: list[str] = []
    for line in output.splitlines():
        named = [host for host in hosts if f"[{host}]" in line]
        if named:
            per_host[named[0]] += [*pending, line]
            pending = []
        elif line.startswith(("TASK [", "PLAY [", "RUNNING HANDLER [")):
            pending = []
        else:
            pending.append(line)
    return ["\n".join(per_host[host]) for host in hosts], output


@pytest.mark.parametrize(("number", "case"), list(enumerate(WORKER_CASES)), ids=[c[1] for c in WORKER_CASES])
def test_bad_variable_fails_in_preflight_naming_it(preflight, number, case):
    lines, output = preflight("worker")
    assert case[1] in lines[number], lines[number] or output[-3000:]
    assert f"case-{number:02d}" in output.split("PLAY RECAP")[-1]
    # It failed in the preflight play: no worker play ran.
    assert "PLAY [Workers]" not in output


def test_an_open_allow_list_is_warned(preflight):
    """["0.0.0.0/0", "::/0"] is a choice the play's output shows, as plain HTTP is (issue 66 review B)."""
    _, output = preflight("worker")
    number = next(n for n, case in enumerate(WORKER_CASES) if "0.0.0.0/0" in case[0])
    results = output.split(f"ok: [case-{number:02d}] => ")[1:]
    warned = [r for r in results if "[WARNING] accelmon_exporter_allowed_clients lets any address" in r[:600]]
    assert warned and "0.0.0.0/0, ::/0" in warned[0][:600], output[-3000:]
    assert not any("lets any address" in r[:600] for r in output.split("ok: [case-00] => ")[1:])


def test_node_exporters_own_plain_http_is_warned(preflight):
    """accelmon_node_exporter_plain_http: true on a worker whose accelmon-exporter serves HTTPS (the exporter's
    plain-HTTP warning, which speaks for both, is then not printed) is warned in the play's output for that host."""
    _, output = preflight("worker")
    number = next(n for n, case in enumerate(WORKER_CASES) if "accelmon_node_exporter_plain_http" in case[0])
    results = output.split(f"ok: [case-{number:02d}] => ")[1:]
    warned = [r for r in results if "[WARNING] plain HTTP asked for node_exporter on" in r[:600]]
    assert len(warned) == 1 and "accelmon_node_exporter_plain_http" in warned[0][:600], output[-3000:]
    assert not any("node_exporter on" in r[:600] for r in output.split("ok: [case-00] => ")[1:])


@pytest.mark.parametrize(("number", "case"), list(enumerate(MASTER_CASES)), ids=[c[1] for c in MASTER_CASES])
def test_bad_scale_out_variable_fails_in_preflight(preflight, number, case):
    """A wrong remote_write, sharding or HA setting stops the deploy before any host changes, naming it."""
    lines, output = preflight("master")
    assert case[1] in lines[number], lines[number] or output[-3000:]
    assert "PLAY [Masters]" not in output
    # No value printed ("secret" is every case's); the one variable named so may be named.
    assert "secret" not in output.replace("accelmon_master_grafana_secret_key", "") and '"p"' not in output


def release_on_the_controller(directory: Path, version: str, arch: str = "amd64") -> tuple[str, str]:
    """A stand-in for node_exporter's release tarball in `directory`: its file:// address and its sha256."""
    path = directory / f"node_exporter-{version}.linux-{arch}.tar.gz"
    return f"file://{path}", file_on_the_controller(path)


def controller_home(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME for a local play's controller: the tarball cache (~/.accelmon/node-exporter) is the test's own."""
    home = directory / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    return home


NODE_EXPORTER_DEFAULTS = ROOT / "ansible" / "roles" / "accelmon_node_exporter" / "defaults" / "main.yml"


@pytest.mark.parametrize(
    ("distribution", "variables", "flag"),
    [
        (("Debian", "12"), {}, "--web.config.file"),
        (("Ubuntu", "22"), {}, "--web.config"),  # 1.3.1: --web.config.file is an unknown flag there
        (("Ubuntu", "24"), {}, "--web.config.file"),
        (("Ubuntu", "22"), {"accelmon_node_exporter_tarball_url": "1.9.1"}, "--web.config.file"),
        (("Amazon", "2023"), {"accelmon_node_exporter_tarball_url": "1.4.0"}, "--web.config"),
        (("Amazon", "2023"), {}, "--web.config.file"),  # the default release, 1.10.2
    ],
)  # fmt: skip
def test_ubuntu_lts_is_pinned_and_node_exporter_gets_the_web_config_flag_its_version_reads(
    tmp_path, monkeypatch, distribution, variables, flag
):
    """Ubuntu 22.04 and 24.04 (Ansible's major versions 22 and 24) have a pinned node_exporter, so the preflight
    does not stop them by default (before: only Debian-12 was); node_exporter before 1.5.0 names the web config
    --web.config (1.5.0's CHANGELOG), so the flags file passes the name the pinned package or release reads."""
    from tests.support.ansible import run_local_play

    name, major = distribution
    family = {"Debian": "Debian", "Ubuntu": "Debian", "Amazon": "RedHat"}[name]
    facts = {"distribution": name, "distribution_major_version": major, "os_family": family, "architecture": "x86_64"}
    role = ROOT / "ansible" / "roles" / "accelmon_node_exporter"
    variables = {**variables, "__accelmon_pki": {"cert": "C", "key": "K", "hash": "H"}}
    controller_home(tmp_path, monkeypatch)
    if "accelmon_node_exporter_tarball_url" in variables:
        url, sha256 = release_on_the_controller(tmp_path, variables["accelmon_node_exporter_tarball_url"])
        variables.update(accelmon_node_exporter_tarball_url=url, accelmon_node_exporter_tarball_sha256=sha256)
    elif name == "Amazon":  # the default release, from a stand-in for it (no network here)
        release = yaml.safe_load(NODE_EXPORTER_DEFAULTS.read_text())["accelmon_node_exporter_release_version"]
        _, sha256 = release_on_the_controller(tmp_path, release)
        variables.update(accelmon_node_exporter_release_url=f"file://{tmp_path}/node_exporter-{{version}}.linux-{{arch}}.tar.gz",
                         accelmon_node_exporter_release_sha256={"x86_64": sha256})  # fmt: skip
    play = {
        "vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")],
        "tasks": [
            {"name": "Be the distribution", "ansible.builtin.set_fact": {"ansible_facts": facts}},
            {"ansible.builtin.template": {"src": str(role / "templates" / "node_exporter.default.j2"),
                                          "dest": str(tmp_path / "flags"), "mode": "0644"}},
            {"name": "Check node_exporter is pinned for this distribution",
             "ansible.builtin.include_role": {"name": "accelmon_node_exporter", "tasks_from": "preflight.yml"}},
        ],
    }  # fmt: skip
    result = run_local_play(play, variables, tmp_path)
    # This machine's package sources are Debian 12's: Ubuntu's pinned version is not offered here (apt-cache
    # madison), which the preflight then says; the pin itself must be there.
    assert "no version pinned" not in result.stdout, result.stdout[-3000:]
    assert "Amazon Linux has no node_exporter package" not in result.stdout
    if name != "Ubuntu" or variables.get("accelmon_node_exporter_tarball_url"):
        assert result.returncode == 0, result.stdout[-3000:]
    args = next(line for line in (tmp_path / "flags").read_text().splitlines() if line.startswith("ARGS="))
    assert f" {flag}=/etc/accelmon-node-exporter/web-config.yml" in args
    # EPEL's unit and the tarball's read OPTIONS, which systemd's EnvironmentFile= takes as written (no $ARGS).
    options = next(line for line in (tmp_path / "flags").read_text().splitlines() if line.startswith("OPTIONS="))
    assert options.partition("=")[2] == args.partition("=")[2]


# The distributions docs/deploying.md supports for workers (Ansible's distribution, major version, family).
SUPPORTED_WORKERS = [
    ("Ubuntu", "22", "Debian"), ("Ubuntu", "24", "Debian"), ("Debian", "12", "Debian"),
    ("RedHat", "8", "RedHat"), ("RedHat", "9", "RedHat"), ("Rocky", "8", "RedHat"), ("Rocky", "9", "RedHat"),
    ("Amazon", "2023", "RedHat"),
]  # fmt: skip


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_every_supported_distribution_gets_a_pinned_package_or_a_checked_release(tmp_path, architecture):
    """Issue 66, point 5: on each architecture, every distribution the guide supports resolves to its package at a
    pinned version (Debian 12, Ubuntu 22.04 and 24.04) or to node_exporter's release at a pinned version with that
    architecture's sha256 (RHEL and Rocky 8-9, Amazon Linux 2023, which has no package); an EL host whose EPEL
    version is pinned gets the package. Before, EL and Amazon Linux stopped in preflight unless the operator
    brought a tarball. The sha256s are the ones docs/security.md cites."""
    from tests.support.ansible import run_local_play

    role = ROOT / "ansible" / "roles" / "accelmon_node_exporter"
    resolved = ("tarball", "release", "package_version", "tarball_url", "tarball_sha256", "service", "web_config_flag")
    report = "{{ {" + ", ".join(f"'{v}': __accelmon_node_exporter_{v}" for v in resolved) + "} | to_json }}"
    tasks = []
    for name, major, family in [*SUPPORTED_WORKERS, ("Rocky", "9-epel", "RedHat")]:
        facts = {"distribution": name, "distribution_major_version": major.split("-")[0], "os_family": family,
                 "architecture": architecture}  # fmt: skip
        if major.endswith("-epel"):
            pins = {"Rocky-9": "1.8.2-2.el9"}
            tasks.append({"ansible.builtin.set_fact": {"accelmon_node_exporter_package_versions": pins}})
        tasks += [
            {"ansible.builtin.set_fact": {"ansible_facts": facts}},
            {"ansible.builtin.copy": {"content": report, "dest": str(tmp_path / f"{name}-{major}.json"),
                                      "mode": "0644"}},
        ]  # fmt: skip
    play = {"vars_files": [str(role / "defaults" / "main.yml"), str(role / "vars" / "main.yml")], "tasks": tasks}
    result = run_local_play(play, {}, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    version = defaults["accelmon_node_exporter_release_version"]
    sha256 = defaults["accelmon_node_exporter_release_sha256"]
    goarch = {"x86_64": "amd64", "aarch64": "arm64"}[architecture]
    security = (ROOT / "docs" / "security.md").read_text()
    for name, major, family in [*SUPPORTED_WORKERS, ("Rocky", "9-epel", "RedHat")]:
        got = json.loads((tmp_path / f"{name}-{major}.json").read_text())
        if family == "Debian" or major.endswith("-epel"):
            pinned = defaults["accelmon_node_exporter_package_versions"].get(f"{name}-{major}", "1.8.2-2.el9")
            assert (got["tarball"], got["package_version"]) == (False, pinned), (name, major, got)
            continue
        assert got["tarball"] and got["release"], (name, major, got)
        assert got["tarball_url"] == (f"https://github.com/prometheus/node_exporter/releases/download/v{version}/"
                                      f"node_exporter-{version}.linux-{goarch}.tar.gz"), got  # fmt: skip
        assert re.fullmatch("[0-9a-f]{64}", got["tarball_sha256"]) and got["tarball_sha256"] == sha256[architecture]
        assert (got["service"], got["web_config_flag"]) == ("node_exporter", "--web.config.file"), got
        assert got["tarball_sha256"] in security, "docs/security.md cites the release's sha256s and their sources"


# A release fetched on the controller: each case changes the right release's variables; the message ("" passes).
RELEASE_CASES = [
    ("the release", {}, ""),
    ("another sha256", {"accelmon_node_exporter_release_sha256": {"x86_64": "c" * 64}},
     'could not be had on the controller as the file whose sha256 accelmon_node_exporter_release_sha256["x86_64"]'
     " gives"),
    ("no sha256 for this architecture", {"accelmon_node_exporter_release_sha256": {"aarch64": "c" * 64}},
     'accelmon_node_exporter_release_sha256["x86_64"] this architecture\'s 64 hex digits'),
    ("a version that is no version", {"accelmon_node_exporter_release_version": "latest"},
     "accelmon_node_exporter_release_version must be X.Y.Z (given: latest)"),
    ("a tarball given, of another sha256",
     {"accelmon_node_exporter_tarball_url": "RELEASE", "accelmon_node_exporter_tarball_sha256": "d" * 64},
     "as the file whose sha256 accelmon_node_exporter_tarball_sha256 gives"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "changed", "message"), RELEASE_CASES, ids=[c[0] for c in RELEASE_CASES])
def test_the_release_is_fetched_and_checked_on_the_controller_before_any_host_changes(
    tmp_path, monkeypatch, case, changed, message
):
    """Issue 66, point 5: Amazon Linux 2023 (no package) gets node_exporter's release, fetched once into the
    controller's cache and checked there by its sha256 in the preflight, before any host changes; a file of
    another sha256 stops the deploy naming the variable that gave it, and is not kept; a cached copy changed since
    is refused too."""
    home = controller_home(tmp_path, monkeypatch)
    facts = {"distribution": "Amazon", "distribution_major_version": "2023", "os_family": "RedHat",
             "architecture": "x86_64"}  # fmt: skip
    url, sha256 = release_on_the_controller(tmp_path, "1.10.2")
    variables = {"accelmon_node_exporter_release_url": f"file://{tmp_path}/node_exporter-{{version}}.linux-{{arch}}.tar.gz",
                 "accelmon_node_exporter_release_sha256": {"x86_64": sha256}}  # fmt: skip
    variables.update({k: url if v == "RELEASE" else v for k, v in changed.items()})
    result = preflight_of("accelmon_node_exporter", facts, variables, tmp_path)
    output = result.stdout.replace('\\"', '"')  # a message's quotes, as the failure's JSON escapes them
    cache = home / ".accelmon" / "node-exporter"
    kept = sorted(str(p.relative_to(cache)) for p in cache.rglob("*.tar.gz")) if cache.exists() else []
    if message:
        assert result.returncode != 0 and message in output, output[-3000:]
        assert kept == [], "a file of another sha256 is not kept"
        return
    assert result.returncode == 0, result.stdout[-3000:]
    assert kept == [f"{sha256}/node_exporter-1.10.2.linux-amd64.tar.gz"]
    # Fetched once: the next preflight checks the copy it has; one changed since is refused.
    (tmp_path / "node_exporter-1.10.2.linux-amd64.tar.gz").unlink()
    assert preflight_of("accelmon_node_exporter", facts, variables, tmp_path).returncode == 0
    (cache / kept[0]).write_bytes(b"changed")
    result = preflight_of("accelmon_node_exporter", facts, variables, tmp_path)
    output = result.stdout.replace('\\"', '"')
    assert (
        result.returncode != 0 and f'not the {sha256} of accelmon_node_exporter_release_sha256["x86_64"]' in output
    ), output[-3000:]


def preflight_of(role: str, facts: dict[str, str], variables: dict[str, Any], tmp_path: Path):
    """A role's preflight.yml run on this machine as a host with `facts`, given `variables`."""
    from tests.support.ansible import run_local_play

    play = {
        "tasks": [
            {"name": "Be the distribution", "ansible.builtin.set_fact": {"ansible_facts": facts}},
            {"ansible.builtin.include_role": {"name": role, "tasks_from": "preflight.yml"}},
        ]
    }
    return run_local_play(play, variables, tmp_path)


def file_on_the_controller(path: Path) -> str:
    """Writes a stand-in for a release file at `path`; its sha256."""
    import hashlib

    path.write_bytes(path.name.encode())
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Offline workers and store: the release tarball (accelmon_node_exporter_tarball_file) and the store's .deb
# (accelmon_store_package_file) on the controller are checked in the preflight, before any host changes: one not
# there, with another sha256 than given, given with a URL too, or (the .deb) not the pinned version's stops the
# deploy naming why. Each case: the role, the variables changed from a right file's, the message ("" passes).
CONTROLLER_FILE_CASES = [
    ("accelmon_node_exporter", {}, ""),
    ("accelmon_node_exporter", {"accelmon_node_exporter_tarball_sha256": "c" * 64}, "has the sha256 "),
    ("accelmon_node_exporter", {"accelmon_node_exporter_tarball_file": "/nowhere/node_exporter-1.9.1.tar.gz"},
     "is not a file on the controller"),
    ("accelmon_node_exporter", {"accelmon_node_exporter_tarball_url": "https://mirror.example/node_exporter.tar.gz"},
     "not both"),
    ("accelmon_store", {}, ""),
    ("accelmon_store", {"accelmon_store_package_sha256": "c" * 64}, "the file has "),
    ("accelmon_store", {"accelmon_store_package_file": "/nowhere/victoria-metrics_1.79.5+ds1-2+b5_amd64.deb"},
     "no such file"),
    ("accelmon_store", {"accelmon_store_package_version": "1.80.0-1"}, "victoria-metrics_1.80.0-1_ARCH.deb"),
]  # fmt: skip


@pytest.mark.parametrize(("role", "changed", "message"), CONTROLLER_FILE_CASES)
def test_a_release_file_on_the_controller_is_checked_there_first(tmp_path, role, changed, message):
    if role == "accelmon_node_exporter":
        facts = {"distribution": "Amazon", "distribution_major_version": "2023", "os_family": "RedHat"}
        tarball = tmp_path / "node_exporter-1.9.1.linux-amd64.tar.gz"
        variables = {"accelmon_node_exporter_tarball_file": str(tarball),
                     "accelmon_node_exporter_tarball_sha256": file_on_the_controller(tarball)}  # fmt: skip
    else:
        facts = {"os_family": "Debian"}
        package = tmp_path / "victoria-metrics_1.79.5+ds1-2+b5_amd64.deb"
        variables = {"accelmon_store_listen_address": "127.0.0.1", "accelmon_store_package_file": str(package),
                     "accelmon_store_package_sha256": file_on_the_controller(package)}  # fmt: skip
    result = preflight_of(role, facts, {**variables, **changed}, tmp_path)
    if not message:
        assert result.returncode == 0, result.stdout[-3000:]
    else:
        assert result.returncode != 0 and message in result.stdout, result.stdout[-3000:]


def test_more_shards_than_masters_fails_in_preflight(tmp_path):
    """The one check that counts the group's hosts: alone in its run."""
    result = deploy(tmp_path, "accelmon_master_shards=2", group="master")
    assert result.returncode != 0
    assert "needs that many hosts in the group" in result.stdout + result.stderr
    assert "PLAY [Masters]" not in result.stdout


def image_archive(path: Path, name: str, oci: bool = False) -> tuple[str, str]:
    """A one-image archive as `podman save` writes it (docker-archive, or with oci an OCI archive) naming `name`,
    with an empty layer list; its sha256 and the image's ID (the sha256 of its configuration)."""
    import hashlib
    import io
    import tarfile

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    config = json.dumps({"architecture": "amd64", "os": "linux", "name": name}).encode()
    members = {}
    if oci:
        manifest = json.dumps({"schemaVersion": 2, "config": {"digest": f"sha256:{sha(config)}"}, "layers": []})
        annotations = {"org.opencontainers.image.ref.name": name}
        index = {"schemaVersion": 2, "manifests": [{"digest": f"sha256:{sha(manifest.encode())}",
                                                    "annotations": annotations}]}  # fmt: skip
        members = {f"blobs/sha256/{sha(config)}": config, f"blobs/sha256/{sha(manifest.encode())}": manifest.encode(),
                   "index.json": json.dumps(index).encode()}  # fmt: skip
    else:
        entry = {"Config": f"{sha(config)}.json", "RepoTags": [name], "Layers": []}
        members = {f"{sha(config)}.json": config, "manifest.json": json.dumps([entry]).encode()}
    with tarfile.open(path, "w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return sha(path.read_bytes()), sha(config)


@pytest.mark.parametrize("oci", [False, True], ids=["docker-archive", "oci-archive"])
def test_an_image_archive_is_read_for_its_images_names_and_ids(tmp_path, oci):
    """files/image_archive.py reads both formats podman and docker save, with Docker Hub's names shortened as
    docker writes them; what is no image archive is an error, not a crash."""
    script = ROOT / "ansible" / "roles" / "accelmon_master" / "files" / "image_archive.py"

    def read(path: Path) -> dict[str, Any]:
        result = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=True)
        return json.loads(result.stdout)

    digest, image_id = image_archive(tmp_path / "p.tar", "docker.io/prom/prometheus:v2.55.1", oci=oci)
    assert read(tmp_path / "p.tar") == {"sha256": digest, "images": {"prom/prometheus:v2.55.1": image_id}}
    (tmp_path / "junk.tar").write_bytes(b"not a tar" * 100)
    assert "error" in read(tmp_path / "junk.tar")
    assert "error" in read(tmp_path / "absent.tar")


def test_image_archives_are_checked_on_the_controller_before_any_master_changes(tmp_path):
    """Offline masters (accelmon_master_image_archives): an archive that is not there, not the one whose sha256
    was given, without a sha256, or holding another image stops the deploy in its preflight, naming the image and
    why; a right one (Docker Hub's long name for the short one docker save writes) passes."""
    digest, _ = image_archive(tmp_path / "prometheus.tar", "prom/prometheus:v2.55.1")
    image = "docker.io/prom/prometheus:v2.55.1"

    def archives(path: Path, sha256: str | None, image: str = image) -> str:
        entry = {"path": str(path), **({"sha256": sha256} if sha256 is not None else {})}
        return json.dumps({"accelmon_master_image_archives": {image: entry}})

    cases = [
        (archives(tmp_path / "absent.tar", digest), "cannot be read on the controller as an image archive"),
        (archives(tmp_path / "prometheus.tar", "0" * 64), "not the archive that was checked"),
        (archives(tmp_path / "prometheus.tar", None), "needs path (the archive on the controller"),
        (
            archives(tmp_path / "prometheus.tar", digest.upper(), image="docker.io/prom/alertmanager:v0.27.0"),
            "holds prom/prometheus:v2.55.1, not prom/alertmanager:v0.27.0",
        ),
        (archives(tmp_path / "prometheus.tar", digest), ""),
    ]
    (tmp_path / "work").mkdir()
    lines, output = batch_deploy(tmp_path / "work", "master", cases)
    for number, (_, message) in enumerate(cases[:-1]):
        assert "accelmon_master_image_archives['" in lines[number] and message in lines[number], lines[number]
        assert "Load the images" not in lines[number]
    assert "accelmon_master_image_archives[" not in lines[-1], lines[-1]
    # The right archive's master went on past the preflight.
    assert f"ok: [case-0{len(cases) - 1}] => (item={image})" in output


@pytest.mark.parametrize(("number", "case"), list(enumerate(STORE_CASES)), ids=[c[1] for c in STORE_CASES])
def test_bad_store_variable_fails_in_preflight(preflight, number, case):
    """The store's address is asked for, and every value is checked first, its secrets never printed."""
    lines, output = preflight("store")
    assert case[1] in lines[number], lines[number] or output[-3000:]
    assert "PLAY [Store]" not in output
    assert "secret" not in output


@pytest.mark.parametrize("variable", ["skip_worker=true", "accelmon_skip_worker=true"])
def test_skip_worker_leaves_the_workers_alone(tmp_path, variable):
    """Moneo's switch and ours: the workers are neither checked nor touched."""
    result = deploy(tmp_path, variable)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "accelmon_exporter : Check the exporter configuration" not in result.stdout
    assert "accelmon_exporter : Build the wheel" not in result.stdout


def list_tasks(*tags: str) -> str:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "--list-tasks",
            *(f"--tags={tag}" for tag in tags),
            str(ROOT / "ansible" / "deploy.yaml"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        timeout=120,
        check=True,
    )
    return result.stdout


def test_tags_select_the_plays_and_the_configuration():
    config = list_tasks("config")
    assert "Write the exporter configuration" in config and "Write the Prometheus configuration" in config
    assert "Configure node_exporter's flags" in config
    assert "Build the wheel" not in config and "accelmon_node_exporter : Install node_exporter" not in config
    assert "Run the containers" not in config
    master = list_tasks("master")
    assert "Write the Prometheus configuration" in master and "Write the exporter configuration\t" not in master
    assert "Build the wheel" not in master
    worker = list_tasks("worker")
    assert "Build the wheel" in worker and "Write the Prometheus configuration" not in worker


@pytest.mark.parametrize("web_config", [{}, {"basic_auth_users": {"prometheus": "$2b$10$x"}}])
def test_the_unit_passes_the_web_config_only_when_there_is_one(tmp_path, web_config):
    unit = tmp_path / "accelmon-exporter.service"
    variables = {
        "__accelmon_exporter_web_config": web_config,
        "__accelmon_exporter_plan": {"device_allow": ["char-nvidia-frontend rw"], "capabilities": []},
        "accelmon_exporter_nvml_library_dir": "/opt/nvml",
    }
    render_role_template("accelmon_exporter", "accelmon-exporter.service.j2", unit, variables)
    lines = unit.read_text().splitlines()
    command = next(line for line in lines if line.startswith("ExecStart="))
    flag = " --web.config.file /etc/accelmon/web-config.yml" if web_config else ""
    assert command == f"ExecStart=/opt/accelmon/venv/bin/accelmon-exporter --config /etc/accelmon/exporter.yml{flag}"
    assert 'Environment="LD_LIBRARY_PATH=/opt/nvml"' in lines
    assert "DeviceAllow=char-nvidia-frontend rw" in lines


@pytest.mark.parametrize("groups", [[], ["render", "video"]])
def test_the_unit_joins_the_gpu_groups_only_on_amd_hosts(tmp_path, groups):
    """On an AMD host the preflight finds which of render and video exist; amdsmi opens device nodes they own."""
    unit = tmp_path / "accelmon-exporter.service"
    variables = {
        "__accelmon_exporter_web_config": {},
        "__accelmon_exporter_plan": {"device_allow": ["char-kfd rw", "char-drm rw"], "capabilities": []},
        "__accelmon_exporter_supplementary_groups": groups,
    }
    render_role_template("accelmon_exporter", "accelmon-exporter.service.j2", unit, variables)
    lines = unit.read_text().splitlines()
    assert [line for line in lines if line.startswith("SupplementaryGroups=")] == (
        ["SupplementaryGroups=render video"] if groups else []
    )
    assert "DeviceAllow=char-kfd rw" in lines


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [
        ([], ["ProtectKernelLogs=yes", "CapabilityBoundingSet=", "AmbientCapabilities="]),
        (
            ["CAP_SYSLOG"],
            ["ProtectKernelLogs=no", "CapabilityBoundingSet=CAP_SYSLOG", "AmbientCapabilities=CAP_SYSLOG"],
        ),
        (
            ["CAP_PERFMON"],
            [
                "ProtectKernelLogs=yes",
                "CapabilityBoundingSet=CAP_PERFMON",
                "AmbientCapabilities=CAP_PERFMON",
                "SystemCallFilter=perf_event_open",
            ],
        ),
    ],
)
def test_the_unit_grants_only_the_capabilities_the_exporter_asks_for(tmp_path, capabilities, expected):
    """The exporter's plan (--check-config --json) names CAP_SYSLOG where the kernel_log collector may run: the
    unit grants it and lets the kernel log be read; CAP_PERFMON where job_perf is enabled, with perf_event_open let
    through the system-call filter; elsewhere no capability, ProtectKernelLogs and the filter stay as before."""
    unit = tmp_path / "accelmon-exporter.service"
    variables = {
        "__accelmon_exporter_web_config": {},
        "__accelmon_exporter_plan": {"device_allow": ["/dev/kmsg r"], "capabilities": capabilities},
    }
    render_role_template("accelmon_exporter", "accelmon-exporter.service.j2", unit, variables)
    lines = unit.read_text().splitlines()
    chosen = [
        line
        for line in lines
        if line.split("=")[0] in ("ProtectKernelLogs", "CapabilityBoundingSet", "AmbientCapabilities")
        or line == "SystemCallFilter=perf_event_open"
    ]
    assert chosen == expected


@pytest.mark.parametrize(
    ("scheduler", "command"),
    [("slurm", "accelmon-slurm-health"), ("oar", "accelmon-oar-health"), ("remediation", "accelmon-remediation")],
)
def test_the_health_check_runs_the_scan_with_the_exporters_environment(tmp_path, scheduler, command):
    """The program slurm.conf names, or OAR's node check, or accelmon-remediation on root's PATH (docs/health.md
    types it so): the exporter's NVML library directory and extra environment (quoted for the shell, whatever the
    value), then the command over the exporter's config, with the caller's arguments."""
    install = tmp_path / "opt"
    (install / "venv" / "bin").mkdir(parents=True)
    stand_in = install / "venv" / "bin" / command
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" "$LD_LIBRARY_PATH" "$ODD" "$@"\n')
    stand_in.chmod(0o755)
    program = tmp_path / "accelmon-health-check"
    variables = {
        "accelmon_exporter_install_dir": str(install),
        "accelmon_exporter_nvml_library_dir": "/opt/fake nvml",
        "accelmon_exporter_environment": {"ODD": "it's $HOME `x`"},
        "__accelmon_exporter_health_scheduler": scheduler,
    }
    render_role_template("accelmon_exporter", "health-check.sh.j2", program, variables)
    result = subprocess.run(["sh", str(program), "--dry-run"], capture_output=True, text=True, timeout=30)
    assert result.stdout.splitlines() == [
        "/opt/fake nvml",
        "it's $HOME `x`",
        "--config",
        "/etc/accelmon/exporter.yml",
        "--dry-run",
    ]


def test_the_diagnostic_prolog_runs_accelmon_slurm_health_with_diag(tmp_path):
    install = tmp_path / "opt"
    (install / "venv" / "bin").mkdir(parents=True)
    stand_in = install / "venv" / "bin" / "accelmon-slurm-health"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" "$PATH" "$@"\n')
    stand_in.chmod(0o755)
    prolog = tmp_path / "40-accelmon-diag.sh"
    render_role_template(
        "accelmon_exporter", "slurm-prolog-diag.sh.j2", prolog, {"accelmon_exporter_install_dir": str(install)}
    )
    result = subprocess.run(["sh", str(prolog)], capture_output=True, text=True, timeout=30, env={})
    assert result.stdout.splitlines() == ["/usr/local/bin:/usr/bin:/bin", "--diag"]


def test_the_rapl_rule_lets_only_node_exporters_group_read_the_energy_counters(tmp_path):
    """systemd-tmpfiles applies the role's rule to a powercap tree made root-only as Linux 5.10+ makes it."""
    rule = tmp_path / "accelmon-rapl.conf"
    render_role_template(
        "accelmon_node_exporter", "rapl-tmpfiles.conf.j2", rule, {"accelmon_node_exporter_group": "prometheus"}
    )
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "group").write_text("root:x:0:\nprometheus:x:997:\n")
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    counters = [
        root / "sys/class/powercap/intel-rapl:0/energy_uj",  # a package
        root / "sys/class/powercap/intel-rapl:0:1/energy_uj",  # its DRAM sub-zone
    ]
    for counter in counters:
        counter.parent.mkdir(parents=True)
        counter.write_text("123456\n")
        counter.chmod(0o400)
    result = subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={root}", str(rule)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    for counter in counters:
        status = counter.stat()
        assert (oct(status.st_mode & 0o777), status.st_uid, status.st_gid) == ("0o440", 0, 997)


@pytest.mark.parametrize(
    "variable",
    ['{"accelmon_deploy_batches": ["ten"]}', '{"accelmon_deploy_batches": []}', "accelmon_deploy_batches=5",
     '{"accelmon_deploy_batches": [1, "150%"]}', "accelmon_deploy_max_fail_percentage=101",
     "accelmon_deploy_masters_stage=sideways"],
)  # fmt: skip
def test_a_bad_roll_out_setting_stops_the_deploy_before_any_host_changes(tmp_path, variable):
    """accelmon_deploy_batches and accelmon_deploy_max_fail_percentage are play settings (serial,
    max_fail_percentage): a bad one is refused in the first play, naming them, before the workers' play."""
    result = deploy(tmp_path, variable)
    assert result.returncode != 0
    assert "accelmon_deploy_batches is a list of batch sizes" in result.stdout, result.stdout[-3000:]
    assert "PLAY [Workers]" not in result.stdout


def test_workers_roll_out_in_checked_batches_and_masters_one_at_a_time():
    """The plays as deploy.yaml declares them: a canary, growing batches, no failure allowed by default; the
    exporter's unit says when it serves (Type=notify) and the role checks it before the next batch."""
    plays = {play["name"]: play for play in yaml.safe_load((ROOT / "ansible" / "deploy.yaml").read_text())}
    assert plays["Workers"]["serial"] == "{{ accelmon_deploy_batches | default([1, '5%', '25%', '100%']) }}"
    assert plays["Workers"]["max_fail_percentage"] == "{{ accelmon_deploy_max_fail_percentage | default(0) }}"
    assert (plays["Masters"]["serial"], plays["Masters"]["max_fail_percentage"]) == (1, 0)
    unit = (ROOT / "ansible/roles/accelmon_exporter/templates/accelmon-exporter.service.j2").read_text()
    assert "\nType=notify\n" in unit
    tasks = yaml.safe_load((ROOT / "ansible/roles/accelmon_exporter/tasks/main.yml").read_text())
    names = [task["name"] for task in tasks]
    check = "Check the exporter runs and serves /metrics after the deploy"
    assert names.index("Restart now what changed") < names.index(check)
    # Serves: scraped as Prometheus does, through its TLS and auth (tests/test_deploy_scrape_check.py).
    (block,) = [task["block"] for task in tasks if task["name"] == check]
    assert {"ansible.builtin.import_tasks": "scrape_check.yml"}.items() <= block[-1].items()


# Issue 65, point 4: the wheel is built on whichever controller runs the deploy, with whichever setuptools it has.
OTHER_SETUPTOOLS = "84.0.0"


def build_system_setuptools() -> str:
    """The build backend pyproject.toml pins: setuptools==X."""
    import tomllib

    (requirement,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requirement.startswith("setuptools=="), requirement
    return requirement.removeprefix("setuptools==")


def build_wheel(source: Path, into: Path, setuptools_dir: Path | None = None) -> Path:
    """The role's build (tasks/install.yml) of `source`, with the venv's setuptools or the one in setuptools_dir."""
    shutil.rmtree(source / "build", ignore_errors=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    if setuptools_dir:
        env["PYTHONPATH"] = str(setuptools_dir)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
         str(into), str(source)],
        check=True, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    (wheel,) = into.glob("accelmon-*.whl")
    return wheel


def wheel_identity(wheel: Path) -> str:
    script = ROOT / "ansible/roles/accelmon_exporter/files/wheel_digest.py"
    return subprocess.run(
        [sys.executable, str(script), str(wheel)], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()


def task_results(output: str, task: str) -> list[str]:
    """The result lines (ok:, changed:, skipping:, fatal:) of every run of a task of the worker role."""
    results, inside = [], False
    for line in output.splitlines():
        if line.startswith("TASK ["):
            inside = line.startswith(f"TASK [accelmon_exporter : {task}]")
        elif inside and line.split(":", 1)[0] in ("ok", "changed", "skipping", "fatal"):
            results.append(line.split(":", 1)[0])
    return results


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the role builds the wheel from (the collection's files/source): a copy, built in without touching ours."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "exporters", source / "exporters", ignore=ignored)
    return source


def test_a_wheel_rebuilt_by_another_setuptools_is_not_reinstalled(tmp_path, source_copy):
    """The same source built by the pinned setuptools and by another release: other bytes (WHEEL names its
    generator), the same identity, and the worker role, finding the other one installed, neither copies nor
    reinstalls the wheel (so the exporter is not restarted)."""
    import setuptools

    assert setuptools.__version__ == build_system_setuptools(), "the venv's setuptools is the pinned build backend"
    other = tmp_path / "setuptools"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(other), f"setuptools=={OTHER_SETUPTOOLS}"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    pinned = build_wheel(source_copy, tmp_path / "pinned")
    rebuilt = build_wheel(source_copy, tmp_path / "other", other)
    assert pinned.read_bytes() != rebuilt.read_bytes(), "the premise: another setuptools makes other bytes"
    assert wheel_identity(pinned) == wheel_identity(rebuilt)
    assert wheel_identity(pinned).startswith("accelmon 0.1.0 ")

    # A worker on which the wheel another controller built (the other setuptools) is installed.
    install = tmp_path / "opt"
    (install / "dist").mkdir(parents=True)
    shutil.copy(rebuilt, install / "dist")
    (install / "dist" / "installed-wheel").write_text(wheel_identity(rebuilt) + "\n")
    result = deploy(tmp_path, f"accelmon_exporter_install_dir={install}")
    output = result.stdout + result.stderr
    assert task_results(output, "Copy the wheel") == ["skipping"], output[-3000:]
    assert task_results(output, "Reinstall accelmon from a changed wheel") == ["skipping"], output[-3000:]
    assert task_results(output, "Record which wheel is installed") == ["ok"], output[-3000:]


def test_a_changed_source_changes_the_wheels_identity(tmp_path, source_copy):
    """What the wheel installs changes its identity: a module's code, a dependency (pyproject.toml)."""
    before = wheel_identity(build_wheel(source_copy, tmp_path / "before"))
    module = source_copy / "exporters" / "accelmon" / "__init__.py"
    original = module.read_text()
    pyproject = (source_copy / "pyproject.toml").read_text()
    try:
        module.write_text(original + "\n# changed\n")
        code = wheel_identity(build_wheel(source_copy, tmp_path / "code"))
        module.write_text(original)
        (source_copy / "pyproject.toml").write_text(pyproject.replace('"PyYAML>=5.4"', '"PyYAML>=6"'))
        dependency = wheel_identity(build_wheel(source_copy, tmp_path / "dependency"))
    finally:
        module.write_text(original)
        (source_copy / "pyproject.toml").write_text(pyproject)
    assert len({before, code, dependency}) == 3


# Issue 65, point 3 (the wheel's part): the controller builds the wheel without network.
def offline(tmp_path: Path) -> dict[str, str]:
    """A controller that reaches no package index: pip reads no config, has no index, no links, a dead proxy."""
    (tmp_path / "no-links").mkdir(exist_ok=True)
    dead = "http://127.0.0.1:9"
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-links"),
            "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead}  # fmt: skip


def test_the_wheel_builds_without_network(tmp_path):
    """With no index reachable the wheel still builds: the build backend is the controller venv's own, pinned
    (before, pip fetched setuptools into an isolated build environment and the build failed offline)."""
    result = deploy(tmp_path, env=offline(tmp_path))
    output = result.stdout + result.stderr
    assert task_results(output, "Build the wheel") == ["ok"], output[-3000:]
    assert task_results(output, "Stop when the controller cannot build the wheel") == ["ok"], output[-3000:]
    assert task_results(output, "Copy the wheel") == ["changed"], output[-3000:]


def test_the_controllers_build_backend_is_the_pinned_one():
    """pip install ".[deploy]" (and so scripts/setup.sh) gives the controller the setuptools [build-system] pins."""
    import tomllib

    deploy_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["deploy"]
    assert f"setuptools=={build_system_setuptools()}" in deploy_extra
    assert "'.[test,deploy,report]'" in (ROOT / "scripts" / "setup.sh").read_text()


# Issue 65, point 5: adding workers as documented, and --check on a host not deployed yet.
ADD_WORKERS = "ansible-playbook -i host.ini ansible/deploy.yaml --limit 'NEW_WORKERS,master'"


@pytest.fixture(scope="module")
def new_worker_check(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The documented command that adds workers, in --check, on an inventory with a deployed worker (an address
    nothing answers on) and a new one: this machine, which has no accelmon (no group, unit, venv or node_exporter).
    One run for the two tests below: a worker's full check-mode deploy is this tier's costliest step (~200 s on
    CI's two cores), and both read the same new worker's run."""
    work = tmp_path_factory.mktemp("new-worker")
    inventory = work / "host.ini"
    inventory.write_text(
        '[master]\n\n[store]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n'
        "[worker]\nold-worker ansible_host=192.0.2.1 ansible_connection=ssh\n"
        f"new-worker ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    command = ADD_WORKERS.replace("host.ini", str(inventory)).replace("NEW_WORKERS", "new-worker").split()
    command = [str(Path(sys.executable).parent / "ansible-playbook"), *command[1:], "--check"]
    command = [part.strip("'") for part in command]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=600, env=controller_env(work),
    )  # fmt: skip
    return work, result


def test_check_mode_works_on_a_host_not_deployed_yet(new_worker_check):
    """--check reports the install and passes on a host not deployed yet, nothing asks systemd about a unit the run
    has not written (before: the stale check and the service tasks failed)."""
    work, result = new_worker_check
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert task_results(output, "Create the group") == ["changed"]
    assert task_results(output, "Ensure accelmon-exporter is enabled and running") == ["skipping"]
    # What --check writes on the controller (the scrape PKI) is in the test's home, not the real one.
    pki = work / "home" / ".accelmon" / "pki"
    assert (pki / "ca.key").is_file() and (pki / "hosts" / "new-worker.crt").is_file()


def test_new_workers_are_deployed_fully_and_no_other_worker_is_touched(new_worker_check):
    """The documented command: the new worker gets the install steps and its configuration; the other is not
    contacted."""
    assert ADD_WORKERS in (ROOT / "docs" / "deploying.md").read_text()
    _, result = new_worker_check
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "old-worker" not in output
    for task in ("Create the group", "Create the user", "Create the virtualenv", "Write the exporter configuration"):
        assert task_results(output, task) == ["changed"], task


MASTER_ROLE = ROOT / "ansible" / "roles" / "accelmon_master"


def render_masters(work: Path, hosts: dict[str, dict[str, Any]], group_vars: dict[str, Any]) -> dict[str, dict]:
    """The master role's compose and Prometheus templates, rendered by Ansible for each master of an inventory: the
    role's defaults at the bottom (group all), the masters' group and host variables over them, as in a deploy."""
    inventory = {
        "all": {
            "vars": yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text()),
            "children": {"master": {"hosts": {name: {"ansible_connection": "local", **own}
                                              for name, own in hosts.items()}, "vars": group_vars}},
        }
    }  # fmt: skip
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    templates = {"compose": "compose.yaml.j2", "prometheus": "prometheus.yml.j2"}
    play = [{"hosts": "master", "gather_facts": False, "vars_files": [str(MASTER_ROLE / "vars" / "main.yml")],
             "tasks": [{"ansible.builtin.template": {"src": str(MASTER_ROLE / "templates" / template),
                                                    "dest": f"{work}/{{{{ inventory_hostname }}}}-{kind}.yml",
                                                    "mode": "0644"}}
                       for kind, template in templates.items()]}]  # fmt: skip
    (work / "play.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"),
         "-e", f"ansible_python_interpreter={sys.executable}", str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=controller_env(work),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    return {
        name: {kind: yaml.safe_load((work / f"{name}-{kind}.yml").read_text()) for kind in templates} for name in hosts
    }


def alertmanager_of(rendered: dict) -> dict:
    return rendered["compose"]["services"]["alertmanager"]


def alerting_targets(rendered: dict) -> list[str]:
    [alertmanagers] = rendered["prometheus"]["alerting"]["alertmanagers"]
    return [target for config in alertmanagers["static_configs"] for target in config["targets"]]


@pytest.mark.parametrize("network", ["accelmon", "host"])
def test_an_ha_pairs_alertmanagers_gossip_and_each_prometheus_sends_to_both(tmp_path, network):
    """Issue 65, point 6: the two Alertmanagers of a pair cluster (gossip on the pair's addresses alone, each the
    other's peer) and each Prometheus sends to both, so that Alertmanager's deduplication notifies once."""
    pair = {"monitor-a": "10.0.0.1", "monitor-b": "10.0.0.2"}
    rendered = render_masters(
        tmp_path,
        {name: {"accelmon_master_alertmanager_cluster_address": address} for name, address in pair.items()},
        {"accelmon_master_replicas": 2, "accelmon_master_alertmanager_enabled": True,
         "accelmon_master_network": network},
    )  # fmt: skip
    local = "127.0.0.1:9093" if network == "host" else "accelmon-alertmanager:9093"
    for name, partner in (("monitor-a", "monitor-b"), ("monitor-b", "monitor-a")):
        service = alertmanager_of(rendered[name])
        flags = service["command"]
        assert f"--cluster.peer={pair[partner]}:9094" in flags
        assert f"--cluster.advertise-address={pair[name]}:9094" in flags
        assert "--cluster.listen-address=" not in flags
        assert alerting_targets(rendered[name]) == [local, f"{pair[partner]}:9093"]
        assert rendered[name]["prometheus"]["alerting"]["alert_relabel_configs"] == [
            {"action": "labeldrop", "regex": "replica"}
        ]
        if network == "host":
            assert f"--cluster.listen-address={pair[name]}:9094" in flags
            # Loopback for this host's Prometheus, the pair's address for the partner's.
            assert {"--web.listen-address=127.0.0.1:9093", f"--web.listen-address={pair[name]}:9093"} <= set(flags)
        else:
            assert "--cluster.listen-address=0.0.0.0:9094" in flags
            # The gossip published on the pair's address alone, never on every interface.
            assert sorted(service["ports"]) == sorted(
                ["127.0.0.1:9093:9093", f"{pair[name]}:9093:9093",
                 f"{pair[name]}:9094:9094/tcp", f"{pair[name]}:9094:9094/udp"]
            )  # fmt: skip


def test_mutual_tls_gossip_is_tcp_alone_with_its_config_mounted(tmp_path):
    pair = {"monitor-a": "10.0.0.1", "monitor-b": "10.0.0.2"}
    rendered = render_masters(
        tmp_path,
        {name: {"accelmon_master_alertmanager_cluster_address": address} for name, address in pair.items()},
        {"accelmon_master_replicas": 2, "accelmon_master_alertmanager_enabled": True,
         "accelmon_master_alertmanager_cluster_tls_ca": "CA", "accelmon_master_alertmanager_cluster_tls_cert": "C",
         "accelmon_master_alertmanager_cluster_tls_key": "K"},
    )  # fmt: skip
    service = alertmanager_of(rendered["monitor-a"])
    assert "--cluster.tls-config=/etc/alertmanager/cluster/tls.yml" in service["command"]
    assert "/opt/accelmon-master/alertmanager/cluster:/etc/alertmanager/cluster:ro,Z" in service["volumes"]
    assert not [port for port in service["ports"] if port.endswith("/udp")]


def test_a_single_alertmanager_keeps_clustering_off(tmp_path):
    """One master, or a pair where one master alone runs Alertmanager (the Molecule store scenario): no gossip, no
    port beyond loopback, and the Prometheus without an Alertmanager sends nowhere."""
    rendered = render_masters(
        tmp_path,
        {"monitor-a": {"accelmon_master_alertmanager_enabled": True}, "monitor-b": {}, "solo": {}},
        {"accelmon_master_replicas": 1, "accelmon_master_shards": 1},
    )
    service = alertmanager_of(rendered["monitor-a"])
    assert "--cluster.listen-address=" in service["command"]
    assert not [flag for flag in service["command"] if flag.startswith("--cluster.peer")]
    assert service["ports"] == ["127.0.0.1:9093:9093"]
    assert alerting_targets(rendered["monitor-a"]) == ["accelmon-alertmanager:9093"]
    assert "alerting" not in rendered["solo"]["prometheus"]
    paired = render_masters(
        tmp_path,
        {"monitor-a": {"accelmon_master_alertmanager_enabled": True}, "monitor-b": {}},
        {"accelmon_master_replicas": 2},
    )
    assert "--cluster.listen-address=" in alertmanager_of(paired["monitor-a"])["command"]
    assert "alerting" not in paired["monitor-b"]["prometheus"]


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_alertmanager = pytest.mark.skipif(
    not ALERTMANAGER, reason="no alertmanager binary (Debian's prometheus-alertmanager)"
)


def start_alertmanager(work: Path, config: str, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    """An Alertmanager on loopback, its own storage under `work`; the caller stops it."""
    from tests.support.processes import free_port, wait_until_serving

    work.mkdir(parents=True, exist_ok=True)
    (work / "alertmanager.yml").write_text(config)
    port = free_port()
    process = subprocess.Popen(
        [str(ALERTMANAGER), f"--config.file={work / 'alertmanager.yml'}", f"--storage.path={work}",
         f"--web.listen-address=127.0.0.1:{port}", *flags],
        stdout=subprocess.DEVNULL, stderr=(work / "log").open("wb"),
    )  # fmt: skip
    try:
        wait_until_serving(port, path="/-/ready")
    except AssertionError:
        process.kill()
        raise
    return process, port


@needs_alertmanager
def test_a_failed_alertmanager_reload_fails_the_play_naming_the_error(tmp_path):
    """The role's reload handler against a real Alertmanager: a file it refuses fails the play with its error (the
    SIGHUP the role sent before was ignored whatever it did); a good one reloads."""
    from tests.support.ansible import run_local_play
    from tests.support.processes import stop

    good = "route: {receiver: default}\nreceivers: [{name: default}]\n"
    process, port = start_alertmanager(tmp_path / "am", good, "--cluster.listen-address=")
    try:
        play = {"tasks": [{"ansible.builtin.include_tasks": str(MASTER_ROLE / "tasks" / "reload-alertmanager.yml")}]}
        url = {"__accelmon_master_alertmanager_local_url": f"http://127.0.0.1:{port}"}
        reloaded = run_local_play(play, url, tmp_path)
        assert reloaded.returncode == 0, reloaded.stdout[-3000:]
        (tmp_path / "am" / "alertmanager.yml").write_text("route: {receiver: nobody}\nreceivers: [{name: default}]\n")
        refused = run_local_play(play, url, tmp_path)
        assert refused.returncode != 0
        assert "Alertmanager did not reload its configuration" in refused.stdout
        assert 'undefined receiver "nobody"' in refused.stdout, refused.stdout[-3000:]
    finally:
        stop(process)


@needs_alertmanager
def test_two_clustered_alertmanagers_notify_an_alert_sent_to_both_once(tmp_path):
    """Two Alertmanagers clustered as the role runs an HA pair's (gossip on their own addresses, each the other's
    peer), each sent the same alert by its Prometheus: the receiver gets one notification."""
    import http.server
    import threading
    import urllib.request

    from tests.support.processes import free_port, stop
    from tests.support.waiting import wait_until

    received: list[bytes] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = (
        "route: {receiver: hook, group_by: [alertname], group_wait: 1s, group_interval: 1m, repeat_interval: 1h}\n"
        f"receivers: [{{name: hook, webhook_configs: [{{url: 'http://127.0.0.1:{server.server_port}/'}}]}}]\n"
    )
    gossip = [free_port(), free_port()]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        ports = []
        for own, peer in ((0, 1), (1, 0)):
            process, port = start_alertmanager(
                tmp_path / f"am{own}", config, f"--cluster.listen-address=127.0.0.1:{gossip[own]}",
                f"--cluster.peer=127.0.0.1:{gossip[peer]}", "--cluster.peer-timeout=2s", "--cluster.settle-timeout=5s",
                "--cluster.gossip-interval=100ms",
            )  # fmt: skip
            processes.append(process)
            ports.append(port)

        def members(port: int) -> int:
            status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/status", timeout=2).read())
            return len(status["cluster"]["peers"]) == 2 and status["cluster"]["status"] == "ready"

        wait_until(lambda: all(members(port) for port in ports), timeout=30, every=0.5, what="a cluster of two")
        alert = json.dumps([{"labels": {"alertname": "AccelmonTest", "node": "n1"}}]).encode()
        for port in ports:  # each Prometheus of the pair sends it to both; once to each is the same to them
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v2/alerts", data=alert, headers={"Content-Type": "application/json"}
            ), timeout=5)  # fmt: skip
        wait_until(lambda: received, timeout=30, every=0.2, what="a notification")
        time.sleep(6)  # past the second's turn (peer timeout 2 s x its position) and the first's gossip
        assert len(received) == 1, [json.loads(body)["alerts"] for body in received]
    finally:
        for process in processes:
            stop(process)
        server.shutdown()
        server.server_close()


# Issue 66, points 3 and 6: Grafana's secret key and TLS, and the master's secret files.
def grafana_of(rendered: dict) -> dict:
    return rendered["compose"]["services"]["grafana"]


def test_grafana_reads_its_secret_key_from_a_file_never_an_argument(tmp_path):
    """The key reaches Grafana as a mounted file (GF_SECURITY_SECRET_KEY__FILE): no command line, no environment
    value holds it."""
    rendered = render_masters(tmp_path, {"monitor-a": {}}, {"accelmon_master_grafana_secret_key": "k" * 32})
    service = grafana_of(rendered["monitor-a"])
    assert service["environment"]["GF_SECURITY_SECRET_KEY__FILE"] == "/run/secrets/grafana_secret_key"
    assert "/opt/accelmon-master/grafana/secret_key:/run/secrets/grafana_secret_key:ro,Z" in service["volumes"]
    assert "GF_SECURITY_SECRET_KEY" not in service["environment"]
    assert "k" * 32 not in json.dumps(rendered)
    # On every interface by default, as documented, in HTTPS (the deploy's certificate: tests/test_grafana_tls.py);
    # plain HTTP only when asked for, with no TLS files mounted.
    assert service["ports"] == ["0.0.0.0:3000:3000"]
    assert service["environment"]["GF_SERVER_PROTOCOL"] == "https"
    plain = render_masters(tmp_path, {"monitor-a": {}}, {"accelmon_master_grafana_plain_http": True})["monitor-a"]
    plain = grafana_of(plain)
    assert "GF_SERVER_PROTOCOL" not in plain["environment"]
    assert not [volume for volume in plain["volumes"] if "/etc/grafana/tls" in volume]


@pytest.mark.parametrize("network", ["accelmon", "host"])
def test_grafana_serves_https_with_its_certificate_and_key_mounted_read_only(tmp_path, network):
    rendered = render_masters(
        tmp_path,
        {"monitor-a": {}},
        {"accelmon_master_grafana_tls_cert": "-----BEGIN CERTIFICATE-----", "accelmon_master_grafana_tls_key": "K",
         "accelmon_master_grafana_listen_address": "127.0.0.1", "accelmon_master_network": network},
    )  # fmt: skip
    service = grafana_of(rendered["monitor-a"])
    environment = service["environment"]
    assert environment["GF_SERVER_PROTOCOL"] == "https"
    assert environment["GF_SERVER_CERT_FILE"] == "/etc/grafana/tls/cert.crt"
    assert environment["GF_SERVER_CERT_KEY"] == "/etc/grafana/tls/key.key"
    assert environment["GF_SECURITY_COOKIE_SECURE"] == "true"
    assert "/opt/accelmon-master/grafana/tls:/etc/grafana/tls:ro,Z" in service["volumes"]
    if network == "host":
        assert environment["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    else:
        assert service["ports"] == ["127.0.0.1:3000:3000"]


def test_grafanas_secret_key_is_generated_once_on_the_controller_never_logged(tmp_path):
    """The role's configuration tasks in --check on this machine, twice, HOME in tmp_path: the key file is made once
    (0600, in a 0700 directory), kept the second time, and its value is in no output. The second run starts at the
    key's tasks (the role imported, so that --start-at-task finds them) and runs all that follow, those that write
    the key for the container among them: 20 s where the whole configuration took 150 s on CI's loaded cores."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.import_role": {"name": "accelmon_master", "tasks_from": "configure.yml"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    home = tmp_path / "home"
    home.mkdir()
    variables = {
        "__accelmon_master_engine": "podman",
        "accelmon_master_dir": str(tmp_path / "master"),
        "accelmon_master_grafana_admin_password": "unused-here-1234",
    }
    outputs, keys = [], []
    for start in ([], ["--start-at-task", "Create the controller's secret directory for the key"]):
        result = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
             "--diff", "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(variables), *start,
             str(tmp_path / "play.yml")],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            env={**os.environ, "HOME": str(home), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1",
                 "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")},
        )  # fmt: skip
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == 0, outputs[-1][-3000:]
        key_file = home / ".accelmon" / "grafana-secret-key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert (home / ".accelmon").stat().st_mode & 0o777 == 0o700
        keys.append(key_file.read_text().strip())
    assert keys[0] == keys[1] and len(keys[0]) >= 32
    assert not [output for output in outputs if keys[0] in output]
    assert "Write Grafana's secret key for the container" in outputs[0]
    assert "Generate the secret key unless it exists" in outputs[1] and "Write Grafana's dashboards" not in outputs[1]


def secret_file_tasks() -> list[dict]:
    """The master role's tasks that write a file holding a secret (no_log): the copies and templates (Grafana's TLS
    files are written by its PKI step, tasks/pki.yml)."""
    tasks = [task for name in ("configure.yml", "pki.yml")
             for task in yaml.safe_load((MASTER_ROLE / "tasks" / name).read_text())]  # fmt: skip
    flat = [inner for task in tasks for inner in task.get("block", [task])]
    return [task for task in flat if task.get("no_log") and ({"ansible.builtin.copy", "ansible.builtin.template"}
                                                             & set(task))]  # fmt: skip


MASTER_UIDS = {"prometheus": 60090, "alertmanager": 60093, "grafana": 60300}


def test_each_secret_file_of_the_master_is_its_services_alone():
    """Each secret the master writes is owned by the user its service runs as (accelmon-prometheus,
    -alertmanager, -grafana: their own uid and gid), read-only, no group or other bit: not by uid or group 65534
    (nobody, nogroup: every `nobody` process of the host), as it was, nor root's group; docs/security.md says the
    same."""
    defaults = yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text())
    assert {service: defaults[f"accelmon_master_{service}_uid"] for service in MASTER_UIDS} == MASTER_UIDS
    written = {}
    for task in secret_file_tasks():
        module = task.get("ansible.builtin.copy") or task["ansible.builtin.template"]
        owner, group, mode = str(module["owner"]), str(module["group"]), str(module["mode"])
        [service] = [s for s in MASTER_UIDS if owner == f"{{{{ accelmon_master_{s}_uid }}}}"] or [owner]
        assert (group, mode) == (owner, "0400") and service in MASTER_UIDS, (task["name"], owner, group, mode)
        written[task["name"]] = service
    assert set(written.values()) == set(MASTER_UIDS) and len(written) >= 8, written
    role = "\n".join(p.read_text() for p in (MASTER_ROLE / "tasks").glob("*.yml"))
    assert not [word for word in ('owner: "65534"', 'group: "65534"', "group: 65534", "owner: 65534") if word in role]
    security = (ROOT / "docs" / "security.md").read_text()
    rows = [
        "| `alertmanager/alertmanager.yml` (receivers' tokens and passwords) | accelmon-alertmanager (60093) | 0400 |",
        "| `grafana/admin_password`, `grafana/secret_key` | accelmon-grafana (60300) | 0400 |",
        "| `grafana/tls/cert.crt`, `key.key` (yours, or the deploy's CA's) | accelmon-grafana (60300) | 0400 |",
    ]
    for row in rows:
        assert row in security, row
    assert "65534:root" not in security and "root:root | 0440" not in security


def test_each_master_container_runs_as_its_own_user(tmp_path):
    """The compose file (docker compose runs it, podman's tasks read it) runs Prometheus, Alertmanager and Grafana
    as their own uid and gid, numbers every engine takes (the images know no such name), the operator's where set;
    before, Prometheus and Alertmanager ran as the images' nobody (65534) and Grafana as 472 in group 0."""
    for name in ("default", "chosen"):
        (tmp_path / name).mkdir()
    default = render_masters(tmp_path / "default", {"m1": {}}, {"accelmon_master_alertmanager_enabled": True})["m1"]
    users = {name: service["user"] for name, service in default["compose"]["services"].items()}
    assert users == {service: f"{uid}:{uid}" for service, uid in MASTER_UIDS.items()}
    chosen = {"accelmon_master_alertmanager_enabled": True, "accelmon_master_prometheus_uid": 2001,
              "accelmon_master_alertmanager_uid": 2002, "accelmon_master_grafana_uid": 2003}  # fmt: skip
    rendered = render_masters(tmp_path / "chosen", {"m1": {}}, chosen)["m1"]
    users = {name: service["user"] for name, service in rendered["compose"]["services"].items()}
    assert users == {"prometheus": "2001:2001", "alertmanager": "2002:2002", "grafana": "2003:2003"}


@pytest.mark.parametrize(("uid", "message"), [(1, "belongs to daemon on this host"), (65534, "not 65534 (nobody)")])
def test_a_services_uid_another_account_holds_stops_the_deploy(tmp_path, uid, message):
    """A uid (or gid) the host already gives another account would let it read Prometheus's secrets: the
    preflight stops before any host changes, naming the account."""
    result = deploy(tmp_path, f"accelmon_master_prometheus_uid={uid}", group="master")
    assert result.returncode != 0
    assert message in result.stdout, result.stdout[-3000:]
    assert "PLAY [Masters]" not in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other uids: root only")
def test_a_master_deployed_before_has_its_data_reowned_once(tmp_path):
    """tasks/own-data.yml with an engine that answers as docker and podman do: the data volume the images' nobody
    owns (a master deployed before) is given to Prometheus's own uid, its contents too, its container stopped
    meanwhile (the containers' task starts it); a second run changes nothing and touches no container. A new volume
    the engine gave the image's nobody as the container first mounted it is re-owned after the start, and the
    container restarted."""
    volume = tmp_path / "volumes" / "prometheus"
    (volume / "wal").mkdir(parents=True)
    (volume / "wal" / "00000001").write_text("samples")

    def own(uid: int) -> set[tuple[int, int]]:
        for path in [volume, *volume.rglob("*")]:
            os.chown(path, uid, uid)
        return {(p.stat().st_uid, p.stat().st_gid) for p in [volume, *volume.rglob("*")]}

    calls = tmp_path / "calls"
    engine = tmp_path / "engine"
    engine.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'case "$*" in "volume inspect --format {{{{ .Mountpoint }}}} accelmon-prometheus-data") echo {volume};;\n'
        '  "volume inspect"*) echo "no such volume" >&2; exit 1;; esac\n'
    )
    engine.chmod(0o755)
    defaults = yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text())
    variables = {**defaults, "__accelmon_master_engine": str(engine), "accelmon_master_grafana_enabled": False}
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))

    def run(*phases: str) -> tuple[str, list[str]]:
        play = [{"hosts": "localhost", "gather_facts": False, "vars_files": [str(MASTER_ROLE / "vars" / "main.yml")],
                 "tasks": [{"ansible.builtin.include_tasks": {"file": str(MASTER_ROLE / "tasks" / "own-data.yml")},
                            "vars": {"__accelmon_master_owning": phase}} for phase in phases]}]  # fmt: skip
        (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
        calls.write_text("")
        result = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.yml'}",
             str(tmp_path / "play.yml")],
            capture_output=True, text=True, cwd=ROOT, timeout=300, env=controller_env(tmp_path),
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:]
        recap = result.stdout.split("PLAY RECAP")[-1]
        return recap, [line for line in calls.read_text().splitlines() if "inspect" not in line]

    assert own(65534) == {(65534, 65534)}
    recap, containers = run("before", "after")
    assert containers == ["stop accelmon-prometheus"] and "changed=2" in recap, (containers, recap)
    assert own(-1) == {(60090, 60090)}  # -1: unchanged, read back
    recap, containers = run("before", "after")
    assert containers == [] and "changed=0" in recap, (containers, recap)
    # A new volume the engine gave the image's owner of /prometheus at the first start.
    own(65534)
    recap, containers = run("after")
    assert containers == ["restart accelmon-prometheus"] and own(-1) == {(60090, 60090)}, containers


def test_the_default_images_are_pinned_by_digest_and_an_archived_one_runs_by_its_tag(tmp_path):
    """Issue 66: Prometheus's, Alertmanager's and Grafana's default images are pinned by digest (a tag can be
    moved), each digest cited in docs/security.md with its sources (Grafana's was a tag alone before); an image
    loaded from an archive runs by its tag, since a saved archive keeps no registry digest (the engine would try to
    pull the digest and fail offline), its sha256 checked instead."""
    defaults = yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text())
    pinned = r"^docker[.]io/(prom/[a-z]+:v|grafana/grafana:)[0-9.]+@sha256:[0-9a-f]{64}$"
    security = (ROOT / "docs" / "security.md").read_text()
    for name in ("accelmon_master_prometheus_image", "accelmon_master_alertmanager_image",
                 "accelmon_master_grafana_image"):  # fmt: skip
        assert re.match(pinned, defaults[name]), defaults[name]
        image, digest = defaults[name].removeprefix("docker.io/").split("@sha256:")
        assert f"`{image}@sha256:{digest[:8]}...`" in security, f"docs/security.md: cite {image}'s digest"
    assert defaults["accelmon_master_grafana_image"].split("@sha256:")[1] in security
    prometheus, alertmanager = (
        defaults["accelmon_master_prometheus_image"],
        defaults["accelmon_master_alertmanager_image"],
    )
    variables = {
        "accelmon_master_dir": str(tmp_path),
        "accelmon_master_alertmanager_enabled": True,
        # Keyed by its tag, as docs/deploying.md's offline recipe saves it.
        "accelmon_master_image_archives": {
            prometheus.split("@")[0]: {"path": "/srv/offline/prometheus.tar", "sha256": "0" * 64}
        },
    }
    render_role_template("accelmon_master", "compose.yaml.j2", tmp_path / "compose.yaml", variables)
    images = {name: service["image"] for name, service in yaml.safe_load((tmp_path / "compose.yaml").read_text())[
        "services"].items()}  # fmt: skip
    assert images["prometheus"] == prometheus.split("@")[0]
    assert images["alertmanager"] == alertmanager
    assert images["grafana"] == defaults["accelmon_master_grafana_image"]  # not archived: by its digest
