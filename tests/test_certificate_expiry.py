"""The end of each certificate a worker serves, served by accelmon-exporter and alerted on (AccelmonCertificateExpiring,
its promtool tests in master/prometheus/tests/alerts-test.yml): the deploy reads each certificate's notAfter on the
controller and writes it in the exporter's config (web.certificates_not_after), and never issues a worker a
certificate that outlives the deploy's CA (tasks/pki_lifetime.yml, the role's vars)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accelmon.cli import parser, settings_from
from accelmon.config import ConfigError
from accelmon.exporter.runtime import Exporter
from tests.support.processes import exporter_env, run_once

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
