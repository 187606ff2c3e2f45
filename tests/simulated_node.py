"""One simulated worker for tests with a real Prometheus: accelmon-exporter over 8 fake GPUs (a lost one, an XID,
GPM profiling, energy counters that follow power), fixture InfiniBand ports, a fake neuron-monitor and two Slurm
jobs sharing a GPU (the first with a Neuron runtime in its cgroup), sampled every second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT, exporter_env
from ib_fixture import standard_tree
from jobs_fixture import nvidia_procfs, slurm_job_cgroup
from neuron_reports import line, report


def start_exporter(work: Path, port: int, fake_nvml_dir: Path) -> subprocess.Popen[bytes]:
    """Starts the exporter on 127.0.0.1:`port`, its fixtures under `work` (which must exist); the caller stops it."""
    nvml = work / "fake-nvml.conf"
    # Energy counters that grow by each GPU's power, read every second: the job report's energy is checked on them.
    nvml.write_text("gpus 8\nlost 5\nxid 2 79\nenergy_follows_power 1\n" + "".join(f"gpm {i}\n" for i in range(8)))
    sysfs = standard_tree(work / "sys")
    slurm_job_cgroup(sysfs / "fs" / "cgroup", 100, (3101,))  # the Neuron runtime llama-serve runs in job 100
    procfs = nvidia_procfs(work / "proc", gpus=8)
    jobs = work / "jobs"
    jobs.mkdir()
    # Two Slurm jobs sharing GPU minor 1: the per-job rules join through both.
    (jobs / "slurm-100").write_text("scheduler=slurm\njob_id=100\nuser=alice\naccount=ml\ngpus=0,1\n")
    (jobs / "slurm-200").write_text("scheduler=slurm\njob_id=200\nuser=bob\naccount=hpc\ngpus=1\n")
    reports = work / "reports.jsonl"
    reports.write_text("\n".join(line(report(i)) for i in range(1, 4)) + "\n")
    settings = work / "accelmon.yml"
    settings.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": f"127.0.0.1:{port}"},
                "paths": {"sysfs": str(sysfs), "procfs": str(procfs)},
                "collectors": {
                    "nvml": {"enabled": True, "pcie_interval_seconds": 1, "slow_interval_seconds": 1},
                    "infiniband": {"enabled": True, "interval_seconds": 1},
                    "neuron": {
                        "enabled": True,
                        "interval_seconds": 1,
                        "period_seconds": 1,
                        "monitor_path": str(ROOT / "tests" / "fakeneuron" / "neuron-monitor"),
                    },
                    "profiling": {"enabled": True, "backend": "gpm"},
                    "jobs": {"interval_seconds": 1, "state_dir": str(jobs)},
                },
            }
        )
    )
    env = exporter_env(fake_nvml_dir, nvml)
    env.update(FAKE_NEURON_LINES=str(reports), FAKE_NEURON_THEN="repeat", FAKE_NEURON_DELAY="0.5")
    command = [sys.executable, "-m", "accelmon", "--config", str(settings)]
    return subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)


def start_node_exporter(binary: str, port: int) -> subprocess.Popen[bytes]:
    """node_exporter with the collectors the dashboards read, on 127.0.0.1:`port`."""
    collectors = ["cpu", "meminfo", "filesystem", "netdev", "loadavg"]
    command = [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults"]
    command += [f"--collector.{name}" for name in collectors]
    return subprocess.Popen(command, stderr=subprocess.DEVNULL)
