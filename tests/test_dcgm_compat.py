"""dcgm-exporter's names from accelmon's samples: the mapping on the fake driver's samples, and, in a real
Prometheus, the queries of dcgm-exporter's published Grafana dashboard and of commonly published DCGM alert rules
answering what accelmon's own metrics say."""

from __future__ import annotations

import time
import urllib.parse

import pytest

from accelmon.collectors.amd import AmdCollector
from accelmon.collectors.dcgm_compat import FIELDS, DcgmCompatCollector
from accelmon.collectors.kernel_log import KernelLogCollector
from accelmon.collectors.nvml import NvmlCollector
from accelmon.exporter.metrics import render
from accelmon.exporter.runtime import Sampler
from tests.support.exposition import DCGM_EXPORTER_NAMES, check_golden, promtool_check, sample_value, text_of
from tests.support.jobs_tree import MINORS, bus_id, nvidia_procfs, uuid
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.processes import exporter_env, run_once
from tests.support.simulated_node import get
from tests.support.waiting import wait_until

MIB = 2**20


@pytest.fixture
def samplers(fake_nvml, tmp_path):
    """The nvml and kernel_log collectors sampled once, as the compat collector finds them."""
    fake_nvml.configure("gpus 4\nmig 1 2\nxid 3 31\n")
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        record(1, 5.0, xid_line(bus_id(2).rsplit(".", 1)[0], 79))
        + record(2, 9.0, xid_line(bus_id(2).rsplit(".", 1)[0], 45))  # the latest of GPU 2
    )
    made = [Sampler(NvmlCollector(), 1.0), Sampler(KernelLogCollector(kmsg=str(kmsg), procfs=str(procfs)), 1.0)]
    for sampler in made:
        sampler.sample_once()

    def arrived() -> bool:
        made[0].sample_once()
        return any(s.name == "accelmon_gpu_xid_errors_total" for s in made[0].state().latest.rows)

    wait_until(arrived, what="the NVML XID event")
    yield made, procfs
    fake_nvml.release()
    for sampler in made:
        sampler.collector.stop()


def compat_text(samplers) -> str:
    made, procfs = samplers
    compat = DcgmCompatCollector(procfs=str(procfs), hostname=lambda: "gpu-07")
    compat.watch(made)
    text = text_of(compat)
    promtool_check(text, allowed=DCGM_EXPORTER_NAMES)
    return text


def test_names_units_and_labels_are_dcgm_exporters(samplers):
    text = compat_text(samplers)
    labels = {
        "gpu": "1",
        "UUID": uuid(1),
        "pci_bus_id": "00000000:28:00.0",
        "device": f"nvidia{MINORS[1]}",  # the device node's minor, from the driver's procfs files
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-07",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    assert sample_value(text, "DCGM_FI_DEV_GPU_TEMP", **labels) == 41  # the fake's 40 + index, C
    assert sample_value(text, "DCGM_FI_DEV_SM_CLOCK", **labels) == 1740  # MHz
    assert sample_value(text, "DCGM_FI_DEV_POWER_USAGE", **labels) == pytest.approx(110.5)  # W
    assert sample_value(text, "DCGM_FI_DEV_GPU_UTIL", **labels) == 20  # %
    assert sample_value(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **labels) == 123456790  # mJ, exact
    assert sample_value(text, "DCGM_FI_DEV_FB_USED", GPU_I_ID="", **labels) == 2048  # MiB
    assert sample_value(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", **labels) == 1  # the fake's GPU 1
    # GPU 1 runs two MIG instances: each one's framebuffer, by GPU_I_ID, and its profile (the fake's are 1g.10gb).
    assert sample_value(text, "DCGM_FI_DEV_FB_USED", gpu="1", GPU_I_ID="2", GPU_I_PROFILE="1g.10gb") == 2048
    # The last XID: the kernel log's latest (45 after 79) on GPU 2; NVML's event on GPU 3; none on GPU 0.
    assert sample_value(text, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 45
    assert sample_value(text, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 31
    assert sample_value(text, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples and all(line.startswith("DCGM_FI_") for line in samples)  # DCGM's names only


def test_graphics_engine_activity_per_gpu_and_per_mig_instance(fake_nvml, tmp_path):
    """DCGM_FI_PROF_GR_ENGINE_ACTIVE, the profiling field dcgm-exporter's default counters and OpenShift's console read,
    from GPM's graphics utilization: per GPU, and under MIG per GPU instance with GPU_I_ID and GPU_I_PROFILE."""
    from accelmon.collectors.profiling import ProfilingCollector

    fake_nvml.configure("gpus 2\nmig 1 2\ngpm 0\ngpm 1\n")
    procfs = nvidia_procfs(tmp_path / "proc", gpus=2)
    profiling = ProfilingCollector(backend="gpm", interval=0.1)
    made = [Sampler(NvmlCollector(), 1.0), Sampler(profiling, 0.1)]
    try:
        for sampler in made:
            sampler.collector.start()
        time.sleep(0.25)  # one GPM window, both clocks past 100 ms
        for sampler in made:
            sampler.sample_once()
        text = compat_text((made, procfs))
    finally:
        for sampler in made:
            sampler.collector.stop()
    assert sample_value(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0", GPU_I_ID="") == pytest.approx(0.55)
    for instance, ratio in (("1", 0.61), ("2", 0.66)):  # the fake's 55 % + GPU + 5 % per instance id
        assert sample_value(
            text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="1", GPU_I_ID=instance, GPU_I_PROFILE="1g.10gb"
        ) == pytest.approx(ratio)
        assert sample_value(text, "DCGM_FI_PROF_SM_ACTIVE", gpu="1", GPU_I_ID=instance) == pytest.approx(ratio - 0.05)


def test_every_field_names_a_metric_accelmon_serves():
    from accelmon.catalogue import catalogues

    served = {spec.name for catalogue in catalogues() for spec in catalogue.specs}
    assert {row.source for row in FIELDS} <= served


def test_a_missing_source_leaves_its_fields_out(fake_nvml, tmp_path):
    compat = DcgmCompatCollector(procfs=str(tmp_path))
    compat.watch([])
    assert render(compat.sample()) == b""


@pytest.mark.parametrize(("flag", "own_served"), [("dcgm-exporter", True), ("dcgm-exporter-only", False)])
def test_dcgm_names_beside_or_instead_of_accelmons(fake_nvml_dir, tmp_path, flag, own_served):
    config = tmp_path / "fake.conf"
    config.write_text("gpus 2\n")
    result = run_once(["--compat", flag], exporter_env(fake_nvml_dir, config))
    assert result.returncode == 0, result.stderr
    promtool_check(result.stdout, allowed=DCGM_EXPORTER_NAMES)
    assert sample_value(result.stdout, "DCGM_FI_DEV_POWER_USAGE", gpu="1") is not None
    assert (sample_value(result.stdout, "accelmon_gpu_power_watts", gpu="1") is not None) == own_served
    # Instead of them, the device series are not served; they are still sampled: the health verdicts are there.
    assert sample_value(result.stdout, "accelmon_gpu_health_check_state", gpu="1", check="gpu_lost") is not None
    assert 'accelmon_collector_success{collector="nvml"} 1.0' in result.stdout


def test_amd_gpus_get_no_dcgm_names(fake_amdsmi):
    fake_amdsmi.configure("gpus 2\n")
    amd = Sampler(AmdCollector(), 1.0)
    amd.sample_once()
    compat = DcgmCompatCollector(procfs="/nonexistent")
    compat.watch([amd])
    assert "accelmon_gpu_power_watts" in text_of(amd.state().latest)
    assert render(compat.sample()) == b""
    amd.collector.stop()


# The queries of dcgm-exporter's Grafana dashboard (grafana.com 12239, "NVIDIA DCGM Exporter Dashboard") and of
# alert rules commonly published for DCGM, written from their public documentation with Grafana's variables at
# "All"; each beside the accelmon query that must answer the same per GPU.
DASHBOARD_AND_ALERTS = [
    ("DCGM_FI_DEV_GPU_TEMP", "accelmon_gpu_temperature_celsius"),
    ("avg(DCGM_FI_DEV_GPU_TEMP)", "avg(accelmon_gpu_temperature_celsius)"),
    ("DCGM_FI_DEV_POWER_USAGE", "accelmon_gpu_power_watts"),
    ("sum(DCGM_FI_DEV_POWER_USAGE)", "sum(accelmon_gpu_power_watts)"),
    ("DCGM_FI_DEV_SM_CLOCK * 1000000", "accelmon_gpu_sm_clock_hertz"),
    ("DCGM_FI_DEV_MEM_CLOCK * 1000000", "accelmon_gpu_memory_clock_hertz"),
    ("DCGM_FI_DEV_GPU_UTIL", "accelmon_gpu_utilization_ratio * 100"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "accelmon_gpu_memory_utilization_ratio * 100"),
    ("DCGM_FI_DEV_FB_USED", "accelmon_gpu_memory_used_bytes / 1048576"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "accelmon_gpu_tensor_active_ratio"),
    ("DCGM_FI_PROF_SM_ACTIVE", "accelmon_gpu_sm_active_ratio"),
    ("DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0",
     "accelmon_gpu_memory_used_bytes / (accelmon_gpu_memory_used_bytes + accelmon_gpu_memory_free_bytes) > 0"),
    ("DCGM_FI_DEV_GPU_TEMP > 40", "accelmon_gpu_temperature_celsius > 40"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL >= 0", "accelmon_gpu_ecc_errors_total{type=\"uncorrected\",scope=\"volatile\"}"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE >= 0", "accelmon_gpu_remapped_rows_failure"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "accelmon_gpu_pcie_replays_total"),
]  # fmt: skip


def by_gpu(base: str, query: str) -> dict[str, float]:
    answer = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query}))["data"]["result"]
    return {r["metric"].get("gpu", ""): round(float(r["value"][1]), 3) for r in answer}


@pytest.mark.parametrize(("dcgm", "ours"), DASHBOARD_AND_ALERTS)
def test_dcgm_dashboard_and_alert_queries_answer_what_accelmon_says(prometheus, dcgm, ours):
    answered = by_gpu(prometheus, dcgm)
    assert answered, f"{dcgm}: no data"
    assert answered == by_gpu(prometheus, ours)


def test_the_last_xid_alert_names_the_gpu_and_code_accelmon_logged(prometheus):
    """`DCGM_FI_DEV_XID_ERRORS > 0`, the XID alert most DCGM rule sets carry: the GPU whose kernel log has the XID
    (the simulated node's GPU 2, XID 79), with its code as the value."""
    logged = get(f"{prometheus}/api/v1/query?query=accelmon_gpu_kernel_xid_last_timestamp_seconds")["data"]["result"]
    expected = {r["metric"]["gpu"]: float(r["metric"]["xid"]) for r in logged}
    assert expected == {"2": 79.0}
    assert by_gpu(prometheus, "DCGM_FI_DEV_XID_ERRORS > 0") == expected


def test_what_replace_own_hides_is_derived_from_the_registrations():
    from accelmon.collectors.dcgm_compat import replaced_collectors

    assert replaced_collectors() == ("nvml", "profiling")
    assert DcgmCompatCollector(replace_own=True).replaces == ("nvml", "profiling")
    assert DcgmCompatCollector().replaces == ()


def test_golden(samplers):
    check_golden("dcgm_compat_h100x4.prom", compat_text(samplers))
