"""Verify the AMD worker: the role installed AMD's amdsmi bindings and joined the GPU groups, and the hardened
service serves two MI300X (the fake libamd_smi.so) under the shared names, with their health judged."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared"))
from verify import scrape_options

testinfra_hosts = ["podman://accelmon-worker-amd"]


def metrics(host):
    return host.check_output(
        f"for i in $(seq 1 30); do curl -sf {scrape_options(host, 19470)} | grep -q 'accelmon_gpu_up{{' && break; "
        f"sleep 1; done; curl -sf {scrape_options(host, 19470)}"
    )


def test_the_service_serves_the_amd_gpus_under_the_shared_names(host):
    text = metrics(host)
    assert 'accelmon_collector_success{collector="amd"} 1.0\n' in text
    assert 'accelmon_collector_hardware_answering{collector="amd"} 1.0\n' in text
    info = [line for line in text.splitlines() if line.startswith("accelmon_gpu_info{")]
    assert len(info) == 2 and all('vendor="amd"' in line and "AMD Instinct MI300X" in line for line in info), info
    assert 'accelmon_gpu_power_watts{gpu="1",uuid="01ff74a1-0000-1000-8001-000000001001"} 310.0\n' in text
    assert 'accelmon_amd_gpu_ras_errors_total{block="umc",gpu="0",type="corrected"' in text
    assert "accelmon_gpu_nvlink" not in text and 'vendor="nvidia"' not in text  # no NVIDIA driver here


def test_the_health_checks_judge_the_amd_gpus(host):
    text = metrics(host)
    xgmi = [line for line in text.splitlines() if 'check="xgmi",gpu="1",' in line]
    assert len(xgmi) == 1 and xgmi[0].endswith(" 2.0"), xgmi  # link 3 down: failure
    assert "accelmon_node_health_verdict 2.0\n" in text


def test_the_role_installed_the_pinned_bindings_and_joined_the_gpu_groups(host):
    version = host.check_output(
        "/opt/accelmon/venv/bin/python -c \"import importlib.metadata as m; print(m.version('amdsmi'))\""
    )
    assert version == "7.0.2"
    groups = [name for name in ("render", "video") if host.run(f"getent group {name}").rc == 0]
    assert groups, "Debian 12 has the render and video groups"
    # What systemd loaded, and what the role wrote (DeviceAllow as written: systemd shows it resolved).
    loaded = host.check_output("systemctl show accelmon-exporter -p SupplementaryGroups")
    assert loaded.split("=", 1)[1].split() == groups
    unit = set(host.file("/etc/systemd/system/accelmon-exporter.service").content_string.splitlines())
    assert {"DeviceAllow=char-kfd rw", "DeviceAllow=char-drm rw"} <= unit


def test_job_perf_counts_with_cap_perfmon_only_and_says_why_hardware_events_do_not(host):
    """job_perf enabled: the unit grants CAP_PERFMON and lets perf_event_open through its seccomp filter (nothing
    else changes: the exposure score measured 2.1 here, where the GPU groups are joined too; the role's unit scored
    offline 2.0 with it and 1.9 without), and the exporter opens software events in cgroup
    mode for real (the host kernel, through the container's cgroups) while hardware events say no_pmu (our machines
    have no PMU) or count where the host has one."""
    unit = set(host.file("/etc/systemd/system/accelmon-exporter.service").content_string.splitlines())
    assert "SystemCallFilter=perf_event_open" in unit
    shown = host.check_output("systemctl show accelmon-exporter -p AmbientCapabilities -p CapabilityBoundingSet")
    for line in shown.splitlines():
        assert set(line.split("=", 1)[1].lower().split()) == {"cap_perfmon", "cap_syslog"}, line
    report = host.check_output("systemd-analyze security --no-pager accelmon-exporter.service")
    overall = next(line for line in report.splitlines() if "Overall exposure level" in line)
    assert float(overall.split(":", 1)[1].split()[0]) <= 2.1, overall
    text = metrics(host)
    assert 'accelmon_job_perf_event_available{event="context_switches",reason="counting"} 1.0' in text
    pmu = host.run("ls -d /sys/bus/event_source/devices/cpu").rc == 0
    cycles = (
        'accelmon_job_perf_event_available{event="cycles",reason="counting"} 1.0'
        if pmu
        else ('accelmon_job_perf_event_available{event="cycles",reason="no_pmu"} 0.0')
    )
    assert cycles in text
