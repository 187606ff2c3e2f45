"""How many GPUs one master holds: a Prometheus with the master role's config and rules scraping N simulated
workers, N growing, and what it costs at each step.

Each simulated worker serves what a real one does: the exposition of accelmon-exporter over 8 fake H100s (GPM
profiling on) and a DGX H100's 12 RDMA devices (8 compute HCAs PXB to their GPUs, 4 storage ports), and a
node_exporter's (its per-CPU series copied to a GPU node's 192 CPUs),
both recorded from the real programs at the start of the run; at every scrape the values move (gauges by a few
percent, counters by increments; what was recorded at zero, as a healthy node's error counters and flags are,
stays zero, and states, limits and error counters stay as recorded, so the only faults are the recording's own;
--faults lets them move too on a share of the workers, every part of their GPUs' paths at fault: `--faults 0.05` a
bad day, `--faults` alone the whole fleet, the worst one), so the TSDB compresses what it would in production.
The bodies are rendered once and then served from memory (8 value sets, each repeating every 40 scrapes): the simulator
costs little beside Prometheus, which it measures. Each worker
also serves the jobs holding its GPUs (`accelmon_gpu_job_info`: two-node jobs of 8 GPUs, about one job per
worker, 1,250 at 10,000 GPUs), so the live job rules (accelmon-live-jobs.yml) join and judge real jobs: the fake
driver's GPUs differ by up to 70 % in power, so every job has stragglers pending, the rules' costliest case. One
HTTP server on loopback serves all the workers, one path each (the targets' `__metrics_path__`), labelled `node`
and `instance` as the role's targets are.

Prometheus runs the role's rendered prometheus.yml (scrape and rule interval: the role's default, 15 s) and every
rule file of master/prometheus/rules (one shard: the fleet-wide rules too). At each step, after the new targets
have been scraped a few times, it prints: active series, samples ingested per second, Prometheus's peak RSS and
CPU (from /proc, over the window), the slowest rule group's evaluation time, and the latency of every panel query
of the Fleet, Health and Job dashboards (Job for one job) as a range query of 720 steps, the points Grafana asks
for over the dashboard's 6 h at a 30 s step (the TSDB holds only the run's minutes, so the range is those minutes
cut in 720 steps: as many points per series as over 6 h, fewer raw samples decoded). It ends with a straight-line
extrapolation to 1,250 nodes x 8 GPUs = 10,000 GPUs.

With --store, the master also remote-writes everything into a VictoriaMetrics started with the accelmon_store
role's rendered unit (as the HA pairs and shards of "Scaling out" do), and each step adds the store's figures:
active series, samples/s received, RSS and CPU, bytes per stored sample on disk (what its parts hold after the
run's minutes: before the background merges of a long run, so an upper bound) and the slowest panel query asked
of the store; the extrapolation then sizes the store too.

Run: .venv/bin/python -m bench.master_capacity [--nodes 25,50,100,200] [--settle 75] [--window 60] [--store]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
from tests.support.ansible import exec_start, render_role_template  # noqa: E402
from tests.support.dashboards import concrete, panel_queries  # noqa: E402
from tests.support.fakenvml import build_fake_nvml  # noqa: E402
from tests.support.infiniband_tree import add_device, pci_link, write  # noqa: E402
from tests.support.jobs_tree import nvidia_procfs  # noqa: E402
from tests.support.processes import cpu_seconds, free_port  # noqa: E402
from tests.support.rules import load_renderer  # noqa: E402

GPUS_PER_NODE = 8
FLEET_GPUS = 10_000
COUNTER = re.compile(r"(_total|_count|_sum|_bucket|_seconds_total)(\{|$)")
# What a healthy node keeps still (issue 68, point 10): states, flags, identities and limits (a port's state, a link's
# width and generation, a rate, a saturated counter's flag: wandering a few percent, 4 read as "not ACTIVE" and a
# width as narrower than its maximum), and the error and congestion counters (growing, every port "erring"). With
# them moving, every GPU of the simulated fleet had 5 path faults and every job's alerts pended: --faults keeps that
# fleet in trouble, for the cost of one.
STEADY = re.compile(
    r"^\w+?(_info|_id|_state|_up|_active|_saturated|_max|_width|_generation|_rate_bytes_per_second"
    r"|_transfers_per_second|_path_bandwidth_bytes_per_second|_limit_\w+)(\{|$)"
)
QUIET_COUNTER = re.compile(
    r"^accelmon_\w*(error|discard|downed|recovery|overrun|wait|hw_events|xid|ecc|remap)\w*_total(\{|$)"
)


def fetch(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def stop(server: subprocess.Popen) -> None:
    """Ends a server the run started: a Prometheus writing out millions of series may take minutes to stop
    cleanly on a loaded machine, and one left behind holds both cores (after the second --faults run it did)."""
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def wait_serving(url: str, seconds: float = 60) -> bytes:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fetch(url)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def with_cpus(text: str, cpus: int) -> str:
    """node_exporter's exposition as on a host with `cpus` CPUs: the per-CPU series of CPU 0, once per CPU."""
    lines = []
    for line in text.splitlines():
        if 'cpu="0"' in line:
            lines.extend(line.replace('cpu="0"', f'cpu="{cpu}"') for cpu in range(cpus))
        elif not re.search(r'cpu="[0-9]+"', line):
            lines.append(line)
    return "\n".join(lines) + "\n"


# A DGX H100's RDMA devices (issue 68, point 8): 8 compute HCAs, each PXB to its GPU (a top PCIe switch above a
# leaf for the GPU and one for the HCA), and two dual-port storage/in-band ConnectX-7 cards, 12 devices in all, in
# the order of their mlx5 names (tests/support/pci_tree.py's dgx_h100, with every counter file a real mlx5 has).
DGX_H100_COMPUTE = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
DGX_H100_STORAGE = (("mlx5_1", "mlx5_2"), ("mlx5_7", "mlx5_8"))


def dgx_h100_rdma(sysfs: Path) -> None:
    """The 12 RDMA devices and the GPUs' PCI places (the fake driver's bus ids, tests/support/jobs_tree.bus_id)."""
    for index, name in enumerate(DGX_H100_COMPUTE):
        bus = 0x18 + index * 0x10  # the GPU's own bus: its leaf's downstream port is on bus - 1
        numa, top = index // 4, f"pci0000:{bus - 8:02x}/0000:{bus - 8:02x}:01.0/0000:{bus - 7:02x}:00.0"
        gpu = Path(top, f"0000:{bus - 6:02x}:00.0", f"0000:{bus - 5:02x}:00.0", f"0000:{bus - 1:02x}:00.0")
        write(sysfs / "devices" / gpu / f"0000:{bus:02x}:00.0" / "numa_node", str(numa))
        pci_link(sysfs, sysfs / "devices" / gpu / f"0000:{bus:02x}:00.0")
        hca = f"{top}/0000:{bus - 6:02x}:01.0/0000:{bus + 2:02x}:00.0/0000:{bus + 3:02x}:00.0"
        add_device(sysfs, name, {1: {"base": 10 + index}}, pci_address=f"0000:{bus + 4:02x}:00.0", numa_node=numa,
                   root=hca)  # fmt: skip
    for numa, names in enumerate(DGX_H100_STORAGE):
        bus = 0x0F + 0x80 * numa
        port = {"rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet"}
        for function, name in enumerate(names):
            add_device(sysfs, name, {1: {"base": 20 + function, **port}}, pci_address=f"0000:{bus:02x}:00.{function}",
                       numa_node=numa, root=f"pci0000:{bus - 1:02x}/0000:{bus - 1:02x}:01.0")  # fmt: skip


def record_bodies(work: Path, node_cpus: int) -> dict[str, str]:
    """One scrape of accelmon-exporter (8 fake H100s, GPM, a DGX H100's 12 RDMA devices) and of node_exporter."""
    fake_dir = build_fake_nvml(work / "fake").parent
    nvml = work / "nvml.conf"
    nvml.write_text("gpus 8\nprofile h100\n" + "".join(f"gpm {i}\n" for i in range(GPUS_PER_NODE)))
    sysfs = work / "sys"
    dgx_h100_rdma(sysfs)
    procfs = nvidia_procfs(work / "proc", gpus=GPUS_PER_NODE)
    for switch in range(4):  # a DGX H100's four NVSwitches: each GPU's point-to-point rails are served too
        (procfs / "driver" / "nvidia-nvswitch" / "devices" / f"0000:{0x05 + switch:02x}:00.0").mkdir(parents=True)
    port, node_port = free_port(), free_port()
    settings = work / "accelmon.yml"
    settings.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": f"127.0.0.1:{port}"},
                "paths": {"sysfs": str(sysfs), "procfs": str(procfs)},
                "collectors": {
                    "nvml": {"enabled": True},
                    "infiniband": {"enabled": True},
                    "profiling": {"enabled": True, "backend": "gpm"},
                    "neuron": {"enabled": False},
                },
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporters"), "LD_LIBRARY_PATH": str(fake_dir),
           "FAKE_NVML_CONFIG": str(nvml)}  # fmt: skip
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert node_exporter, "setup.sh unpacks node_exporter into .tools/usr/bin"
    processes = [
        subprocess.Popen([sys.executable, "-m", "accelmon", "--config", str(settings)], env=env,
                         stderr=subprocess.DEVNULL),
        subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{node_port}"], stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    try:
        wait_serving(f"http://127.0.0.1:{port}/metrics")
        time.sleep(4)  # past the first samples of every collector
        return {
            "accelmon": fetch(f"http://127.0.0.1:{port}/metrics").decode(),
            "node": with_cpus(wait_serving(f"http://127.0.0.1:{node_port}/metrics").decode(), node_cpus),
        }
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)


class MovingBody:
    """An exposition whose sample values move at every rendering, differently for each worker."""

    def __init__(self, text: str, faults: bool = False) -> None:
        self.comments = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        self.samples: list[tuple[str, float, bool, bool]] = []
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                base = float(value)
                still = not faults and bool(STEADY.match(series) or QUIET_COUNTER.match(series))
                self.samples.append((series, base if math.isfinite(base) else 0.0, bool(COUNTER.search(series)), still))

    def render(self, worker: int, scrape: int) -> bytes:
        rng = random.Random(worker * 1_000_003 + scrape)
        lines = [self.comments]
        for series, base, counter, still in self.samples:
            if not base:  # zero stays zero: a healthy fleet's error counters and flags (XIDs, ECC, remaps, lost)
                value = 0.0
            elif still:  # a state, a limit, an error counter of a healthy node: as recorded
                value = base
            elif counter:  # grows, by a worker-specific amount per scrape
                value = base + (abs(base) * 0.001 + 1) * scrape * (1 + worker % 7)
            else:  # wanders a few percent around its recorded value
                value = base * (1 + 0.05 * (rng.random() - 0.5))
            lines.append(f"{series} {value:.6g}\n")
        return "".join(lines).encode()


class ExporterBody(MovingBody):
    """accelmon-exporter's exposition, with the jobs holding each worker's GPUs (`accelmon_gpu_job_info`): worker
    n's GPUs 0-3 run job n, its GPUs 4-7 job n + 1, so every job spans two nodes with 8 GPUs (the first and the
    last have 4) and a fleet of N workers runs about N jobs: 1,250 at 10,000 GPUs. The live job rules join them."""

    def __init__(self, text: str, faults: bool = False) -> None:
        super().__init__(text, faults)
        self.uuids = dict(re.findall(r'accelmon_gpu_up\{gpu="(\d+)",uuid="([^"]+)"\}', text))
        assert len(self.uuids) == GPUS_PER_NODE, self.uuids

    def jobs(self, worker: int) -> bytes:
        lines = [
            f'accelmon_gpu_job_info{{account="a{worker % 16}",gpu="{gpu}",job_id="{worker + int(gpu) // 4}",'
            f'user="u{worker % 64}",uuid="{uuid}"}} 1\n'
            for gpu, uuid in sorted(self.uuids.items())
        ]
        header = "# HELP accelmon_gpu_job_info Which job holds the GPU.\n# TYPE accelmon_gpu_job_info gauge\n"
        return (header + "".join(lines)).encode()


# Served from memory, so that the simulator is not what limits a large fleet (rendering every body in Python at
# every scrape took this machine's cores at about 1,000 workers): workers share one of VARIANTS value sets, and
# each set's bodies repeat every CYCLE scrapes (10 minutes at 15 s). The values still move at every scrape, as
# the TSDB compresses them in production; a counter drops back at the cycle's end, a reset rate() handles.
VARIANTS = 8
CYCLE = 40


class Fleet(ThreadingHTTPServer):
    """Serves /w<index>/<job> for every simulated worker."""

    daemon_threads = True

    def __init__(self, bodies: dict[str, str], faults: float = 0.0) -> None:
        self.bodies = {
            (job, troubled): (ExporterBody if job == "accelmon" else MovingBody)(text, troubled)
            for job, text in bodies.items()
            for troubled in ((False, True) if faults else (False,))
        }
        self.faults = faults  # the share of the workers in trouble
        self.scrapes: dict[tuple[int, str], int] = {}
        self.rendered: dict[tuple[str, int, int], bytes] = {}
        self.jobs: dict[int, bytes] = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), FleetHandler)

    def in_trouble(self, worker: int) -> bool:
        """The workers at which worker x share passes a whole number, the first among them: every step's first
        workers hold their share, rounded up (one in round(1 / share) was every worker for any share over 2/3)."""
        return math.floor(worker * self.faults) != math.floor((worker - 1) * self.faults)

    def body(self, worker: int, job: str, scrape: int) -> bytes:
        served = self.bodies[job, self.in_trouble(worker)]
        key = (job, self.in_trouble(worker), worker % VARIANTS, scrape % CYCLE)
        values = self.rendered.get(key)
        if values is None:  # the first cycle renders, each body once; a race renders one twice, harmlessly
            values = self.rendered[key] = served.render(key[2], key[3] + 1)
        if not isinstance(served, ExporterBody):
            return values
        jobs = self.jobs.get(worker)
        if jobs is None:
            jobs = self.jobs[worker] = served.jobs(worker)
        return values + jobs


class FleetHandler(BaseHTTPRequestHandler):
    server: Fleet

    def do_GET(self) -> None:
        _, worker, job = self.path.split("/")
        key = (int(worker.removeprefix("w")), job)
        with self.server.lock:
            scrape = self.server.scrapes[key] = self.server.scrapes.get(key, 0) + 1
        body = self.server.body(key[0], job, scrape)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def write_targets(directory: Path, fleet_port: int, nodes: int) -> None:
    """The role's target files (targets.json.j2's shape) for `nodes` workers, written atomically."""
    for job in ("accelmon", "node"):
        groups = [
            {"targets": [f"127.0.0.1:{fleet_port}"],
             "labels": {"node": f"gpu-{n:05d}", "instance": f"gpu-{n:05d}:{19470 if job == 'accelmon' else 9100}",
                        "__metrics_path__": f"/w{n}/{job}"}}
            for n in range(nodes)
        ]  # fmt: skip
        partial = directory / f".{job}.json"
        partial.write_text(json.dumps(groups))
        partial.rename(directory / f"{job}.json")


class Prometheus:
    """A PromQL endpoint: the master's Prometheus, or the store (VictoriaMetrics answers the same API)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str, **params: str) -> list:
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode({'query': expr, **params})}"
        return json.loads(fetch(url))["data"]["result"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    def range_seconds(self, expr: str, start: float, end: float, step: float) -> tuple[float, int]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        started = time.perf_counter()
        answer = json.loads(fetch(f"{self.base}/api/v1/query_range?{params}", timeout=120))
        assert answer["status"] == "success", (expr, answer)
        return time.perf_counter() - started, len(answer["data"]["result"])

    def instant_seconds(self, expr: str, at: float) -> tuple[float, int]:
        params = urllib.parse.urlencode({"query": expr, "time": at})
        started = time.perf_counter()
        answer = json.loads(fetch(f"{self.base}/api/v1/query?{params}", timeout=120))
        assert answer["status"] == "success", (expr, answer)
        return time.perf_counter() - started, len(answer["data"]["result"])


# The dashboards an operator keeps open on a large fleet, as they are opened: Fleet and Health over every node
# ("All"), Job for one job (the board is per job: picking "All" would draw every job's GPUs at once).
DASHBOARDS = {
    "accelmon-fleet": "Fleet",
    "accelmon-health": "Health",
    "accelmon-job": "Job",
    "accelmon-ledger": "Ledger",
}
ONE_JOB = "7"  # a job of the simulated fleet from its first step on


def dashboard_queries() -> list[tuple[str, str, bool]]:
    """(dashboard: panel, query, asked at one moment) of every panel of the Fleet, Health, Job and Fleet ledger
    dashboards: tables and bars are instant queries in Grafana (master/grafana/generate.py), the rest ranges."""
    return [
        (f"{DASHBOARDS[q.dashboard]}: {q.panel}", concrete(q.expr.replace("$job_id", ONE_JOB)), q.instant)
        for q in panel_queries()
        if q.dashboard in DASHBOARDS
    ]


def rule_costs(prometheus: Prometheus, groups: list[str], costs: dict[tuple[str, int, str], list[float]]) -> None:
    """Each rule's evaluation time (the rules API's evaluationTime, its last evaluation) in `groups`, added to
    `costs` by (group, place in the group, name): an alert written once per reason has one entry each."""
    answer = json.loads(fetch(f"{prometheus.base}/api/v1/rules"))["data"]["groups"]
    for group in answer:
        if group["name"] in groups:
            for index, rule in enumerate(group["rules"]):
                key = (group["name"], index, rule["name"])
                costs.setdefault(key, []).append(rule["evaluationTime"])


def measure_step(prometheus: Prometheus, pid: int, window: float, profiled: list[str]) -> dict[str, Any]:
    def appended() -> tuple[float, float]:
        """Prometheus's count of appended samples and the time of its self-scrape that read it."""
        name = 'prometheus_tsdb_head_samples_appended_total{job="prometheus"}'
        return prometheus.value(name), prometheus.value(f"timestamp({name})")

    (appended_before, at_before), cpu_before, started = appended(), cpu_seconds(pid), time.monotonic()
    peak_rss = 0.0
    rule_seconds, rule_group = 0.0, ""
    groups: dict[str, float] = {}  # each group's longest evaluation in the window

    def missed() -> float:
        return sum(float(m["value"][1]) for m in prometheus.query(
            'prometheus_rule_group_iterations_missed_total{job="prometheus"}'))  # fmt: skip

    missed_before = missed()
    costs: dict[tuple[str, int, str], list[float]] = {}
    while time.monotonic() - started < window:
        peak_rss = max(peak_rss, rss_bytes(pid))
        rule_costs(prometheus, profiled, costs)
        for group in prometheus.query('prometheus_rule_group_last_duration_seconds{job="prometheus"}'):
            name, seconds = group["metric"]["rule_group"].split(";")[-1], float(group["value"][1])
            groups[name] = max(groups.get(name, 0.0), seconds)
            if seconds > rule_seconds:
                rule_seconds, rule_group = seconds, name
        time.sleep(5)
    cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - started)
    rules = json.loads(fetch(f"{prometheus.base}/api/v1/rules"))["data"]["groups"]
    slowest_rule = max((r["evaluationTime"], r["name"]) for g in rules for r in g["rules"])
    appended_after, at_after = appended()
    return {
        "series": prometheus.value('prometheus_tsdb_head_series{job="prometheus"}'),
        "samples_per_second": (appended_after - appended_before) / max(at_after - at_before, 1e-9),
        "cpu_cores": cpu,
        "rss_bytes": peak_rss,
        "rule_seconds": rule_seconds,
        "rule_group": rule_group,
        "slowest_rule": f"{slowest_rule[1]} {slowest_rule[0] * 1000:.0f} ms",
        # The median of each rule's evaluations seen: on shared cores one evaluation can wait long for a core.
        "rule_costs": {key: statistics.median(seconds) for key, seconds in costs.items()},
        "groups": groups,
        # Evaluations skipped because the one before had not ended: a group out of time.
        "missed_evaluations": missed() - missed_before,
    }


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def store_metrics(base: str) -> dict[str, float]:
    """The figures VictoriaMetrics's /metrics gives: samples received by remote_write, active series, stored
    samples and their bytes on disk (the data parts, without the index)."""
    values: dict[str, float] = {}
    for line in fetch(f"{base}/metrics").decode().splitlines():
        name, _, value = line.rpartition(" ")
        values[name] = float(value) if value and not line.startswith("#") else 0.0
    return {
        "received": values['vm_rows_inserted_total{type="promremotewrite"}'],
        "series": values['vm_cache_entries{type="storage/hour_metric_ids"}'],
        "rows": values['vm_rows{type="storage/small"}'] + values['vm_rows{type="storage/big"}'],
        "bytes": values['vm_data_size_bytes{type="storage/small"}'] + values['vm_data_size_bytes{type="storage/big"}'],
    }


class StoreWatch(threading.Thread):
    """The store's peak RSS, CPU and ingestion over a measurement window, read beside the master's."""

    def __init__(self, base: str, pid: int) -> None:
        super().__init__(daemon=True)
        self.base, self.pid, self.peak_rss, self.running = base, pid, 0, True
        self.before, self.cpu_before, self.started = store_metrics(base), cpu_seconds(pid), time.monotonic()

    def run(self) -> None:
        while self.running:
            self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
            time.sleep(2)

    def finish(self) -> dict[str, float]:
        self.running = False
        elapsed = time.monotonic() - self.started
        after = store_metrics(self.base)
        return {
            "series": after["series"],
            "samples_per_second": (after["received"] - self.before["received"]) / elapsed,
            "rss_bytes": max(self.peak_rss, rss_bytes(self.pid)),
            "cpu_cores": (cpu_seconds(self.pid) - self.cpu_before) / elapsed,
            "bytes_per_sample": after["bytes"] / max(after["rows"], 1),
        }


def start_store(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """VictoriaMetrics with the accelmon_store role's rendered unit's command (its dedup and retention)."""
    binary = shutil.which("victoria-metrics")
    assert binary, "setup.sh unpacks VictoriaMetrics into .tools/usr/bin"
    port = free_port()
    unit = work / "accelmon-store.service"
    variables = {"accelmon_store_listen_address": "127.0.0.1", "accelmon_store_port": port}
    render_role_template("accelmon_store", "accelmon-store.service.j2", unit, variables)
    command = [binary] + [a.replace("/var/lib/accelmon-store", str(work / "store")) for a in exec_start(unit)[1:]]
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    wait_serving(f"{base}/health")
    return process, base


def slowest_query(endpoint: Prometheus, queries: list[tuple[str, str, bool]], began: float) -> list[tuple[float, str]]:
    """Every panel's query as Grafana asks it over the run so far (a range of 720 steps, or one instant at its end
    for tables and bars), slowest first."""
    end = time.time()
    step = max(1.0, (end - began) / 720)
    latencies = []
    for title, expr, instant in queries:
        try:
            if instant:
                latencies.append((endpoint.instant_seconds(expr, end)[0], title))
            else:
                latencies.append((endpoint.range_seconds(expr, end - 720 * step, end, step)[0], title))
        except urllib.error.HTTPError as refused:
            # A panel Prometheus refuses (422: over --query.max-samples or the query timeout) is what an operator
            # would meet on that fleet: said, and ranked slowest, instead of ending the run.
            reason = json.loads(refused.read() or b"{}").get("error", refused.reason)
            print(f"panel {title!r} failed: HTTP {refused.code}: {reason}", flush=True)
            latencies.append((float("inf"), title))
        except TimeoutError:
            print(f"panel {title!r} failed: no answer in 120 s", flush=True)
            latencies.append((float("inf"), title))
    return sorted(latencies, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="25,50,100,200", help="worker counts, in increasing order")
    parser.add_argument("--settle", type=float, default=75.0, help="seconds after adding workers before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of measurement per step")
    # A GPU node has many more CPUs than this machine: node_exporter's per-CPU series are scaled to it.
    parser.add_argument("--node-cpus", type=int, default=192, help="CPUs of a simulated worker (default 2 x 96)")
    parser.add_argument("--store", action="store_true", help="remote-write into VictoriaMetrics and measure it too")
    parser.add_argument(
        "--node-exporter-series", choices=("read", "all"), default="read",
        help="the master role's accelmon_master_node_exporter_series: node_exporter's series kept at scrape",
    )  # fmt: skip
    # What each step prints besides: every rule's median evaluation time in these groups, these panels' latency.
    parser.add_argument("--profile", default="accelmon-gpu-paths,accelmon-live-jobs", help="rule groups, by commas")
    parser.add_argument("--panel", action="append", default=["Job: Parts at fault"], help="'Dashboard: title start'")
    # Workers in trouble (STEADY above): their states, limits and error counters wander, every GPU's path at fault.
    parser.add_argument(
        "--faults", type=float, nargs="?", const=1.0, default=0.0, metavar="SHARE",
        help="the share of workers with every GPU's path at fault (0.05: a bad day; alone: 1, every worker)",
    )  # fmt: skip
    args = parser.parse_args()
    if not 0 <= args.faults <= 1:
        parser.error(f"--faults is a share of the workers, from 0 to 1: {args.faults:g}")
    profiled = [group for group in args.profile.split(",") if group]
    steps = [int(n) for n in args.nodes.split(",")]
    prometheus_binary = shutil.which("prometheus")
    assert prometheus_binary, "setup.sh unpacks Prometheus into .tools/usr/bin"
    version = subprocess.run([prometheus_binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]

    with tempfile.TemporaryDirectory(prefix="accelmon-capacity-") as scratch:
        work = Path(scratch)
        bodies = record_bodies(work, args.node_cpus)
        per_node = {job: sum(1 for line in text.splitlines() if line and not line.startswith("#"))
                    for job, text in bodies.items()}  # fmt: skip
        fleet = Fleet(bodies, args.faults)
        threading.Thread(target=fleet.serve_forever, daemon=True).start()
        targets = work / "targets"
        targets.mkdir()
        write_targets(targets, fleet.server_address[1], 0)
        store_process, store_base = start_store(work) if args.store else (None, "")
        config = work / "prometheus.yml"
        remote_write = [{"url": f"{store_base}/api/v1/write"}] if args.store else []
        render_role_template(
            "accelmon_master", "prometheus.yml.j2", config,
            {"accelmon_master_remote_write": remote_write,
             "accelmon_master_node_exporter_series": args.node_exporter_series},
        )  # fmt: skip
        text = config.read_text().replace("/etc/prometheus/targets/", f"{targets}/")
        port = free_port()
        rules = load_renderer().write_rules(work / "master-rules")  # the shipped rules and the live job rules rendered
        text = text.replace("/etc/prometheus/rules/", f"{rules}/")
        config.write_text(text.replace("localhost:9090", f"127.0.0.1:{port}"))  # its self-scrape
        process = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        prometheus = Prometheus(f"http://127.0.0.1:{port}")
        queries = dashboard_queries()
        results = []
        try:
            wait_serving(f"{prometheus.base}/-/ready")
            print(f"{version}; the master role's config (15 s scrapes and rules, node_exporter's series: "
                  f"{args.node_exporter_series}) and rules; 2-core machine; workers in trouble: "
                  f"{f'{fleet.faults:.0%}' if fleet.faults else 'none'}")  # fmt: skip
            print(f"per simulated worker: accelmon {per_node['accelmon']} series (8 GPUs, GPM, 12 RDMA devices), "
                  f"node_exporter {per_node['node']} ({args.node_cpus} CPUs); "
                  f"Fleet, Health, Job (one job), Ledger dashboards: {sum(not q[2] for q in queries)} queries of "
                  f"720 steps, {sum(q[2] for q in queries)} instant")  # fmt: skip
            print(f"{'nodes':>6} {'GPUs':>6} {'series':>9} {'samples/s':>10} {'RSS MiB':>8} {'CPU cores':>9} "
                  f"{'rules ms':>8} {'panel max ms':>13}  slowest panel")  # fmt: skip
            began = time.time()
            for nodes in steps:
                write_targets(targets, fleet.server_address[1], nodes)
                time.sleep(args.settle)
                watch = StoreWatch(store_base, store_process.pid) if store_process else None
                if watch:
                    watch.start()
                figures = measure_step(prometheus, process.pid, args.window, profiled)
                latencies = slowest_query(prometheus, queries, began)
                slowest = latencies[0]
                figures.update(nodes=nodes, query_seconds=slowest[0])
                results.append(figures)
                print(f"{nodes:>6} {nodes * GPUS_PER_NODE:>6} {figures['series']:>9.0f} "
                      f"{figures['samples_per_second']:>10.0f} {figures['rss_bytes'] / 2**20:>8.0f} "
                      f"{figures['cpu_cores']:>9.3f} {figures['rule_seconds'] * 1000:>8.1f} "
                      f"{slowest[0] * 1000:>13.0f}  {slowest[1]}", flush=True)  # fmt: skip
                per_board = ", ".join(
                    next(f"{title} {seconds * 1000:.0f} ms" for seconds, title in latencies if title.startswith(board))
                    for board in DASHBOARDS.values()
                )
                print(f"{'':>6} slowest rule group: {figures['rule_group']}, rule: {figures['slowest_rule']}; "
                      f"evaluations missed in the window: {figures['missed_evaluations']:.0f}")  # fmt: skip
                longest = ", ".join(f"{name} {sec * 1000:.0f} ms" for name, sec in sorted(figures["groups"].items()))
                print(f"{'':>6} each group's longest evaluation: {longest}")
                print(f"{'':>6} slowest panel of each dashboard: {per_board}")
                named = [f"{title} {seconds * 1000:.0f} ms" for seconds, title in latencies
                         if any(title.startswith(panel) for panel in args.panel)]  # fmt: skip
                print(f"{'':>6} panels asked for: {', '.join(named) or 'none matched'}")
                for (group, index, name), seconds in sorted(figures["rule_costs"].items()):
                    print(f"{'':>6} rule {group}[{index}] {name}: {seconds * 1000:.1f} ms")
                if watch:
                    store = watch.finish()
                    store_latency = slowest_query(Prometheus(store_base), queries, began)[0]
                    store.update(nodes=nodes, query_seconds=store_latency[0])
                    figures["store"] = store
                    print(f"{'':>6} store: {store['series']:.0f} series, {store['samples_per_second']:.0f} samples/s "
                          f"received, RSS {store['rss_bytes'] / 2**20:.0f} MiB, CPU {store['cpu_cores']:.3f} cores, "
                          f"{store['bytes_per_sample']:.2f} B per stored sample, slowest panel query "
                          f"{store_latency[0] * 1000:.0f} ms ({store_latency[1]})", flush=True)  # fmt: skip
        finally:
            for server in (process, store_process):
                if server:
                    stop(server)
            fleet.shutdown()

    if len(results) >= 2:
        first, last = results[0], results[-1]
        nodes = FLEET_GPUS // GPUS_PER_NODE
        series_per_node = (last["series"] - first["series"]) / (last["nodes"] - first["nodes"])
        series = last["series"] + series_per_node * (nodes - last["nodes"])
        bytes_per_series = (last["rss_bytes"] - first["rss_bytes"]) / (last["series"] - first["series"])
        rss = last["rss_bytes"] + bytes_per_series * (series - last["series"])
        cpu_per_sample = last["cpu_cores"] / max(last["samples_per_second"], 1e-9)
        samples = series / 15
        print(f"\nExtrapolated, straight lines through the first and last step, to {nodes} nodes "
              f"x {GPUS_PER_NODE} GPUs = {FLEET_GPUS} GPUs:")  # fmt: skip
        print(f"  {series_per_node:.0f} series per node -> {series / 1e6:.2f} M active series, "
              f"{samples:,.0f} samples/s at 15 s")  # fmt: skip
        print(f"  {bytes_per_series / 1024:.1f} KiB of RSS per added series -> about {rss / 2**30:.1f} GiB RSS")
        print(f"  {cpu_per_sample * 1e6:.1f} us of CPU per ingested sample -> about {cpu_per_sample * samples:.2f} "
              "cores for ingestion and rules (queries on top)")  # fmt: skip
        if "store" in last:
            store_first, store_last = first["store"], last["store"]
            per_series = (store_last["rss_bytes"] - store_first["rss_bytes"]) / (
                store_last["series"] - store_first["series"]
            )
            store_rss = store_last["rss_bytes"] + per_series * (series - store_last["series"])
            store_cpu = store_last["cpu_cores"] / store_last["samples_per_second"] * samples
            disk = store_last["bytes_per_sample"] * samples * 86400 * 30
            print(f"  the store: {per_series / 1024:.1f} KiB of RSS per added series -> about "
                  f"{store_rss / 2**30:.1f} GiB RSS, about {store_cpu:.2f} cores, {disk / 1e12:.2f} TB per 30 days at "
                  f"{store_last['bytes_per_sample']:.2f} B/sample (one copy: HA pairs deduplicated)")  # fmt: skip


if __name__ == "__main__":
    main()
