"""One simulated worker for tests with a real Prometheus: accelmon-exporter over 8 fake GPUs (a lost one, an XID,
GPM profiling, energy counters that follow power), fixture InfiniBand ports, a fake neuron-monitor and two Slurm
jobs sharing a GPU (the first with a Neuron runtime in its cgroup), sampled every second."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import yaml

from tests.support.ansible import render_role_template
from tests.support.fake_scontrol import Cluster
from tests.support.infiniband_tree import gpu_functions, standard_tree
from tests.support.jobs_tree import bus_id, fabric_manager_process, job_cgroup_stats, nvidia_procfs, slurm_job_cgroup
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.neuron_reports import line, report
from tests.support.paths import FAKE_NEURON_MONITOR
from tests.support.processes import exporter_env, free_port, stop
from tests.support.processes import start_exporter as start_accelmon
from tests.support.rules import rule_files
from tests.support.waiting import wait_until


def repair_history(path: Path) -> Path:
    """A repair journal as the Slurm health check leaves it (accelmon.health.remediation): GPU 2 drained for an ECC
    error two days ago, reset and resumed, then failing again: drained for hardware_service, a repeat offender."""
    from accelmon.health.remediation import Journal, Record

    gpu = ({"index": "2", "uuid": "GPU-00000002-0000-4000-8000-000000000000", "serial": "1650000000002"},)
    now = time.time()
    journal = Journal(str(path))
    for when, event, action, outcome in (
        (now - 2 * 86400, "drained", "reset_gpu", "none"),
        (now - 2 * 86400 + 1800, "repair", "reset_gpu", "resolved"),
        (now - 2 * 86400 + 1810, "resumed", "reset_gpu", "resolved"),
        (now - 3600, "escalated", "hardware_service", "none"),
    ):
        assert journal.append(Record(when, "gpu-node-1", event, action, outcome, gpu, "simulated")) is None
    return path


def start_exporter(work: Path, port: int, fake_nvml_dir: Path) -> subprocess.Popen[bytes]:
    """Starts the exporter on 127.0.0.1:`port`, its fixtures under `work` (which must exist); the caller stops it."""
    nvml = work / "fake-nvml.conf"
    # Energy counters that grow by each GPU's power, read every second: the job report's energy is checked on them.
    # An HGX H100 board: 18 NVLink links per GPU, GPU 3's link 7 down, every GPU's fabric registration completed.
    fabric = "".join(f"gpm {i}\nnvlink {i} 18\nfabric {i} 3 0 2\n" for i in range(8))
    faults = "lost 5\nxid 2 79\nnvlink_down 3 7\nnvlink_errors 3 7 0 4\n"
    # Job 100's process 3101 (its cgroup's) on GPUs 0 and 1, with the driver's per-process samples.
    faults += "process_samples 1\nprocess 0 3101 4096\nprocess 1 3101 2048\n"
    nvml.write_text("gpus 8\nenergy_follows_power 1\n" + faults + fabric)
    sysfs = standard_tree(work / "sys")
    gpu_functions(sysfs)  # the GPUs in the PCI tree beside the HCAs: each GPU's nearest NIC is served
    slurm_job_cgroup(sysfs / "fs" / "cgroup", 100, (3101,))  # the Neuron runtime llama-serve runs in job 100
    for job in (100, 200):  # what each job uses on the CPU side (collector job_resources)
        job_cgroup_stats(sysfs / "fs" / "cgroup", job)
    procfs = nvidia_procfs(work / "proc", gpus=8)
    fabric_manager_process(procfs)  # what an NVSwitch system needs
    jobs = work / "jobs"
    jobs.mkdir()
    # Two Slurm jobs sharing GPU minor 1: the per-job rules join through both.
    (jobs / "slurm-100").write_text("scheduler=slurm\njob_id=100\nuser=alice\naccount=ml\ngpus=0,1\n")
    (jobs / "slurm-200").write_text("scheduler=slurm\njob_id=200\nuser=bob\naccount=hpc\ngpus=1\n")
    # Its kernel log has the XID 79 that the fake driver also reports as an NVML event on GPU 2 (bus 0000:38:00),
    # as a real driver logs every XID it reports: the health check names it once, from the kernel log.
    kmsg = work / "kmsg"
    kmsg.write_text(record(1, 5.0, xid_line(bus_id(2).rsplit(".", 1)[0], 79, "GPU has fallen off the bus.")))
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    reports = work / "reports.jsonl"
    reports.write_text("\n".join(line(report(i)) for i in range(1, 4)) + "\n")
    journal = repair_history(work / "remediation.jsonl")
    # Slurm's view of the node (collector scheduler), from a stand-in scontrol: running jobs, so "mixed".
    slurm = Cluster(work, {"gpu-node-1": "MIXED"})
    settings = work / "accelmon.yml"
    settings.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": f"127.0.0.1:{port}"},
                "paths": {"sysfs": str(sysfs), "procfs": str(procfs), "kmsg": str(kmsg)},
                "collectors": {
                    "nvml": {"enabled": True, "pcie_interval_seconds": 1, "slow_interval_seconds": 1},
                    "infiniband": {"enabled": True, "interval_seconds": 1},
                    "neuron": {
                        "enabled": True,
                        "interval_seconds": 1,
                        "period_seconds": 1,
                        "monitor_path": str(FAKE_NEURON_MONITOR),
                    },
                    "profiling": {"enabled": True, "backend": "gpm", "interval_seconds": 2},
                    "jobs": {"interval_seconds": 1, "state_dir": str(jobs)},
                    "job_resources": {"interval_seconds": 1, "state_dir": str(jobs)},
                    # dcgm-exporter's names beside ours: its dashboard's and alerts' queries are run against both.
                    "dcgm_compat": {"enabled": True},
                    "health": {"drill_dir": str(work / "drills"), "remediation_journal": str(journal)},
                    "scheduler": {
                        "enabled": True,
                        "interval_seconds": 1,
                        "scontrol": str(slurm.command),
                        "node_name": "gpu-node-1",
                    },
                },
            }
        )
    )
    env = exporter_env(fake_nvml_dir, nvml)
    env.update(FAKE_NEURON_LINES=str(reports), FAKE_NEURON_THEN="repeat", FAKE_NEURON_DELAY="0.5")
    return start_accelmon(["--config", str(settings)], env, stderr=subprocess.DEVNULL)


def rapl_sysfs(root: Path) -> Path:
    """A sysfs tree with one CPU package's RAPL zone and its DRAM sub-zone, as Linux's powercap driver shows them
    (class/powercap/intel-rapl:N[:M]/{name,energy_uj,max_energy_range_uj}): this machine, a VM, has none."""
    for zone, name, energy in (("intel-rapl:0", "package-0", 123456789), ("intel-rapl:0:0", "dram", 2345678)):
        folder = root / "class" / "powercap" / zone
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "name").write_text(f"{name}\n")
        (folder / "energy_uj").write_text(f"{energy}\n")
        (folder / "max_energy_range_uj").write_text("262143328850\n")
    return root


def start_node_exporter(binary: str, port: int, sysfs: Path) -> subprocess.Popen[bytes]:
    """node_exporter with the collectors the dashboards and rules read, on 127.0.0.1:`port`; RAPL from `sysfs`."""
    collectors = ["cpu", "meminfo", "filesystem", "netdev", "loadavg", "rapl", "uname"]
    command = [
        binary,
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.cpu.info",  # node_cpu_info, the job report's CPU model (the role runs it so too)
        f"--path.sysfs={sysfs}",
    ]
    command += [f"--collector.{name}" for name in collectors]
    return subprocess.Popen(command, stderr=subprocess.DEVNULL)


def every_second(files: list[Path], out: Path) -> list[Path]:
    """Copies of the rule files with no group's own interval, so every group runs at the simulated Prometheus's
    1 s: a group evaluated every minute (accelmon-gpu-paths) would record nothing for up to a minute after start,
    and these tests read what the rules record, not when."""
    out.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in files:
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            group.pop("interval", None)
        copies.append(out / path.name)
        copies[-1].write_text(yaml.safe_dump(rules, sort_keys=False))
    return copies


def get(url: str) -> dict:
    """A Prometheus API answer as data."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def simulated_prometheus(work: Path, fake_nvml_dir: Path) -> Iterator[str]:
    """A real Prometheus scraping accelmon-exporter (8 fake GPUs with a lost one and an XID, GPM profiling,
    fixture IB ports, a fake neuron-monitor) and node_exporter, every second, with the master's rules; yields its
    base URL once the rules have evaluated over scraped data, and stops all three after."""
    ports = {name: free_port() for name in ("exporter", "node", "prometheus")}
    config = work / "prometheus.yml"
    # The master role's own scrape settings for each job (its metric relabelling: node_exporter's series kept at
    # accelmon_master_node_exporter_series's default), so every query the tests run meets what a master keeps.
    role = work / "role-prometheus.yml"
    render_role_template("accelmon_master", "prometheus.yml.j2", role, {})
    kept = {
        job["job_name"]: job.get("metric_relabel_configs", [])
        for job in yaml.safe_load(role.read_text())["scrape_configs"]
    }
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(r) for r in every_second(rule_files(), work / "rules")],
                "scrape_configs": [
                    {
                        "job_name": job,
                        "static_configs": [{"targets": [f"127.0.0.1:{ports[port]}"], "labels": {"node": "gpu-node-1"}}],
                        **({"metric_relabel_configs": kept[job]} if kept.get(job) else {}),
                    }
                    for job, port in (("accelmon", "exporter"), ("node", "node"))
                ],
            }
        )
    )
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    prometheus_binary = shutil.which("prometheus")
    assert node_exporter and prometheus_binary, "scripts/setup.sh unpacks prometheus and node_exporter into .tools/"
    processes = [
        start_exporter(work, ports["exporter"], fake_nvml_dir),
        start_node_exporter(node_exporter, ports["node"], rapl_sysfs(work / "node-sys")),
        subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
            ],
            stderr=subprocess.DEVNULL,
        ),
    ]
    base = f"http://127.0.0.1:{ports['prometheus']}"
    try:

        def recorded() -> bool:  # the rules need two evaluations over scraped data
            # The fleet roll-ups, and the job GPUs' profiling record: the last a panel reads to appear (GPM is
            # published after its first window, and the live-job rules record it at their next evaluation).
            wanted = ("cluster:accelmon_neuroncore_utilization_ratio:avg", "job_gpu:sm_active_ratio")
            try:
                return all(get(f"{base}/api/v1/query?query={name}")["data"]["result"] for name in wanted)
            except OSError:
                return False

        # About 7 s on a quiet machine; CI runs this beside three Molecule clusters on 2 cores, where 60 s was once
        # not enough (stop 75's CI). The wait ends at the first answer, so a long limit costs nothing when healthy.
        wait_until(recorded, timeout=240, every=1, what="the recording rules over scraped data")
        time.sleep(4)  # rate() and increase() want a few samples
        yield base
    finally:
        for process in processes:
            stop(process)
