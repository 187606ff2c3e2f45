"""dcgm-exporter's names, for dashboards and alert rules written against it: the `DCGM_FI_*` series of
dcgm-exporter's default counter set (and the common profiling and ECC fields), in its units and with its labels,
made from the samples the other collectors already took (no hardware read of its own).

Example exposition line::

    DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="580.159.04",Hostname="gpu-07",UUID="GPU-…",device="nvidia0",gpu="0",
    modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0"} 41

Off by default (`--compat dcgm-exporter`, config `collectors.dcgm_compat.enabled: true`); served beside accelmon's
own names. dcgm-exporter types its cumulative fields as counters without `_total`
(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION): they are served under those exact names, typed gauge, since a counter's
name must end in `_total`; PromQL's rate() and increase() read them alike. The mapping is the table FIELDS below,
one row per field, each from NVIDIA's DCGM field documentation (dcgm_fields.h; dcgm-exporter's
etc/default-counters.csv and etc/dcp-metrics-included.csv for the units it serves). docs/metrics.md lists it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from accelmon.collectors import collectors
from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples
from accelmon.exporter.registry import Option, Registration, never, register, seconds
from accelmon.exporter.runtime import Collector, Sampler
from accelmon.host.nvidia import driver_gpu_entries

MIB = 2**20
# dcgm-exporter's labels (MIG's GPU_I_ID and GPU_I_PROFILE empty outside MIG, which Prometheus reads as absent).
LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
LABELS += ("GPU_I_ID", "GPU_I_PROFILE")
INTERVAL = seconds("interval_seconds", 1, "how often the DCGM_FI_* series are made from the latest samples")
REPLACE_OWN = Option(
    "replace_own",
    False,
    "serve the DCGM_FI_* series instead of the nvml and profiling collectors' own (still sampled: the health checks "
    "read them); for sites that keep only dcgm-exporter's dashboards and rules (accelmon's read its own names)",
)
C = Catalogue(
    "dcgm_compat",
    "dcgm-exporter compatible names",
    "Made from the nvml, profiling and kernel_log collectors' latest samples (no hardware reads). Each row: the "
    "DCGM field (dcgm_fields.h), what it is made from, and the conversion into dcgm-exporter's unit. Labels as "
    "dcgm-exporter's: gpu, UUID, pci_bus_id, device (nvidia<minor>), modelName, Hostname, DCGM_FI_DRIVER_VERSION, "
    "and for a MIG instance GPU_I_ID and GPU_I_PROFILE (its profile, 1g.10gb): its memory used and, from GPM, its "
    "graphics engine, SM, tensor and DRAM activity.",
)


@dataclass(frozen=True)
class Field:
    spec: MetricSpec
    source: str  # accelmon metric
    scale: float = 1.0
    match: tuple[tuple[str, str], ...] = ()  # labels the source series must have (ECC type and scope, cause)


def field(name: str, text: str, source: str, scale: float = 1.0, **match: str) -> Field:
    where = ", ".join(f'{k}="{v}"' for k, v in match.items())
    conversion = "" if scale == 1 else f" x {scale:g}" if scale > 1 else f" / {1 / scale:g}"
    made_of = f"`{source}{{{where}}}`" if where else f"`{source}`"
    return Field(C.gauge(name, f"{text} (from {made_of}{conversion})", LABELS), source, scale, tuple(match.items()))


# dcgm-exporter's default counter set first, then the profiling (DCP) fields and the ECC and retirement fields
# common alert rules use. Units: MHz, C, W, mJ, %, MiB as dcgm-exporter serves each.
FIELDS = (
    field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)", "accelmon_gpu_sm_clock_hertz", 1e-6),
    field("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)", "accelmon_gpu_memory_clock_hertz", 1e-6),
    field("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)", "accelmon_gpu_memory_temperature_celsius"),
    field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)", "accelmon_gpu_temperature_celsius"),
    field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", "accelmon_gpu_power_watts"),
    field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since the driver loaded (in mJ; a counter)",
        "accelmon_gpu_energy_joules_total",
        1e3,
    ),
    field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries (a counter)", "accelmon_gpu_pcie_replays_total"
    ),
    field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", "accelmon_gpu_utilization_ratio", 100),
    field("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)", "accelmon_gpu_memory_utilization_ratio", 100),
    field("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %)", "accelmon_gpu_encoder_utilization_ratio", 100),
    field("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %)", "accelmon_gpu_decoder_utilization_ratio", 100),
    field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)", "accelmon_gpu_memory_free_bytes", 1 / MIB),
    field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)", "accelmon_gpu_memory_used_bytes", 1 / MIB),
    field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors (a counter)",
        "accelmon_gpu_remapped_rows_total",
        cause="uncorrectable",
    ),
    field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors (a counter)",
        "accelmon_gpu_remapped_rows_total",
        cause="correctable",
    ),
    field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "accelmon_gpu_remapped_rows_failure"
    ),
    field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W)", "accelmon_gpu_power_limit_watts"),
    field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Single-bit volatile ECC errors (a counter)",
        "accelmon_gpu_ecc_errors_total",
        type="corrected",
        scope="volatile",
    ),
    field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Double-bit volatile ECC errors (a counter)",
        "accelmon_gpu_ecc_errors_total",
        type="uncorrected",
        scope="volatile",
    ),
    field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Single-bit persistent ECC errors (a counter)",
        "accelmon_gpu_ecc_errors_total",
        type="corrected",
        scope="aggregate",
    ),
    field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Double-bit persistent ECC errors (a counter)",
        "accelmon_gpu_ecc_errors_total",
        type="uncorrected",
        scope="aggregate",
    ),
    field(
        "DCGM_FI_DEV_RETIRED_SBE",
        "Pages retired for single-bit errors",
        "accelmon_gpu_retired_pages_total",
        cause="single_bit",
    ),
    field(
        "DCGM_FI_DEV_RETIRED_DBE",
        "Pages retired for double-bit errors",
        "accelmon_gpu_retired_pages_total",
        cause="double_bit",
    ),
    field("DCGM_FI_DEV_RETIRED_PENDING", "Pages pending retirement", "accelmon_gpu_retired_pages_pending"),
    field("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation", "accelmon_gpu_pcie_link_generation"),
    field("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes)", "accelmon_gpu_pcie_link_width"),
    field(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "Throttling duration due to power constraints (in us; a counter)",
        "accelmon_gpu_power_violation_seconds_total",
        1e6,
    ),
    field(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "Throttling duration due to thermal constraints (in us; a counter)",
        "accelmon_gpu_thermal_violation_seconds_total",
        1e6,
    ),
    field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active",
        "accelmon_gpu_graphics_engine_active_ratio",
    ),
    field(
        "DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned", "accelmon_gpu_sm_active_ratio"
    ),
    field("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident to the maximum", "accelmon_gpu_sm_occupancy_ratio"),
    field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active",
        "accelmon_gpu_tensor_active_ratio",
    ),
    field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data",
        "accelmon_gpu_dram_active_ratio",
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active", "accelmon_gpu_fp64_active_ratio"
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active", "accelmon_gpu_fp32_active_ratio"
    ),
    field(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active", "accelmon_gpu_fp16_active_ratio"
    ),
    field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in B/s)",
        "accelmon_gpu_profiling_pcie_transmit_bytes_per_second",
    ),
    field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in B/s)",
        "accelmon_gpu_profiling_pcie_receive_bytes_per_second",
    ),
    field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "The rate of data transmitted over NVLink (in B/s)",
        "accelmon_gpu_profiling_nvlink_transmit_bytes_per_second",
    ),
    field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "The rate of data received over NVLink (in B/s)",
        "accelmon_gpu_profiling_nvlink_receive_bytes_per_second",
    ),
)
XID = C.gauge(
    "DCGM_FI_DEV_XID_ERRORS",
    "Value of the last XID error encountered, 0 if none (from the kernel log's "
    "`accelmon_gpu_kernel_xid_last_timestamp_seconds`, the latest; else the highest code of NVML's "
    "`accelmon_gpu_xid_errors_total`)",
    LABELS,
)
# Per MIG instance, as dcgm-exporter serves them under MIG: (DCGM field's spec, accelmon's per-instance source, scale).
MIG_FIELDS = tuple(
    (next(row.spec for row in FIELDS if row.spec.name == name), source, scale)
    for name, source, scale in (
        ("DCGM_FI_DEV_FB_USED", "accelmon_gpu_mig_memory_used_bytes", 1 / MIB),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "accelmon_gpu_mig_graphics_engine_active_ratio", 1.0),
        ("DCGM_FI_PROF_SM_ACTIVE", "accelmon_gpu_mig_sm_active_ratio", 1.0),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "accelmon_gpu_mig_tensor_active_ratio", 1.0),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "accelmon_gpu_mig_dram_active_ratio", 1.0),
    )
)


class DcgmCompatCollector(Collector):
    name = "dcgm_compat"
    reads_other_samples = True

    def __init__(
        self, procfs: str = "/proc", hostname: Callable[[], str] = socket.gethostname, replace_own: bool = False
    ) -> None:
        self.procfs = procfs
        self.replaces = replaced_collectors() if replace_own else ()
        self.hostname = hostname
        self.sources: list[Sampler] = []
        self._minors: Optional[dict[str, str]] = None

    def watch(self, samplers: list[Sampler]) -> None:
        self.sources = [sampler for sampler in samplers if sampler.collector is not self]

    def _minor_of(self, bus: str) -> str:
        """The device minor of a GPU by its bus id (NVML `00000000:18:00.0`), from the driver's procfs files."""
        if self._minors is None:
            self._minors = {
                b[-12:].lower(): fields.get("Device Minor", "") for b, _, fields in driver_gpu_entries(self.procfs)
            }
        return self._minors.get(bus[-12:].lower(), "")

    def sample(self) -> Samples:
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for sampler in self.sources:
            latest = sampler.state().latest
            if latest is None:
                continue
            for spec, rows in latest.rows.items():
                by_name.setdefault(spec.name, []).extend((dict(zip(spec.labels, v)), value) for v, value in rows)
        host = self.hostname()
        identity: dict[str, tuple[str, ...]] = {}  # gpu index -> dcgm-exporter's labels but the MIG ones
        for labels, _ in by_name.get("accelmon_gpu_info", []):
            if labels.get("vendor", "nvidia") != "nvidia":
                continue  # DCGM's names are NVIDIA's: an AMD GPU (collector amd) has none
            minor = self._minor_of(labels.get("pci_bus_id", ""))
            identity[labels["gpu"]] = (
                labels["gpu"],
                labels.get("uuid", ""),
                labels.get("pci_bus_id", ""),
                f"nvidia{minor or labels['gpu']}",
                labels.get("name", ""),
                host,
                labels.get("driver_version", ""),
            )
        out = Samples()
        for row in FIELDS:
            for labels, value in by_name.get(row.source, []):
                ids = identity.get(labels.get("gpu", ""))
                if ids is None or any(labels.get(k) != v for k, v in row.match):
                    continue
                # Rounded as dcgm-exporter's integers are: 123456.79 J is 123456790 mJ, not ...790.0000001.
                out.add(row.spec, [*ids, "", ""], round(value * row.scale, 6))
        profiles = {
            (labels.get("gpu", ""), labels.get("gpu_instance_id", "")): labels.get("profile", "")
            for labels, _ in by_name.get("accelmon_gpu_mig_instance_info", [])
        }
        for spec, source, scale in MIG_FIELDS:
            for labels, value in by_name.get(source, []):
                ids = identity.get(labels.get("gpu", ""))
                if ids is not None:
                    instance = labels.get("gpu_instance_id", "")
                    profile = profiles.get((labels.get("gpu", ""), instance), "")
                    out.add(spec, [*ids, instance, profile], round(value * scale, 6))
        for gpu, ids in identity.items():
            out.add(XID, [*ids, "", ""], last_xid(by_name, gpu))
        return out


def replaced_collectors() -> tuple[str, ...]:
    """The collectors whose series the DCGM names stand for, hidden from scrapes with replace_own: those whose
    catalogue declares a source of FIELDS (nvml, profiling), found in their registrations, not listed here. A
    collector that only shares such a series (amd) keeps it: DCGM's names stand for NVIDIA's GPUs alone."""
    sources = {row.source for row in FIELDS}
    owned = {name: set(r.catalogue.specs) - set(r.catalogue.shared) for name, r in collectors().items()}
    return tuple(name for name, specs in owned.items() if any(spec.name in sources for spec in specs))


def last_xid(by_name: dict[str, list[tuple[dict[str, str], float]]], gpu: str) -> float:
    """The GPU's latest XID in the kernel log; else the highest code NVML's events counted; 0 if none."""
    kernel = by_name.get("accelmon_gpu_kernel_xid_last_timestamp_seconds", [])
    logged = [(when, int(labels["xid"])) for labels, when in kernel if labels.get("gpu") == gpu]
    if logged:
        return float(max(logged)[1])
    events = by_name.get("accelmon_gpu_xid_errors_total", [])
    return float(max((int(labels["xid"]) for labels, n in events if labels.get("gpu") == gpu and n > 0), default=0))


REGISTRATION = register(
    Registration(
        name="dcgm_compat",
        help="dcgm-exporter's DCGM_FI_* names beside accelmon's, from the same samples (default: off)",
        build=lambda options, paths: DcgmCompatCollector(procfs=paths.procfs, replace_own=options["replace_own"]),
        catalogue=C,
        options=(INTERVAL, REPLACE_OWN),
        enabled_by_default=never,
    )
)
