"""Verify OAR job attribution with a real OAR: a job on both nodes is seen by each node's exporter with that node's
GPU (OAR's gpudevice, a device minor), OAR's user and project, and its cgroup's CPU and memory; when the job ends,
its series leave both nodes. Nothing of accelmon's runs in OAR."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import testinfra

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared"))
from verify import scrape_options

SERVER, NODE = "accelmon-oar-server", "accelmon-oar-node"
GPU_MINORS = {SERVER: {"0", "2"}, NODE: {"1", "3"}}  # prepare.yml's resources
testinfra_hosts = [f"podman://{SERVER}"]
BURN_SECONDS = 12


def hosts() -> dict[str, testinfra.host.Host]:
    return {name: testinfra.get_host(f"podman://{name}") for name in (SERVER, NODE)}


def metrics(host) -> str:
    return host.check_output(f"curl -sf {scrape_options(host, 19470)}")


def wait_for(host, pattern: str, seconds: int = 90) -> str:
    """The exporter's page once `pattern` (a regex) is on it; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        text = metrics(host)
        if re.search(pattern, text, re.MULTILINE):
            return text
        assert time.monotonic() < deadline, f"{pattern!r} not served within {seconds} s:\n{text[-3000:]}"
        time.sleep(1)


def value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.split("{")[0].split(" ")[0] == name and all(f'{key}="{val}"' in line for key, val in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def minor_of_uuid(host, uuid: str) -> str:
    """The device minor the driver's procfs files (the fixture tree the exporter reads) give the GPU `uuid`."""
    for path in host.check_output("ls -d /opt/fake-proc/driver/nvidia/gpus/*").split():
        text = host.file(f"{path}/information").content_string
        if uuid in text:
            return re.search(r"Device Minor:\s*(\d+)", text).group(1)
    raise AssertionError(f"{uuid} is no GPU of {host}")


@pytest.fixture(scope="module")
def job(host):
    """A job of one CPU (and its GPU) on each node, submitted as alice in project physics: it burns a CPU for
    BURN_SECONDS, writes the CPU time its shell measured for itself, then waits to be deleted."""
    for _ in range(60):  # the nodes report Alive once oar-node's service has told the server
        if host.check_output("oarnodes -s").count("Alive") == 4:
            break
        time.sleep(1)
    script = (
        f"end=$(($(date +%s)+{BURN_SECONDS})); while [ $(date +%s) -lt $end ]; do :; done; "
        "times > /home/alice/burned; sleep 600"
    )
    submitted = host.check_output(
        "cd /home/alice && runuser -u alice -- oarsub -l /network_address=2/resource_id=1,walltime=0:15:00 "
        f"--project=physics {shlex_quote(script)}"
    )
    job_id = re.search(r"OAR_JOB_ID=(\d+)", submitted).group(1)
    for _ in range(90):
        if f"{job_id}: Running" in host.check_output(f"oarstat -s -j {job_id}"):
            break
        time.sleep(1)
    else:
        raise AssertionError(host.check_output(f"oarstat -f -j {job_id}"))
    yield job_id
    host.run(f"oardel {job_id}")


def shlex_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_each_node_names_its_own_gpu_with_oars_user_and_project(job):
    for name, node in hosts().items():
        text = wait_for(node, rf'^accelmon_gpu_job_info\{{.*job_id="{job}"')
        series = [line for line in text.splitlines() if line.startswith("accelmon_gpu_job_info{")]
        assert len(series) == 1, series  # one resource, one GPU, on each node
        assert 'user="alice"' in series[0] and 'account="physics"' in series[0], series
        uuid = re.search(r'uuid="([^"]+)"', series[0]).group(1)
        assert minor_of_uuid(node, uuid) in GPU_MINORS[name], (name, series)
        assert value(text, "accelmon_jobs_running") == 1.0
        assert value(text, "accelmon_jobs_malformed_lines_total") == 0.0


def test_each_node_reads_the_jobs_cgroup(job):
    """One CPU per node (OAR's cpuset), the memory limit OAR's manager set (its share of the node's memory), and on
    the node that ran the job's script, the CPU time the script measured for itself (within 10 %)."""
    burned = None
    for _ in range(BURN_SECONDS * 4):
        burned = "".join(node.run("cat /home/alice/burned").stdout for node in hosts().values())
        if burned.strip():
            break
        time.sleep(1)
    # `times`: the shell's user and system time, then its children's (the `date` it ran every turn): all of it.
    own = sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", burned or ""))
    assert own > 0, f"the job wrote no CPU time: {burned!r}"
    cpu_seconds = {}
    for name, node in hosts().items():
        text = wait_for(node, rf'^accelmon_job_cpus_allocated\{{job_id="{job}"\}} 1\.0$')
        limit = value(text, "accelmon_job_memory_limit_bytes", job_id=job)
        assert limit is not None and 0 < limit < 2**50, text
        time.sleep(3)  # a second read after the script's end
        text = metrics(node)
        cpu_seconds[name] = sum(
            value(text, "accelmon_job_cpu_seconds_total", job_id=job, mode=mode) or 0.0 for mode in ("user", "system")
        )
    ran_it = max(cpu_seconds, key=cpu_seconds.get)
    assert cpu_seconds[ran_it] == pytest.approx(own, rel=0.10, abs=0.5), (cpu_seconds, own)
    other = SERVER if ran_it == NODE else NODE
    assert cpu_seconds[other] < 1.0, cpu_seconds  # the other node's cgroup holds no process of the job


def test_the_jobs_series_leave_both_nodes_when_it_ends(host, job):
    host.check_output(f"oardel {job}")
    for _ in range(90):
        if re.search(rf"{job}: (Terminated|Error)", host.check_output(f"oarstat -s -j {job}")):
            break
        time.sleep(1)
    for node in hosts().values():
        text = wait_for(node, r"^accelmon_jobs_running 0\.0$")
        assert f'job_id="{job}"' not in text, [line for line in text.splitlines() if f'job_id="{job}"' in line]


def node_states(server, node: str) -> set[str]:
    """The states OAR gives `node`'s resources (`oarnodes -s`: the host, then `  <resource> : <state>` lines)."""
    states: set[str] = set()
    current = ""
    for line in server.check_output("oarnodes -s").splitlines():
        if line and not line[0].isspace():
            current = line.strip()
        elif current == node and ":" in line:
            states.add(line.split(":", 1)[1].strip())
    return states


def wait_for_state(server, node: str, state: str, seconds: int = 120) -> None:
    deadline = time.monotonic() + seconds
    while node_states(server, node) != {state}:
        assert time.monotonic() < deadline, f"{node} not {state} within {seconds} s: {node_states(server, node)}"
        time.sleep(2)


def test_a_failing_gpu_makes_oar_suspect_the_node_until_the_operator_clears_it(host):
    """The role's node check in /etc/oar/check.d, run by OAR's oarnodecheckrun (its cron's, or oarnodecheckquery's,
    job): GPU 5 stops answering, the check leaves a log naming it, and OAR's ping checker suspects the node. It
    stays suspected while the log is there, whatever the GPU does; the operator removes it and OAR takes it back."""
    node = hosts()[NODE]
    wait_for_state(host, NODE, "Alive")
    node.check_output(
        "cp /etc/fake-nvml.conf /etc/fake-nvml.conf.healthy && printf 'gpus 8\\nlost 5\\n' > /etc/fake-nvml.conf"
    )
    try:
        # As root, as cron does; it skips a run while another holds its lock (the ping checker's may be running).
        for _ in range(30):
            node.check_output("/usr/lib/oar/oarnodecheckrun")
            if node.run("ls /var/lib/oar/checklogs/accelmon-health.*").rc == 0:
                break
            time.sleep(1)
        log = node.check_output("cat /var/lib/oar/checklogs/accelmon-health.*")
        assert log == "accelmon: GPU 5 gpu_lost: reboot_node", log
        wait_for_state(host, NODE, "Suspected")
        assert node_states(host, SERVER) == {"Alive"}
    finally:
        node.check_output("mv /etc/fake-nvml.conf.healthy /etc/fake-nvml.conf")
    time.sleep(10)  # the GPU answers again; the log is still there: still suspected
    assert node_states(host, NODE) == {"Suspected"}
    node.check_output("rm /var/lib/oar/checklogs/accelmon-health.*")
    wait_for_state(host, NODE, "Alive")


def test_the_role_installed_nothing_for_slurm_and_turned_the_job_collectors_on(host):
    assert not host.file("/etc/tmpfiles.d/accelmon-jobs.conf").exists
    config = host.file("/etc/accelmon/exporter.yml").content_string
    assert re.search(r"jobs:\n\s+enabled: true", config), config
