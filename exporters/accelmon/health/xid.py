"""What an XID or SXid means and what to do about it: one declarative table, read by the kernel-log collector,
the health checks, `--scan`, the alert rules (through `accelmon_xid_catalogue_info`) and docs/health.md.

Sources (public): NVIDIA's Xid catalog for Ampere and newer GPUs, "Resolution Bucket (Immediate Action)" column
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), and the XID listing of the GPU debug
guidelines (https://docs.nvidia.com/deploy/xid-errors/index.html). Their buckets map onto our actions:
RESTART_APP -> restart_app, RESET_GPU -> reset_gpu, RESTART_BM -> reboot_node, CONTACT_SUPPORT as the immediate
action -> hardware_service, IGNORE -> none; NVLink XIDs are given check_fabric, the catalog's investigatory step.
Severity is ours: `critical` where the GPU cannot be trusted until the action is taken, `warning` where the error
was the application's or contained to it, `info` for follow-on reports.

SXids (NVSwitch) are not named one by one: the driver prints each with the word `Fatal` or `Non-fatal`
(Fabric Manager user guide, appendix D), which gives the severity; a fatal SXid takes the fabric down until the
switch trays are reset, so its action is check_fabric.
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("info", "warning", "critical")
# Ordered from the least to the most disruptive; a GPU with several asks for the most disruptive one.
ACTIONS = ("none", "restart_app", "check_fabric", "reset_gpu", "reboot_node", "hardware_service")


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str  # a short snake_case name: a label value, bounded by this table
    severity: str
    action: str
    meaning: str  # one line for people (docs, --scan); never a label

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or self.action not in ACTIONS:
            raise ValueError(f"XID {self.code}: severity {self.severity!r} or action {self.action!r} unknown")


def _table(*rows: tuple[int, str, str, str, str]) -> dict[int, XidInfo]:
    return {row[0]: XidInfo(*row) for row in rows}


XIDS = _table(
    (8, "gpu_stopped_processing", "warning", "restart_app", "A channel stopped processing (idle timeout)."),
    (
        13,
        "graphics_engine_exception",
        "warning",
        "restart_app",
        "The application's kernel faulted (bad address, illegal instruction).",
    ),
    (31, "gpu_memory_page_fault", "warning", "restart_app", "The application touched memory it does not own."),
    (32, "corrupted_push_buffer", "warning", "restart_app", "Invalid or corrupted push buffer stream."),
    (43, "gpu_stopped_processing", "warning", "restart_app", "A channel was reset after the application faulted."),
    (45, "preemptive_cleanup", "info", "none", "Channels cleaned up after an earlier error: see that error."),
    (48, "double_bit_ecc_error", "critical", "reset_gpu", "An uncorrectable (double-bit) ECC error in GPU memory."),
    (61, "microcontroller_breakpoint", "critical", "reset_gpu", "An internal micro-controller hit a breakpoint."),
    (62, "microcontroller_halt", "critical", "reset_gpu", "An internal micro-controller halted."),
    (63, "row_remap_pending", "warning", "reset_gpu", "A memory row was marked for remapping: a GPU reset applies it."),
    (64, "row_remap_failure", "critical", "reset_gpu", "Recording a row remapping or page retirement failed."),
    (68, "video_decoder_exception", "warning", "restart_app", "The video decoder (NVDEC) faulted."),
    (69, "graphics_class_error", "warning", "restart_app", "The graphics engine rejected a method of the application."),
    (74, "nvlink_error", "critical", "check_fabric", "An NVLink error: the link may be down or retraining."),
    (79, "fallen_off_the_bus", "critical", "reboot_node", "The GPU stopped answering on PCIe (fallen off the bus)."),
    (92, "high_single_bit_ecc_rate", "warning", "hardware_service", "Corrected ECC errors at a high rate."),
    (94, "contained_ecc_error", "warning", "restart_app", "An uncorrectable ECC error contained to one application."),
    (95, "uncontained_ecc_error", "critical", "reset_gpu", "An uncorrectable ECC error that could not be contained."),
    (109, "context_switch_timeout", "warning", "restart_app", "A context switch timed out."),
    (110, "security_fault", "critical", "reset_gpu", "A security fault in the GPU."),
    (119, "gsp_rpc_timeout", "critical", "reset_gpu", "The GPU System Processor did not answer a call in time."),
    (120, "gsp_error", "critical", "reset_gpu", "The GPU System Processor reported an error."),
    (121, "c2c_link_corrected_error", "warning", "none", "A corrected error on the chip-to-chip link (Grace Hopper)."),
    (140, "unrecovered_ecc_error", "critical", "reset_gpu", "An ECC error the driver could not recover from."),
    (143, "gpu_initialization_failure", "critical", "reboot_node", "The GPU failed to initialise."),
    (154, "recovery_action_changed", "info", "none", "The driver changed the GPU's recovery action: see its message."),
)

UNKNOWN = XidInfo(0, "unknown", "warning", "none", "An XID this catalogue does not name: see NVIDIA's Xid catalog.")


def xid(code: int) -> XidInfo:
    """The catalogue's entry for `code`, or UNKNOWN (with that code) for one it does not name."""
    info = XIDS.get(code)
    return info if info is not None else XidInfo(code, UNKNOWN.name, UNKNOWN.severity, UNKNOWN.action, UNKNOWN.meaning)


# XID 154 names the recovery the driver now asks for in its message ("... changed from 0x0 (None) to 0x2 (Node
# Reboot Required)"): the action is taken from it rather than from the table.
RECOVERY_ACTIONS = {
    "none": "none",
    "gpu reset required": "reset_gpu",
    "node reboot required": "reboot_node",
    "drain p2p": "check_fabric",
    "drain and reset": "reset_gpu",
}


def sxid(fatal: bool) -> tuple[str, str]:
    """(severity, action) of an NVSwitch SXid, from the Fatal/Non-fatal word the driver prints with it."""
    return ("critical", "check_fabric") if fatal else ("warning", "none")


def most_disruptive(actions: list[str]) -> str:
    return max(actions, key=ACTIONS.index, default="none")
