"""Issue 66, the upgrade: a fleet on a release before TLS by default is upgraded in batches over hours, and the
masters' Prometheus scrapes each worker as it serves meanwhile, the upgraded ones in HTTPS with the password, the
others by the jobs' plain twins without any credential, with no worker down. Real servers on the loopback: a plain
exporter of the old release (a recording stand-in), accelmon's HTTPS server, Debian's node_exporter both ways, real
Prometheus on the master role's own prometheus.yml and targets, the role's own tasks in Ansible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmon.cli import make_server
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.exporter.webconfig import load_web_config
from tests.support.paths import ROOT
from tests.support.processes import free_port, start_node_exporter, stop
from tests.support.toy import Steady
from tests.support.waiting import wait_until
from tests.test_deploy_scrape_check import pki_task, playbook, web_config

pytestmark = pytest.mark.e2e

ROLES = ROOT / "ansible" / "roles"
# The old release's exposition, as a worker not yet upgraded serves it.
OLD_PAGE = b'accelmon_exporter_build_info{version="0.9.0"} 1\naccelmon_gpu_up{gpu="0",uuid="GPU-old"} 1\n'


class OldExporter(BaseHTTPRequestHandler):
    """A worker's exporter of the release before TLS by default: plain HTTP, no auth. Keeps each request's
    Authorization header (None where there was none): a password must never be sent to it in clear."""

    authorizations: list[str | None] = []

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(OLD_PAGE)))
        self.end_headers()
        self.wfile.write(OLD_PAGE)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three workers on this machine, each two exporters: "old" (both plain HTTP, the previous release), "new" (both
    HTTPS with the deploy's generated certificate and password) and "down" (nothing listens). Their ports, the PKI."""
    work = tmp_path_factory.mktemp("upgrade")
    ports = {(worker, job): free_port() for worker in ("old", "new", "down") for job in ("accelmon", "node")}
    pki = work / "pki"
    made = playbook(work / "pki-run", {w: {"ansible_host": "127.0.0.1"} for w in ("old", "new", "down")},
                    [pki_task(pki)])  # fmt: skip
    assert made.returncode == 0, made.stdout[-3000:]
    password = (pki / "scrape-password").read_text().strip()
    generated = {"prometheus": (pki / "scrape-password.bcrypt").read_text().strip()}
    new_web = web_config(work / "new.yml", pki, "new", generated)
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert node_exporter, "node_exporter not found: install Debian's prometheus-node-exporter (.ci/run does)"

    OldExporter.authorizations = []
    old = ThreadingHTTPServer(("127.0.0.1", ports["old", "accelmon"]), OldExporter)
    threading.Thread(target=old.serve_forever, daemon=True).start()
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    new = make_server(exporter, f"127.0.0.1:{ports['new', 'accelmon']}", load_web_config(str(new_web)), ())
    new.start()
    old_node = subprocess.Popen(
        [node_exporter, "--collector.disable-defaults", "--collector.loadavg",
         f"--web.listen-address=127.0.0.1:{ports['old', 'node']}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    new_node, ports["new", "node"] = start_node_exporter(node_exporter, new_web)
    try:
        for worker in ("old", "new"):
            probe = ["curl", "-sk", "-o", "/dev/null", f"http{'s' if worker == 'new' else ''}://127.0.0.1:"
                     f"{ports[worker, 'node']}/"]  # fmt: skip
            wait_until(
                lambda probe=probe: subprocess.run(probe, check=False).returncode == 0, 30, f"{worker} node_exporter"
            )
        yield {"work": work, "ports": ports, "pki": pki, "password": password}
    finally:
        old.shutdown()
        old.server_close()
        new.stop()
        stop(old_node)
        stop(new_node)


def write_inventory(
    fleet: dict[str, Any], work: Path, workers: tuple[str, ...] = ("old", "new", "down"), moved: dict | None = None
) -> Path:
    """A master of this machine (local connection) and `workers` of the fleet, each by its exporters' ports (or, for
    a (worker, job) in `moved`, another's: whatever answers there now)."""
    ports = {**fleet["ports"], **(moved or {})}
    hosts = {
        worker: {"ansible_host": "127.0.0.1", "accelmon_exporter_listen_address": f":{ports[worker, 'accelmon']}",
                 "accelmon_node_exporter_listen_address": f":{ports[worker, 'node']}"}
        for worker in workers
    }  # fmt: skip
    inventory = {
        "all": {"children": {"master": {"hosts": {"m": {"ansible_connection": "local"}}}, "worker": {"hosts": hosts}}}
    }
    work.mkdir(parents=True, exist_ok=True)
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return work / "hosts.yml"


def run_plays(work: Path, inventory: Path, plays: list[dict[str, Any]], *extra: str) -> str:
    (work / "play.yml").write_text(yaml.safe_dump(plays))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         "-e", f"ansible_python_interpreter={sys.executable}", *extra, str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
             "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


def deploy_targets(fleet: dict[str, Any], work: Path, moved: dict | None = None, **variables: Any) -> dict[str, Any]:
    """The master role's tasks/targets.yml on a master of this machine (its directory in `work`, kept from an earlier
    call), then its prometheus.yml rendered from the role's template with the same variables: what a deploy of the
    masters writes."""
    inventory = write_inventory(fleet, work, moved=moved)
    master_dir = work / "master"
    (master_dir / "prometheus" / "targets").mkdir(parents=True, exist_ok=True)
    settings = {
        "accelmon_master_dir": str(master_dir),
        "accelmon_master_prometheus_scrape_interval": "1s",
        "__accelmon_pki": {"ca": (fleet["pki"] / "ca.crt").read_text(), "password": fleet["password"]},
        **variables,
    }
    template = ROLES / "accelmon_master" / "templates" / "prometheus.yml.j2"
    play = {"hosts": "master", "gather_facts": False, "vars": settings, "tasks": [
        {"ansible.builtin.include_role": {"name": "accelmon_master", "tasks_from": "targets.yml", "public": True}},
        {"ansible.builtin.template": {"src": str(template), "dest": str(master_dir / "prometheus.yml"),
                                      "mode": "0644"}},
    ]}  # fmt: skip
    run_plays(work, inventory, [play])
    targets = {
        path.stem: {entry["labels"]["node"]: entry["targets"] for entry in json.loads(path.read_text())}
        for path in (master_dir / "prometheus" / "targets").glob("*.json")
    }
    record = master_dir / "prometheus" / "tls-workers.json"
    return {"dir": master_dir, "targets": targets, "config": (master_dir / "prometheus.yml").read_text(),
            "tls": json.loads(record.read_text()) if record.exists() else None}  # fmt: skip


def test_each_deploy_of_the_masters_finds_the_workers_still_serving_plain_http(fleet, tmp_path):
    """The old worker's two exporters, and they alone, are in the plain twins' targets; every worker stays in the
    HTTPS jobs' (an upgraded one is scraped there as soon as it serves HTTPS; one down is down either way)."""
    deployed = deploy_targets(fleet, tmp_path)
    ports = fleet["ports"]
    every = {job: {w: [f"127.0.0.1:{ports[w, job]}"] for w in ("old", "new", "down")} for job in ("accelmon", "node")}
    assert deployed["targets"] == {
        "accelmon": every["accelmon"], "node": every["node"],
        "accelmon-plain": {"old": every["accelmon"]["old"]}, "node-plain": {"old": every["node"]["old"]},
    }  # fmt: skip
    # The probe sent no password: the old exporter saw requests without Authorization only.
    assert OldExporter.authorizations and set(OldExporter.authorizations) == {None}
    # The master remembers the workers it saw serving TLS.
    assert deployed["tls"] == {"accelmon": ["new"], "node": ["new"]}


def test_a_worker_once_seen_serving_tls_is_never_taken_as_plain_again(fleet, tmp_path):
    """Whoever holds an upgraded worker's port while its exporter restarts (a user's process bound to it) and
    answers plain HTTP cannot bring it back to a plain twin, with their metrics and AccelmonExporterDown silenced: the
    master saw it serving TLS and does not ask it again. A worker never seen so (the release before) still may be."""
    first = deploy_targets(fleet, tmp_path)
    assert set(first["targets"]["accelmon-plain"]) == {"old"}
    # "new"'s ports now answered by a plain server (the old worker's here), as a squatter's would.
    squatted = {("new", "accelmon"): fleet["ports"]["old", "accelmon"], ("new", "node"): fleet["ports"]["old", "node"]}
    second = deploy_targets(fleet, tmp_path, moved=squatted)
    assert set(second["targets"]["accelmon-plain"]) == {"old"} and set(second["targets"]["node-plain"]) == {"old"}
    assert second["tls"] == {"accelmon": ["new"], "node": ["new"]}
    # A master that never saw it (no record): the plain answer is taken, as for a worker of the release before.
    (tmp_path / "master" / "prometheus" / "tls-workers.json").unlink()
    third = deploy_targets(fleet, tmp_path, moved=squatted)
    assert set(third["targets"]["accelmon-plain"]) == {"old", "new"}


def test_plain_http_scraping_turned_off_or_asked_for_has_no_plain_twin(fleet, tmp_path):
    """accelmon_master_scrape_plain_workers: false leaves a plain worker down until upgraded; a fleet on plain HTTP
    by choice (accelmon_master_scrape_plain_http) is scraped in plain HTTP by the jobs themselves."""
    for variables in ({"accelmon_master_scrape_plain_workers": False}, {"accelmon_master_scrape_plain_http": True}):
        deployed = deploy_targets(fleet, tmp_path / next(iter(variables)), **variables)
        assert set(deployed["targets"]) == {"accelmon", "node"}, variables
        jobs = [job["job_name"] for job in yaml.safe_load(deployed["config"])["scrape_configs"]]
        assert jobs == ["accelmon", "node", "prometheus"], variables


def query(base: str, expression: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expression)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def test_prometheus_scrapes_a_half_upgraded_fleet_with_no_worker_down_and_no_password_in_clear(fleet, tmp_path):
    """Real Prometheus on the role's prometheus.yml and targets: the old worker answers its plain twins, the new one
    the HTTPS jobs; AccelmonExporterDown's expression names the down worker alone; the series of both carry
    job="accelmon" and no scheme label (one series across the upgrade); the old worker never got a password."""
    deployed = deploy_targets(fleet, tmp_path)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name in ("exporter-ca.crt", "node-exporter-ca.crt"):
        (secrets / name).write_text((fleet["pki"] / "ca.crt").read_text())
    for name in ("exporter-password", "node-exporter-password"):
        (secrets / name).write_text(fleet["password"])
    config = yaml.safe_load(
        deployed["config"]
        .replace("/etc/prometheus/secrets", str(secrets))
        .replace("/etc/prometheus/targets", str(deployed["dir"] / "prometheus" / "targets"))
    )
    config["rule_files"] = []
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    binary = shutil.which("prometheus")
    assert binary, "scripts/setup.sh unpacks prometheus into .tools/"
    port = free_port()
    prometheus = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ups() -> dict[tuple[str, str, str], float]:
            try:
                found = query(base, 'up{job=~"accelmon|node"}')
            except OSError:
                return {}
            return {(s["metric"]["job"], s["metric"]["node"], s["metric"].get("scheme", "https")): float(s["value"][1])
                    for s in found}  # fmt: skip

        expected = {
            (job, worker, scheme): value
            for job in ("accelmon", "node")
            for (worker, scheme), value in {("old", "https"): 0, ("old", "http"): 1, ("new", "https"): 1,
                                            ("down", "https"): 0}.items()
        }  # fmt: skip
        wait_until(lambda: ups() == expected, timeout=120, every=1, what=f"every target scraped once: {ups()}")
        down = query(base, 'max without (scheme) (up{job="accelmon"}) == 0')
        assert [s["metric"]["node"] for s in down] == ["down"]
        assert len(query(base, 'up{job="accelmon"} == 1')) == 2  # the Fleet board's "Nodes exporting"
        # Scraped series: the job's labels, no scheme, from both workers.
        assert {s["metric"]["node"] for s in query(base, '{__name__=~"accelmon_.+", job="accelmon"}')} == {"old", "new"}
        assert query(base, '{__name__=~"accelmon_.+|node_.+", scheme!=""}') == []
        assert {s["metric"]["node"] for s in query(base, 'node_load1{job="node"}')} == {"old", "new"}
        # What the deploy of the master then warns of (tasks/main.yml): the down worker alone, with Prometheus's error;
        # the old one, down to the HTTPS job but scraped by the plain twin, is not.
        script = ROLES / "accelmon_master" / "files" / "unscraped_workers.py"
        read = subprocess.run([sys.executable, "-c", script.read_text(), base, "30"], capture_output=True, text=True,
                              timeout=60, check=True)  # fmt: skip
        unscraped = json.loads(read.stdout)
        assert unscraped["pending"] == 0
        assert [line.split(":")[0] for line in unscraped["down"]] == ["accelmon on down", "node on down"], unscraped
        assert all("connection refused" in line for line in unscraped["down"]), unscraped
    finally:
        stop(prometheus)
    assert OldExporter.authorizations and set(OldExporter.authorizations) == {None}


@pytest.mark.parametrize(
    ("workers", "stage", "first"),
    [(("old", "new", "down"), "both", True), (("new", "down"), "both", False), (("old", "new"), "after", False)],
)
def test_the_masters_are_deployed_before_the_workers_only_where_some_still_serve_plain_http(
    fleet, tmp_path, workers, stage, first
):
    """deploy.yaml's play before the workers', as written there, its include of the whole master role replaced by a
    marker: it runs where a worker still serves plain HTTP, not on a fleet already upgraded or new, nor in
    deploy_fleet.py's last masters stage (accelmon_deploy_masters_stage=after), which the Masters play does."""
    plays = yaml.safe_load((ROOT / "ansible" / "deploy.yaml").read_text())
    (play,) = [p for p in plays if p["name"] == "Masters, before workers leave plain HTTP"]
    (deploy,) = [t for t in play["tasks"] if t.get("ansible.builtin.include_role", {}).get("tasks_from") is None
                 and "ansible.builtin.include_role" in t]  # fmt: skip
    assert deploy["ansible.builtin.include_role"] == {"name": "accelmon_master"}
    deploy.pop("ansible.builtin.include_role")
    deploy["ansible.builtin.debug"] = {"msg": "MASTER ROLE DEPLOYED FIRST"}
    inventory = write_inventory(fleet, tmp_path, workers)
    output = run_plays(tmp_path, inventory, [play], "-e", f"accelmon_deploy_masters_stage={stage}")
    assert ("MASTER ROLE DEPLOYED FIRST" in output) == first, output[-3000:]
