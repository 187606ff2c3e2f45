"""Helpers for the scenarios' verifiers (testinfra)."""

import time


def wait_for(check, timeout=90):
    """check() until it answers something true, for at most `timeout` seconds; its last answer, for the assert."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(2)


def scrape_options(host, port):
    """curl's options and URL asking `host`'s exporter on `port` as the masters' Prometheus does (issue 66's
    defaults): https, the certificate checked against the deploy's CA by the host's inventory name (the container's
    name, which its certificate carries), with the scrape password; the connection made to the host's loopback.
    The CA is written into the container once; the PKI is the controller's, in the scenario's directory
    (accelmon_exporter_pki_dir in molecule.yml)."""
    import os
    import shlex
    from pathlib import Path

    pki = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "accelmon-pki"
    ca = "/run/accelmon-verify-ca.crt"
    host.run(f"test -s {ca} || printf '%s' {shlex.quote((pki / 'ca.crt').read_text())} > {ca}")
    password = (pki / "scrape-password").read_text().strip()
    name = host.backend.name
    return f"--cacert {ca} -u prometheus:{password} --connect-to ::127.0.0.1: https://{name}:{port}/metrics"
