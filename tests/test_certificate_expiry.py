"""The end of each certificate a worker serves, served by accelmon-exporter and alerted on (AccelmonCertificateExpiring,
its promtool tests in master/prometheus/tests/alerts-test.yml): the deploy reads each certificate's notAfter on the
controller and writes it in the exporter's config (web.certificates_not_after), and never issues a worker a
certificate that outlives the deploy's CA (tasks/pki_lifetime.yml, the role's vars)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmon.cli import parser, settings_from
from accelmon.config import ConfigError
from accelmon.exporter.runtime import Exporter
from tests.support.processes import exporter_env, run_once
from tests.test_scrape_pki import pki_tasks, run_play

GAUGE = "accelmon_exporter_tls_certificate_expiry_timestamp_seconds"
ENDS = {"accelmon-exporter": 1893456000, "node_exporter": 1861920000}


def settings(tmp_path: Path, text: str):
    config = tmp_path / "exporter.yml"
    config.write_text(text)
    return settings_from(parser().parse_args(["--config", str(config)]))


def served(text: str) -> dict[str, float]:
    return {
        line.split('service="')[1].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(GAUGE + "{")
    }


def test_the_exporter_serves_each_certificates_end_from_its_config(tmp_path):
    chosen = settings(tmp_path, yaml.safe_dump({"web": {"certificates_not_after": ENDS}}))
    assert chosen.certificates_not_after == {"accelmon-exporter": 1893456000.0, "node_exporter": 1861920000.0}
    text = Exporter([], certificates_not_after=chosen.certificates_not_after).exposition().decode()
    assert served(text) == ENDS
    assert f"# TYPE {GAUGE} gauge" in text
    # Plain HTTP: the deploy writes no end, and no series is served.
    plain = settings(tmp_path, "web:\n  listen_address: ':19470'\n")
    assert plain.certificates_not_after == {}
    assert GAUGE not in Exporter([], certificates_not_after=plain.certificates_not_after).exposition().decode()


def test_accelmon_exporter_serves_the_ends_as_a_user_runs_it(tmp_path):
    """The command line hands the config's ends to what /metrics serves (here --once, the same exposition)."""
    config = tmp_path / "exporter.yml"
    config.write_text(yaml.safe_dump({"web": {"certificates_not_after": {"node_exporter": 1861920000}}}))
    result = run_once(["--config", str(config)], exporter_env(None, None))
    assert served(result.stdout) == {"node_exporter": 1861920000}, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("ends", "message"),
    [
        ({"grafana": 1893456000}, "web.certificates_not_after: unknown key(s) grafana"),
        ({"node_exporter": "2030-01-01"}, "web.certificates_not_after.node_exporter: expected the certificate's end"),
        ({"node_exporter": True}, "web.certificates_not_after.node_exporter: expected"),
        ({"accelmon-exporter": -5}, "web.certificates_not_after.accelmon-exporter: expected"),
        ({"accelmon-exporter": float("nan")}, "web.certificates_not_after.accelmon-exporter: expected"),
        ({"accelmon-exporter": float("inf")}, "web.certificates_not_after.accelmon-exporter: expected"),
        ({"accelmon-exporter": 10**400}, "web.certificates_not_after.accelmon-exporter: expected"),
        ([1893456000], "web.certificates_not_after: expected a mapping"),
    ],
)
def test_a_bad_certificate_end_is_refused_with_the_setting_named(tmp_path, ends, message):
    with pytest.raises(ConfigError) as error:
        settings(tmp_path, yaml.safe_dump({"web": {"certificates_not_after": ends}}))
    assert message in str(error.value)


# The deploy as the role's tasks/main.yml runs it: its preflight (which renders the exporter's configuration and
# checks it on the controller), then its pki.yml (tests/test_scrape_pki.py); the configuration then written out.
WORKER = {"gpu-1": {"ansible_host": "127.0.0.1"}}


def deploy_pki(work: Path, *flags: str, passes: bool = True, **variables: Any) -> str:
    tasks = [
        {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "preflight.yml", "public": True}},
        *pki_tasks(__accelmon_exporter_pki_node_exporter=True),
        {"ansible.builtin.copy": {"content": "{{ __accelmon_exporter_config }}", "mode": "0600",
                                  "dest": "{{ playbook_dir }}/{{ inventory_hostname }}-exporter.yml"},
         "delegate_to": "localhost", "check_mode": False},
    ]  # fmt: skip
    variables = {"accelmon_exporter_allowed_clients": ["192.0.2.9"], **variables}  # no master group here
    return run_play(work, tasks, variables, *flags, passes=passes, workers=WORKER)


def not_after(path: Path) -> int:
    x509 = pytest.importorskip("cryptography.x509")
    return int(x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp())


def rendered(work: Path) -> dict[str, Any]:
    return yaml.safe_load((work / "gpu-1-exporter.yml").read_text())


@pytest.mark.e2e  # ansible-playbook: the controller's, not the workers' Python 3.9
def test_the_deploy_writes_each_served_certificates_end_in_the_exporters_config(tmp_path):
    """--check first (the controller's PKI is made even then), then a real run: the configuration names the end of
    accelmon-exporter's and node_exporter's certificates as the files on the controller say, and the exporter's
    own reader takes it."""
    pki = tmp_path / "home" / ".accelmon" / "pki"
    deploy_pki(tmp_path, "--check")
    ends = {"accelmon-exporter": not_after(pki / "hosts" / "gpu-1.crt"),
            "node_exporter": not_after(pki / "node-exporter" / "gpu-1.crt")}  # fmt: skip
    assert rendered(tmp_path)["web"]["certificates_not_after"] == ends
    deploy_pki(tmp_path)
    config = rendered(tmp_path)
    assert config["web"] == {"listen_address": ":19470", "allowed_clients": ["192.0.2.9", "127.0.0.1"],
                             "certificates_not_after": ends}  # fmt: skip
    assert 824 * 86400 < ends["node_exporter"] - time.time() <= 825 * 86400
    (tmp_path / "exporter.yml").write_text(yaml.safe_dump(config))
    assert settings(tmp_path, yaml.safe_dump(config)).certificates_not_after == ends


@pytest.mark.e2e  # ansible-playbook: the controller's, not the workers' Python 3.9
def test_plain_http_writes_no_end_and_the_operators_certificate_its_own(tmp_path):
    deploy_pki(tmp_path, accelmon_exporter_plain_http=True)
    assert "certificates_not_after" not in rendered(tmp_path)["web"]
    # The operator's certificate (its chain's earliest end), node_exporter still on plain HTTP.
    own, chain = make_certificate(tmp_path, "own", 400), make_certificate(tmp_path, "chain", 200)
    given = {"accelmon_exporter_tls_cert": own.read_text() + chain.read_text(),
             "accelmon_exporter_tls_key": (tmp_path / "own.key").read_text()}  # fmt: skip
    deploy_pki(tmp_path, accelmon_exporter_plain_http=True, **given)
    assert rendered(tmp_path)["web"]["certificates_not_after"] == {"accelmon-exporter": not_after(chain)}


def make_certificate(work: Path, name: str, days: int) -> Path:
    path = work / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(work / f"{name}.key"), "-out", str(path), "-days", str(days),
                    "-subj", f"/CN={name}"], check=True, capture_output=True)  # fmt: skip
    return path


def shorten_the_ca(work: Path, life: str) -> None:
    """The controller's CA signed again with its own key (its identifiers the same: its certificates stay current),
    ending after `life`, as it is in its last years."""
    pki = str(work / "home" / ".accelmon" / "pki")
    tasks = [
        {"community.crypto.openssl_csr_pipe": {"privatekey_path": f"{pki}/ca.key", "common_name": "accelmon scrape CA",
            "basic_constraints": ["CA:TRUE", "pathlen:0"], "basic_constraints_critical": True,
            "key_usage": ["keyCertSign", "cRLSign"], "key_usage_critical": True, "use_common_name_for_san": False},
         "register": "csr", "delegate_to": "localhost", "run_once": True},
        {"community.crypto.x509_certificate": {"path": f"{pki}/ca.crt", "csr_content": "{{ csr.csr }}",
            "privatekey_path": f"{pki}/ca.key", "provider": "selfsigned", "selfsigned_not_after": life,
            "force": True, "mode": "0600"}, "delegate_to": "localhost", "run_once": True},
    ]  # fmt: skip
    run_play(work, tasks, {}, workers=WORKER)


@pytest.mark.e2e  # ansible-playbook: the controller's, not the workers' Python 3.9
def test_no_certificate_is_signed_past_its_cas_end_and_the_cas_end_is_warned(tmp_path):
    """The CA with 100 days left: a worker's certificates signed now end no later than the CA (before: 825 days, two
    years past it), the play warns that the CA must be replaced and how, and the exporter is told the CA's end for
    a certificate signed before (which still claims 825 days). With less than a day left nothing is signed."""
    pki = tmp_path / "home" / ".accelmon" / "pki"
    deploy_pki(tmp_path)
    assert "[WARNING] the scrape CA" not in deploy_pki(tmp_path)  # ten years left: nothing said
    shorten_the_ca(tmp_path, "+100d")
    (pki / "hosts" / "gpu-1.crt").unlink()  # re-issued (a new worker, or one within 90 days of its end)
    output = " ".join(deploy_pki(tmp_path).split())
    ca_end = not_after(pki / "ca.crt")
    assert ca_end - 86400 < not_after(pki / "hosts" / "gpu-1.crt") <= ca_end
    assert not_after(pki / "node-exporter" / "gpu-1.crt") > ca_end + 700 * 86400  # signed before the CA shortened
    assert "[WARNING] the scrape CA" in output and "expires in 100.0 days" in output
    assert "with -e accelmon_exporter_pki_rotate=true" in output
    assert rendered(tmp_path)["web"]["certificates_not_after"] == {
        "accelmon-exporter": not_after(pki / "hosts" / "gpu-1.crt"), "node_exporter": ca_end}  # fmt: skip
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(pki / "ca.crt"), str(pki / "hosts" / "gpu-1.crt")],
                              capture_output=True, text=True)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # In the CA's last 90 days, a certificate capped at its end cannot be signed for longer: the next deploy keeps it
    # (before: re-signed at every deploy, every worker off the fast path and its exporters restarted each time).
    shorten_the_ca(tmp_path, "+60d")
    (pki / "hosts" / "gpu-1.crt").unlink()
    deploy_pki(tmp_path)
    signed = (pki / "hosts" / "gpu-1.crt").read_bytes()
    assert not_after(pki / "hosts" / "gpu-1.crt") < time.time() + 60 * 86400
    deploy_pki(tmp_path)
    assert (pki / "hosts" / "gpu-1.crt").read_bytes() == signed
    shorten_the_ca(tmp_path, "+12h")
    (pki / "hosts" / "gpu-1.crt").unlink()
    output = " ".join(deploy_pki(tmp_path, passes=False).split())
    assert "ends within a day: no certificate is signed from it" in output
    assert not (pki / "hosts" / "gpu-1.crt").exists()
