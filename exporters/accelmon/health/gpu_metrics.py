"""The GPU device series: what a GPU says about itself, served under the same names by NVIDIA's `nvml` collector
(which owns this catalogue and serves every one) and AMD's `amd` collector (the ones amdsmi has), so that
dashboards, alerts and health checks read one set of names whatever the vendor. Read schedules and conversions are
NVML's (docs/hardware.md); AMD's collector documents its own. The checks over these series are here too, declared
by the nvml collector's registration (they judge AMD's GPUs through the same names).
"""

from __future__ import annotations

from accelmon.exporter.checks import Check, Drill, Gpu, GpuCheck, View
from accelmon.exporter.metrics import Catalogue
from accelmon.exporter.validation import Option, seconds

GPU = ("gpu", "uuid")
# How often each value is read, by what it costs and how fast it moves (CPU per call measured on an H100,
# docs/hardware.md). Cheap, fast-moving values every interval; counters and rarely changing values on the
# slow schedule (the energy counter alone costs 4 ms of CPU; a slower read of a counter only coarsens rate(),
# it loses nothing); identity and maximum clocks once per GPU.
SLOW = "every slow interval"
ONCE = "once per GPU"
PCIE = "every PCIe interval, own thread"
EVENT = "as events arrive, own thread"
INTERVAL = seconds("interval_seconds", 1, "how often the cheap, fast-moving values are read")
# Counters and slow values (energy alone: 4 ms CPU per read on an H100) every 30 s, as dcgm-exporter collects; also
# what moves only on an operator's action or at a workload's start or end (power limit, memory clock, process count),
# the HBM temperature (a field read, with the counters' one call) and the video engines.
SLOW_INTERVAL = seconds(
    "slow_interval_seconds", 30, "how often counters and rarely changing values are read (served from cache between)"
)
# PCIe throughput costs 0.7 ms of CPU and 20 ms of waiting per direction per GPU.
PCIE_INTERVAL = seconds("pcie_interval_seconds", 30, "how often PCIe throughput is read, on its own thread")
WATCH_XIDS = Option("xid_events", True, "count XID errors as NVML reports them (a thread waiting on events)")
CATALOGUE = Catalogue(
    "nvml",
    "NVIDIA GPU device counters (NVML)",
    "Source: NVML through nvidia-ml-py. Conversions: percent to ratio (/100), mW to W, mJ to J, MHz to Hz, "
    "KiB/s to bytes/s (PCIe throughput), ns to s (violation time). A field NVML does not support on a GPU "
    "(NotSupported, FunctionNotFound, NoPermission) has no series for that GPU. XID counts start at 0 when "
    "the exporter starts. Read schedule (column *read*; CPU per call measured on an H100, driver 580): cheap, "
    f"fast-moving values every `interval_seconds` ({INTERVAL.default:g} s); counters and rarely changing values "
    f"every `slow_interval_seconds` ({SLOW_INTERVAL.default:g} s, as dcgm-exporter collects: the energy counter "
    "alone costs 4 ms of CPU per read, the two violation counters 0.8 ms each; a counter read less often stays "
    "exact, only `rate()` gets coarser; also the power limit, memory clock and process count, which move only on an "
    "operator's action or a workload's start or end, the HBM temperature and the video engines) and served from "
    "that read in between; identity and maximum clocks once per "
    f"GPU; PCIe throughput every `pcie_interval_seconds` ({PCIE_INTERVAL.default:g} s, 0.7 ms of CPU and 20 ms of "
    "waiting per direction) on its own thread.",
)
C = CATALOGUE
INFO = C.gauge(
    "accelmon_gpu_info",
    "Identity of a GPU (vendor: nvidia or amd, whose collector serves it); value is 1.",
    [*GPU, "name", "pci_bus_id", "serial", "vbios_version", "driver_version", "cuda_compute_capability", "vendor"],
    read=ONCE,
)
UP = C.gauge(
    "accelmon_gpu_up",
    "1 if the GPU answers its driver library (NVML, amdsmi), 0 once it is lost (NVML: GpuIsLost).",
    GPU,
)
UTILIZATION = C.gauge("accelmon_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran (0..1).", GPU)
MEMORY_UTILIZATION = C.gauge(
    "accelmon_gpu_memory_utilization_ratio",
    "Fraction of the last sample period device memory was read or written.",
    GPU,
)
MEMORY_USED = C.gauge("accelmon_gpu_memory_used_bytes", "Device memory in use.", GPU)
MEMORY_FREE = C.gauge("accelmon_gpu_memory_free_bytes", "Device memory free.", GPU)
MEMORY_TOTAL = C.gauge("accelmon_gpu_memory_total_bytes", "Device memory installed.", GPU)
MEMORY_RESERVED = C.gauge(
    "accelmon_gpu_memory_reserved_bytes", "Device memory reserved by the driver and firmware.", GPU
)
BAR1_USED = C.gauge("accelmon_gpu_bar1_memory_used_bytes", "BAR1 memory in use.", GPU, read=SLOW)
BAR1_TOTAL = C.gauge("accelmon_gpu_bar1_memory_total_bytes", "BAR1 memory size.", GPU, read=SLOW)
TEMPERATURE = C.gauge("accelmon_gpu_temperature_celsius", "GPU die temperature (AMD: hotspot).", GPU)
MEMORY_TEMPERATURE = C.gauge("accelmon_gpu_memory_temperature_celsius", "HBM temperature.", GPU, read=SLOW)
POWER = C.gauge("accelmon_gpu_power_watts", "Power draw (AMD: socket power).", GPU)
POWER_LIMIT = C.gauge("accelmon_gpu_power_limit_watts", "Enforced power limit.", GPU, read=SLOW)
ENERGY = C.counter(
    "accelmon_gpu_energy_joules_total",
    "Energy used since the driver was loaded.",
    GPU,
    read=SLOW,
)
SM_CLOCK = C.gauge("accelmon_gpu_sm_clock_hertz", "Current SM clock (AMD: GFX clock).", GPU)
MEMORY_CLOCK = C.gauge("accelmon_gpu_memory_clock_hertz", "Current memory clock.", GPU, read=SLOW)
SM_CLOCK_MAX = C.gauge("accelmon_gpu_sm_clock_max_hertz", "Maximum SM clock.", GPU, read=ONCE)
MEMORY_CLOCK_MAX = C.gauge("accelmon_gpu_memory_clock_max_hertz", "Maximum memory clock.", GPU, read=ONCE)
PSTATE = C.gauge("accelmon_gpu_performance_state", "Performance state: 0 (P0, maximum) to 15 (P15, minimum).", GPU)
FAN = C.gauge("accelmon_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (only GPUs with fans).", GPU)
ENCODER = C.gauge("accelmon_gpu_encoder_utilization_ratio", "Video encoder utilization (0..1).", GPU, read=SLOW)
DECODER = C.gauge("accelmon_gpu_decoder_utilization_ratio", "Video decoder utilization (0..1).", GPU, read=SLOW)
PROCESSES = C.gauge("accelmon_gpu_compute_processes", "Compute processes running on the GPU.", GPU, read=SLOW)
ECC = C.counter(
    "accelmon_gpu_ecc_errors_total",
    "ECC errors; scope volatile counts since the driver loaded, aggregate over the GPU's life.",
    [*GPU, "type", "scope"],
    read=SLOW,
)
RETIRED_PAGES = C.counter(
    "accelmon_gpu_retired_pages_total",
    "Memory pages retired, by cause (single_bit or double_bit).",
    [*GPU, "cause"],
    read=SLOW,
)
RETIRED_PENDING = C.gauge(
    "accelmon_gpu_retired_pages_pending", "1 if pages are waiting to be retired at next reset.", GPU, read=SLOW
)
REMAPPED_ROWS = C.counter(
    "accelmon_gpu_remapped_rows_total",
    "Memory rows remapped, by cause (correctable or uncorrectable).",
    [*GPU, "cause"],
    read=SLOW,
)
REMAP_PENDING = C.gauge(
    "accelmon_gpu_remapped_rows_pending", "1 if a row remapping waits for a GPU reset.", GPU, read=SLOW
)
REMAP_FAILURE = C.gauge(
    "accelmon_gpu_remapped_rows_failure", "1 if a row remapping failed (GPU needs service).", GPU, read=SLOW
)
PCIE_REPLAYS = C.counter(
    "accelmon_gpu_pcie_replays_total", "PCIe replay events (link retransmissions).", GPU, read=SLOW
)
PCIE_GENERATION = C.gauge(
    "accelmon_gpu_pcie_link_generation",
    "PCIe generation the link runs at now (GPUs drop to a lower one when idle, to save power).",
    GPU,
    read=SLOW,
)
PCIE_GENERATION_MAX = C.gauge(
    "accelmon_gpu_pcie_link_generation_max",
    "Highest PCIe generation this GPU and its slot allow together.",
    GPU,
    read=ONCE,
)
PCIE_WIDTH = C.gauge("accelmon_gpu_pcie_link_width", "PCIe lanes the link trained at now.", GPU, read=SLOW)
PCIE_WIDTH_MAX = C.gauge(
    "accelmon_gpu_pcie_link_width_max", "Most PCIe lanes this GPU and its slot allow together.", GPU, read=ONCE
)
PCIE_TX = C.gauge(
    "accelmon_gpu_pcie_transmit_bytes_per_second",
    "PCIe bytes sent per second over NVML's 20 ms window (NVML reports KiB/s); sampled at the PCIe interval.",
    GPU,
    read=PCIE,
)
PCIE_RX = C.gauge(
    "accelmon_gpu_pcie_receive_bytes_per_second", "PCIe bytes received per second (see transmit).", GPU, read=PCIE
)
CLOCK_EVENT = C.gauge(
    "accelmon_gpu_clock_event_active",
    "1 if the clock-event (throttle) reason is active now, else 0.",
    [*GPU, "reason"],
)
POWER_VIOLATION = C.counter(
    "accelmon_gpu_power_violation_seconds_total",
    "Time clocks were held down by the power limit (NVML: ns).",
    GPU,
    read=SLOW,
)
THERMAL_VIOLATION = C.counter(
    "accelmon_gpu_thermal_violation_seconds_total", "Time clocks were held down by the thermal limit.", GPU, read=SLOW
)
XID_ERRORS = C.counter(
    "accelmon_gpu_xid_errors_total",
    "XID critical error events seen since the exporter started, by XID code.",
    [*GPU, "xid"],
    read=EVENT,
)
XID_EVENTS = C.counter(
    "accelmon_gpu_xid_events_total",
    "XID critical error events of any code since the exporter started (present from 0 so increase() sees the first).",
    GPU,
    read=EVENT,
)
MIG_MODE = C.gauge("accelmon_gpu_mig_mode_enabled", "1 if MIG mode is on.", GPU, read=SLOW)
MIG_INFO = C.gauge(
    "accelmon_gpu_mig_instance_info",
    "A MIG device of the GPU, with its GPU instance profile as NVIDIA names it (1g.10gb; dcgm-exporter's "
    "GPU_I_PROFILE); value is 1.",
    [*GPU, "gpu_instance_id", "mig_uuid", "profile"],
    read=SLOW,
)
MIG_MEMORY_USED = C.gauge(
    "accelmon_gpu_mig_memory_used_bytes", "Memory used in a MIG device.", [*GPU, "gpu_instance_id"], read=SLOW
)
MIG_MEMORY_TOTAL = C.gauge(
    "accelmon_gpu_mig_memory_total_bytes", "Memory of a MIG device.", [*GPU, "gpu_instance_id"], read=SLOW
)


# Clock-event reasons that mean the hardware slowed the GPU down (not the idle or application-clock ones).
# NVIDIA's, then AMD's (accelmon.collectors.amd.THROTTLE_BITS).
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "thermal_limit",
    "prochot",
)


def check_lost(view: View, gpu: Gpu, now: float) -> Check:
    up = view.value(UP, gpu)
    if up == 0:
        return Check(
            "gpu_lost", "failure", "the GPU stopped answering its driver library (NVML, amdsmi)", "reboot_node"
        )
    if up is None and view.of(UP):
        return Check("gpu_lost", "failure", "the driver lists the GPU, its library (NVML) does not", "reboot_node")
    return Check("gpu_lost", "ok", "answers its driver library")


def check_ecc(view: View, gpu: Gpu, now: float) -> Check:
    uncorrected = view.value(ECC, gpu, type="uncorrected", scope="volatile")
    if uncorrected:
        return Check("ecc", "failure", f"{uncorrected:g} uncorrectable ECC errors since the driver loaded", "reset_gpu")
    return Check("ecc", "ok", "no uncorrectable ECC error" if uncorrected is not None else "ECC not reported")


def check_memory_repair(view: View, gpu: Gpu, now: float) -> Check:
    if view.value(REMAP_FAILURE, gpu) == 1:
        return Check("memory_repair", "failure", "a row remapping failed", "hardware_service")
    if view.value(REMAP_PENDING, gpu) == 1:
        return Check("memory_repair", "warning", "a row remapping waits for a GPU reset", "reset_gpu")
    if view.value(RETIRED_PENDING, gpu) == 1:
        return Check("memory_repair", "warning", "a page retirement waits for a GPU reset", "reset_gpu")
    return Check("memory_repair", "ok", "no remapping or retirement pending or failed")


def check_slowdown(view: View, gpu: Gpu, now: float) -> Check:
    """Now, as sampled: the alert on the served state asks for it to last (`for:`)."""
    active = [
        labels["reason"]
        for labels, value in view.of(CLOCK_EVENT, gpu)
        if value == 1 and labels.get("reason") in SLOWDOWN_REASONS
    ]
    if active:
        return Check("slowdown", "warning", "clocks held down: " + ", ".join(sorted(active)), "hardware_service")
    return Check("slowdown", "ok", "no thermal or power slowdown")


def check_pcie(view: View, gpu: Gpu, now: float) -> Check:
    """A link trained below what the GPU and its slot allow halves its bandwidth per step. Fewer lanes is a
    fault (a badly seated GPU or riser); a lower generation is one only while the GPU works: GPUs drop their link
    speed when idle, to save power."""
    width, width_max = (
        view.value(PCIE_WIDTH, gpu),
        view.value(PCIE_WIDTH_MAX, gpu),
    )
    generation = view.value(PCIE_GENERATION, gpu)
    generation_max = view.value(PCIE_GENERATION_MAX, gpu)
    idle = view.value(CLOCK_EVENT, gpu, reason="gpu_idle") == 1
    degraded = []
    if width is not None and width_max and width < width_max:
        degraded.append(f"x{width:g} of x{width_max:g}")
    if generation is not None and generation_max and generation < generation_max and not idle:
        degraded.append(f"Gen{generation:g} of Gen{generation_max:g} while busy")
    if degraded:
        return Check("pcie", "warning", "PCIe link degraded: " + ", ".join(degraded), "hardware_service")
    if width is None and generation is None:
        return Check("pcie", "ok", "PCIe link not reported")
    return Check("pcie", "ok", "PCIe link at its full width" + (" (idle: lower generation is normal)" if idle else ""))


def drill_lost(view: View, gpu: Gpu, xid: int, started: float) -> None:
    view.put(UP, gpu, 0)


def drill_ecc(view: View, gpu: Gpu, xid: int, started: float) -> None:
    view.put(ECC, gpu, 1, type="uncorrected", scope="volatile")


def drill_slowdown(view: View, gpu: Gpu, xid: int, started: float) -> None:
    view.put(CLOCK_EVENT, gpu, 1, reason="hw_slowdown")


def drill_pcie(view: View, gpu: Gpu, xid: int, started: float) -> None:
    """Half its lanes: a GPU reseated badly or a riser that lost lanes."""
    widest = view.value(PCIE_WIDTH_MAX, gpu) or 16
    view.put(PCIE_WIDTH_MAX, gpu, widest)
    view.put(PCIE_WIDTH, gpu, widest // 2)


DEVICE_DRILLS = (
    Drill("gpu_lost", drill_lost),
    Drill("ecc", drill_ecc),
    Drill("slowdown", drill_slowdown),
    Drill("pcie", drill_pcie),
)

DEVICE_CHECKS = (
    GpuCheck(
        "gpu_lost",
        check_lost,
        source="`accelmon_gpu_up`; the driver's procfs GPU list",
        failure="the GPU stopped answering NVML (or amdsmi), or the driver lists a GPU NVML does not (`reboot_node`)",
    ),
    GpuCheck(
        "ecc",
        check_ecc,
        source='`accelmon_gpu_ecc_errors_total{type="uncorrected",scope="volatile"}`',
        failure="any since the driver loaded (`reset_gpu`)",
    ),
    GpuCheck(
        "memory_repair",
        check_memory_repair,
        source="remapped rows, retired pages",
        failure="a row remapping failed (`hardware_service`)",
        warning="a remapping or retirement waits for a reset (`reset_gpu`)",
    ),
    GpuCheck(
        "slowdown",
        check_slowdown,
        source="`accelmon_gpu_clock_event_active`",
        warning=(
            "hardware, thermal or power-brake slowdown now; on AMD a thermal limit or PROCHOT "
            "(`hardware_service`); the alert waits 15 minutes"
        ),
    ),
    GpuCheck(
        "pcie",
        check_pcie,
        source="`accelmon_gpu_pcie_link_{generation,width}` and their `_max`",
        warning=(
            "fewer lanes than the GPU and slot allow, or a lower generation while the GPU is not idle "
            "(`hardware_service`)"
        ),
    ),
)
