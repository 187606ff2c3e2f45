"""InfiniBand (and RoCE, OmniPath) port counters from sysfs, named like node_exporter's infiniband collector.

Example exposition line::

    accelmon_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 4398046511116

Reads `<sysfs>/class/infiniband/<device>/{board_id,fw_ver,hca_type}` and per port `state`, `phys_state`,
`rate`, `link_layer`, `counters/*`, `counters_ext/*` and `hw_counters/*`. The data counters count 4-octet
words and are multiplied by 4. Values a port cannot give (`N/A (no PMA)`, unreadable files, a device removed
while it is read) are left out without dropping the other ports. Beyond node_exporter: the HCA's PCI address
and NUMA node (GPUDirect RDMA placement), the link layer, every hw_counters file, and which of the narrow error
and congestion counters (4 to 32 bits, SATURATING) stands at its maximum, where it stops counting.

What a device's tree holds (its identity, placement, ports and counter files) is listed once and trusted until its
class link or firmware changes or LAYOUT_SECONDS pass; the values are read every sample.

Where the node has NVIDIA GPUs too, which path joins each GPU to each device (`accelmon_gpu_nic_info{link}`, as
`nvidia-smi topo -m` names it) and the ports NCCL uses for each GPU by default (`accelmon_gpu_nic_nearest_info`,
chosen as NCCL chooses: accelmon.host.nccl_nics, which the drill and the ACS pass share) among the ports in service:
ACTIVE now or since the exporter started (a port that went down stays the GPU's, at the best rate it had, so that
its fault is seen: an uncabled port, a virtual function never up, is never in service), with the node's NCCL_IB_HCA
(/etc/nccl.conf); worked out again when a GPU, a device, a port in service, its rate or NCCL_IB_HCA changes. Where
no NVSwitch is listed, the GPU pairs an NVLink bridge joins (PXN between them) are asked of NVML, once for a set of
GPUs.

An SR-IOV virtual function bound on the host is an RDMA device of its own (its PCI function has a `physfn` link to
its card's, the kernel's mark of a VF); a card gives up to 127 of them, and each serves about 60 series as a PF does
(746 for a DGX H100's 12 devices): past about 300 VFs, with the node's other ~1,900 series, a scrape passes 20,000,
the master's per-scrape sample limit, and the node's whole scrape would be refused. So a VF serves its identity,
placement, state, rate and link layer only (5 series: its physical state is its PF's), unless
`virtual_function_counters` is on; its traffic is its VM's or pod's, and the card's own counters are on its PF.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples
from accelmon.exporter.registry import Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.exporter.validation import MIN_SECONDS, Option
from accelmon.health import drill_store
from accelmon.host import nccl_nics, pcie_acs, topology
from accelmon.host.nvidia import NvmlSession

log = logging.getLogger("accelmon.infiniband")

PORT = ("device", "port")
NCCL_CONF = nccl_nics.NCCL_CONF  # what decides the NICs NCCL leaves by is read from it (accelmon.host.nccl_nics)
NCCL_TOPO_FILE = Option(
    "nccl_topo_file",
    "",
    "the NCCL topology file (NCCL_TOPO_FILE) the node's jobs use, where they set it themselves; empty: "
    "NCCL_TOPO_FILE of /etc/nccl.conf, else NCCL's own default (/var/run/nvidia-topologyd/virtualTopology.xml)",
    empty=True,
)
VIRTUAL_FUNCTION_COUNTERS = Option(
    "virtual_function_counters",
    False,
    "read the counters of SR-IOV virtual functions' ports too (off: a VF serves its identity, state and rate only; "
    "hundreds of VFs with their counters would carry a scrape past the master's sample limit)",
)
LAYOUT_SECONDS = 300.0  # how long a device's listed files are trusted without a sign that it changed
PER_DEVICE = "when a device or its firmware changes, and every 5 minutes"
CATALOGUE = Catalogue(
    "infiniband",
    "InfiniBand ports (sysfs)",
    "Source: sysfs `class/infiniband`. Names are node_exporter's infiniband collector with `accelmon_` for "
    "`node_`, values equal on the same tree (tested against Debian's node_exporter 1.5); the data counters "
    "count 4-octet words and are multiplied by 4. Beyond node_exporter: placement (PCI address, NUMA node), "
    "link layer, every hw_counters file and the narrow counters at their maximum (saturated).",
)
C = CATALOGUE
INFO = C.gauge(
    "accelmon_infiniband_info",
    "Identity of an InfiniBand HCA; value is 1.",
    ["board_id", "device", "firmware_version", "hca_type"],
    read=PER_DEVICE,
)
PLACEMENT = C.gauge(
    "accelmon_infiniband_placement_info",
    "Where an HCA sits: its PCI address and NUMA node (-1 if unknown), to match HCAs with GPUs; value is 1.",
    ["device", "pci_address", "numa_node"],
    read=PER_DEVICE,
)
PORT_INFO = C.gauge("accelmon_infiniband_port_info", "Link layer of a port; value is 1.", [*PORT, "link_layer"])
STATE = C.gauge(
    "accelmon_infiniband_state_id",
    "State of the port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer).",
    PORT,
)
PHYSICAL_STATE = C.gauge(
    "accelmon_infiniband_physical_state_id",
    "Physical state of the port (0: no change, 1: sleep, 2: polling, 3: disabled, 4: port configuration training, "
    "5: link up, 6: link error recovery, 7: phy test).",
    PORT,
)
RATE = C.gauge("accelmon_infiniband_rate_bytes_per_second", "Signalling rate of the port (sysfs: Gb/s).", PORT)
GPU_NIC = C.gauge(
    "accelmon_gpu_nic_info",
    "The path between a GPU and an RDMA device of the node, as nvidia-smi topo -m names it: PIX (one PCIe switch), "
    "PXB (several switches), PHB (the host bridge), NODE (host bridges of one NUMA node), SYS (across NUMA nodes); "
    "value is 1.",
    ["gpu", "uuid", "device", "link"],
    read="when a GPU or a device comes or goes",
)
GPU_NIC_NEAREST = C.gauge(
    "accelmon_gpu_nic_nearest_info",
    "The RDMA ports NCCL uses for a GPU by default (the highest path bandwidth, then the nearest path; a card's "
    "ports in service merged; the node's NCCL_IB_HCA; through an NVLink peer's port, PXN), with NCCL's path type: "
    "PIX, PXB, PXN, PHB or SYS; value 1.",
    ["gpu", "uuid", "device", "port", "path"],
    read="when a GPU, a device, a port in service or its rate comes, goes or changes",
)
GPU_NIC_RAIL = C.gauge(
    "accelmon_gpu_nic_rail_info",
    "Further RDMA ports a GPU's point-to-point sends may leave by: a peer GPU's own port, reached over NVLink "
    "(NCCL's PXN, NCCL_P2P_PXN_LEVEL 2: a send goes by the port of the destination GPU's rail); value 1.",
    ["gpu", "uuid", "device", "port"],
    read="when a GPU, a device, a port in service or its rate comes, goes or changes",
)
PATH_BANDWIDTH = C.gauge(
    "accelmon_infiniband_port_path_bandwidth_bytes_per_second",
    "For a port NCCL uses for some GPU by default: the bandwidth NCCL rates that GPU's path to it at, its PCIe links "
    "and any CPUs' interconnect, the port's own speed left out (the most of the GPUs using it): a port slower than "
    "this slows NCCL, one as fast or faster does not (graph/paths.cc ncclTopoSetPaths, GB/s x 1e9).",
    PORT,
    read="when a GPU, a device, a port in service or its rate comes, goes or changes",
)
PCIE_SPEED = C.gauge(
    "accelmon_infiniband_pcie_link_transfers_per_second",
    "Transfer rate per lane the HCA's PCIe link runs at now (sysfs current_link_speed: 32 GT/s for Gen5).",
    ["device"],
)
PCIE_SPEED_MAX = C.gauge(
    "accelmon_infiniband_pcie_link_transfers_per_second_max",
    "The highest transfer rate per lane the HCA and the port above it allow together (the lower max_link_speed).",
    ["device"],
)
PCIE_WIDTH = C.gauge(
    "accelmon_infiniband_pcie_link_width", "Lanes the HCA's PCIe link runs on now (current_link_width).", ["device"]
)
PCIE_WIDTH_MAX = C.gauge(
    "accelmon_infiniband_pcie_link_width_max",
    "The most lanes the HCA and the port above it allow together (the narrower max_link_width).",
    ["device"],
)
PEER_MEMORY = C.gauge(
    "accelmon_gpudirect_rdma_peer_memory_loaded",
    "1 if a GPU peer-memory module NCCL looks for is loaded (nvidia_peermem, or nv_peer_mem's memory_peers entry), "
    "0 if none: GPUDirect RDMA then needs DMA-BUF (open kernel module, Linux 5.12+); served where the node has GPUs.",
    [],
)
TOPO_FILE_REFUSED = C.gauge(
    "accelmon_nccl_topology_file_refused",
    "1 while the NCCL topology file the node's jobs read (nccl_topo_file, else /etc/nccl.conf's NCCL_TOPO_FILE, else "
    "NCCL's default path) is there but not read: unreadable, no regular file, over 1 MiB or 256 elements, or "
    "malformed (NCCL's parser fails on a malformed one or one past 256 elements, xml.cc xmlLoadSub, and with it "
    "every job's init); the NICs are then chosen from sysfs. 0 where read or absent; served where the node has GPUs.",
    [],
)
DRILL_ACTIVE = C.gauge(
    "accelmon_infiniband_drill_active",
    "1 while a drill (accelmon-drill nic) rehearses a fault of this port: the rules treat it as a NIC at fault, "
    "labelled drill; its real counters and state are served as they are.",
    PORT,
    read="every interval, while a drill is in force",
)
# counters/<file> -> (metric, help, multiplier). The names are node_exporter's, with our prefix.
COUNTERS: dict[str, tuple[str, str, int]] = {
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors_total", "Buffer overruns.", 1),
    "link_downed": ("link_downed_total", "Times the link failed to recover from an error and went down.", 1),
    "link_error_recovery": ("link_error_recovery_total", "Times the link recovered from an error.", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors_total", "Local link integrity errors.", 1),
    "multicast_rcv_packets": ("multicast_packets_received_total", "Multicast packets received.", 1),
    "multicast_xmit_packets": ("multicast_packets_transmitted_total", "Multicast packets transmitted.", 1),
    "port_rcv_constraint_errors": ("port_constraint_errors_received_total", "Packets discarded on receive.", 1),
    "port_rcv_data": ("port_data_received_bytes_total", "Data octets received (sysfs counts 4-octet words).", 4),
    "port_rcv_discards": ("port_discards_received_total", "Inbound packets discarded (port down or congested).", 1),
    "port_rcv_errors": ("port_errors_received_total", "Packets with an error received.", 1),
    "port_rcv_packets": ("port_packets_received_total", "Packets received on all VLs, errors included.", 1),
    "port_rcv_remote_physical_errors": (
        "port_receive_remote_physical_errors_total",
        "Packets received marked with a remote physical error.",
        1,
    ),
    "port_rcv_switch_relay_errors": (
        "port_receive_switch_relay_errors_total",
        "Packets discarded because they could not be relayed.",
        1,
    ),
    "port_xmit_constraint_errors": ("port_constraint_errors_transmitted_total", "Packets not transmitted.", 1),
    "port_xmit_data": ("port_data_transmitted_bytes_total", "Data octets transmitted (sysfs: 4-octet words).", 4),
    "port_xmit_discards": ("port_discards_transmitted_total", "Outbound packets discarded.", 1),
    "port_xmit_packets": ("port_packets_transmitted_total", "Packets transmitted on all VLs, errors included.", 1),
    "port_xmit_wait": ("port_transmit_wait_total", "Ticks with data to send but none sent.", 1),
    "symbol_error": ("symbol_error_total", "Minor link errors detected on a physical lane.", 1),
    "unicast_rcv_packets": ("unicast_packets_received_total", "Unicast packets received.", 1),
    "unicast_xmit_packets": ("unicast_packets_transmitted_total", "Unicast packets transmitted.", 1),
    "VL15_dropped": ("vl15_dropped_total", "Subnet management packets dropped (resources).", 1),
}
# counters_ext/<file>: the 64-bit counters of kernels before 4.5.
LEGACY_COUNTERS: dict[str, tuple[str, str, int]] = {
    "port_multicast_rcv_packets": ("legacy_multicast_packets_received_total", "Multicast packets received.", 1),
    "port_multicast_xmit_packets": ("legacy_multicast_packets_transmitted_total", "Multicast packets sent.", 1),
    "port_rcv_data_64": ("legacy_data_received_bytes_total", "Data octets received (64-bit counter).", 4),
    "port_rcv_packets_64": ("legacy_packets_received_total", "Packets received (64-bit counter).", 1),
    "port_unicast_rcv_packets": ("legacy_unicast_packets_received_total", "Unicast packets received.", 1),
    "port_unicast_xmit_packets": ("legacy_unicast_packets_transmitted_total", "Unicast packets transmitted.", 1),
    "port_xmit_data_64": ("legacy_data_transmitted_bytes_total", "Data octets transmitted (64-bit counter).", 4),
    "port_xmit_packets_64": ("legacy_packets_transmitted_total", "Packets transmitted (64-bit counter).", 1),
}
COUNTER_SPECS = {
    file: (C.counter(f"accelmon_infiniband_{name}", text, PORT), multiplier)
    for table in (COUNTERS, LEGACY_COUNTERS)
    for file, (name, text, multiplier) in table.items()
}
# The counters/ files the kernel reads from the PortCounters attribute at less than 64 bits, by their width (Linux
# drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR(name, counter, width, offset)): the InfiniBand architecture has
# them stop at all ones rather than wrap, so one at its maximum counts nothing more (rate() reads 0) until cleared
# (perfquery -R). The data and packet counters are left out: where the port has extended counters the kernel serves
# the 64-bit PortCountersExtended values under the same names.
SATURATING: dict[str, int] = {
    **dict.fromkeys(("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors"), 16),
    **dict.fromkeys(("port_rcv_switch_relay_errors", "port_xmit_discards", "VL15_dropped"), 16),
    **dict.fromkeys(("link_error_recovery", "link_downed"), 8),
    **dict.fromkeys(("port_rcv_constraint_errors", "port_xmit_constraint_errors"), 8),
    **dict.fromkeys(("local_link_integrity_errors", "excessive_buffer_overrun_errors"), 4),
    "port_xmit_wait": 32,
}
SATURATED = C.gauge(
    "accelmon_infiniband_port_saturated",
    "1 for a counters/ file at its maximum (symbol_error 65535, link_downed 255, port_xmit_wait 4294967295, ...): "
    "it counts nothing more until cleared (perfquery -R); served only while so. counter is the file's name.",
    [*PORT, "counter"],
    read="every interval, while a counter is at its maximum",
)
HW_COUNTER = C.counter(
    "accelmon_infiniband_hw_events_total",
    "A driver's hw_counters file (e.g. out_of_buffer, np_ecn_marked_roce_packets), by file name.",
    [*PORT, "counter"],
)


ACTIVE = 4  # IB_PORT_ACTIVE, the state NCCL requires of a port (net_ib.cc `ncclIbInitDevices`, v2.28.7-1)


def _read(path: str) -> str | None:
    # os.open/os.read rather than open(): a port has ~50 tiny files and the text-file layer triples their cost.
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
    except OSError:  # absent, unreadable, EINVAL from a counter the firmware does not have, device removed
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _state(text: str | None) -> int | None:
    """'4: ACTIVE' -> 4."""
    if text is None:
        return None
    number, _, _ = text.partition(":")
    return int(number) if number.strip().isdigit() else None


def _rate(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> bytes per second, as node_exporter computes it (Gb/s x 125000000)."""
    if not text:
        return None
    try:
        return float(text.split()[0]) * 125_000_000
    except ValueError:
        return None


def _counter(text: str | None) -> int | None:
    if text is None or not text.isdigit():
        return None  # "N/A (no PMA)" and friends
    return int(text)


def _saturating(folder: str, file: str) -> tuple[str, int] | None:
    """(file, its maximum) for a counters/ file that stops at all ones below 64 bits (SATURATING), else None."""
    width = SATURATING.get(file) if folder == "counters" else None
    return None if width is None else (file, (1 << width) - 1)


@dataclass
class _Layout:
    """What one HCA's sysfs tree holds that does not change while it is the same device: its identity, placement,
    ports and their counter files (a sample otherwise listed 3 directories and resolved a PCI link per port)."""

    key: tuple[str, str]  # (where its class link points, its firmware): a new device or firmware is a new layout
    made: float
    info: list[str]
    placement: list[str]
    ports: list[tuple[str, str]] = field(default_factory=list)  # (port, its directory)
    # port -> (path, spec, multiplier, its file's name and maximum where it saturates below 64 bits, else None)
    counters: dict[str, list[tuple[str, MetricSpec, int, tuple[str, int] | None]]] = field(default_factory=dict)
    hw_counters: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # port -> (file, counter name)
    pci: str = ""  # its PCI function's directory
    virtual: bool = False  # an SR-IOV virtual function (its PCI function has a physfn link)


class InfinibandCollector(Collector):
    name = "infiniband"

    def __init__(
        self, sysfs: str = "/sys", clock: Callable[[], float] = time.monotonic, procfs: str = "/proc",
        drill_dir: str = str(drill_store.DRILL_DIR.default), wall: Callable[[], float] = time.time,
        nccl_conf: str = NCCL_CONF, nccl_topo_file: str = "", virtual_function_counters: bool = False,
        nvml: Any = None,
    ) -> None:  # fmt: skip
        self.sysfs, self.procfs, self.drill_dir, self._wall = sysfs, procfs, drill_dir, wall
        self.virtual_function_counters = virtual_function_counters
        self.nccl_conf, self.nccl_topo_file = nccl_conf, nccl_topo_file
        self._topology: tuple[tuple[object, ...], list[topology.Pair], list[topology.Local]] = ((), [], [])
        self._in_service: dict[tuple[str, str], topology.Port] = {}  # ports ACTIVE now or since the start
        self._topo_refused = False
        self.root = os.path.join(sysfs, "class", "infiniband")
        self._devices_found = False
        self._clock = clock
        self._layouts: dict[str, _Layout] = {}
        # NVML only for the GPU pairs an NVLink bridge joins (PXN between them), asked once per set of GPUs
        self._nvml = NvmlSession("NVLink bridges are not known (PXN)", nvml, retry_seconds=LAYOUT_SECONDS)
        self._bridged: tuple[tuple[str, ...], list[frozenset[str]]] = ((), [])

    def hardware_answering(self) -> bool:
        return self._devices_found

    def sample(self) -> Samples:
        samples = Samples()
        devices = _listdir(self.root)
        for device in devices:
            self._sample_device(device, samples)
        self._layouts = {device: layout for device, layout in self._layouts.items() if device in devices}
        self._in_service = {key: port for key, port in self._in_service.items() if key[0] in devices}
        self._devices_found = INFO in samples.rows
        self._sample_topology(devices, samples)
        for drill in drill_store.nic_drills(self.drill_dir, self._wall()):
            if drill.device in devices:  # a drill of a port this node has (accelmon-drill checks it too)
                samples.add(DRILL_ACTIVE, [drill.device, drill.port], 1)
        return samples

    def _sample_topology(self, devices: list[str], out: Samples) -> None:
        """The GPU-to-device paths, worked out again only when the GPUs, the devices, the ports in service (and
        their rates) or NCCL_IB_HCA changed."""
        gpus = _listdir(os.path.join(self.procfs, "driver", "nvidia", "gpus"))
        conf = nccl_nics.settings(self.nccl_conf, self.nccl_topo_file)  # the topology file read again as it changes
        switches = _listdir(os.path.join(self.procfs, *topology.NVSWITCH_DEVICES))
        bridged = self._nvlink_bridges(tuple(gpus)) if devices else []
        key = (tuple(devices), tuple(gpus), tuple(sorted(self._in_service.values(), key=str)), conf, tuple(switches),
               tuple(bridged))  # fmt: skip
        if key != self._topology[0]:
            ports = list(self._in_service.values())
            chosen = nccl_nics.chosen(self.sysfs, self.procfs, ports, conf, bridged, rails=True)
            self._topology = (key, topology.gpu_nic_pairs(self.sysfs, self.procfs), chosen)
            self._topo_refused = topology.read_topo_file(conf.topo_file) is None  # skipped (logged), served below
        if gpus and devices:
            out.add(PEER_MEMORY, [], 1 if peer_memory_loaded(self.sysfs) else 0)
            out.add(TOPO_FILE_REFUSED, [], 1 if self._topo_refused else 0)
        for pair in self._topology[1]:
            out.add(GPU_NIC, [pair.gpu, pair.uuid, pair.device, pair.link], 1)
        paths: dict[tuple[str, str], float] = {}
        for local in self._topology[2]:
            if local.rail:
                out.add(GPU_NIC_RAIL, [local.gpu, local.uuid, local.device, local.port], 1)
            else:
                out.add(GPU_NIC_NEAREST, [local.gpu, local.uuid, local.device, local.port, local.path], 1)
                used = (local.device, local.port)
                paths[used] = max(paths.get(used, 0.0), local.bandwidth * 1e9)
        for (device, port), bandwidth in paths.items():
            out.add(PATH_BANDWIDTH, [device, port], bandwidth)

    def _nvlink_bridges(self, gpus: tuple[str, ...]) -> list[frozenset[str]]:
        """The GPU pairs an NVLink joins without NVSwitch (nccl_nics.bridged_pairs), read from NVML once for a set of
        GPUs (a bridge does not change while the driver runs)."""
        if self._bridged[0] != gpus:
            pairs = nccl_nics.bridged_pairs(self.procfs, self._nvml, self.sysfs)
            if pairs is None:  # NVML not there (yet): asked again after LAYOUT_SECONDS
                return []
            self._bridged = (gpus, pairs)
        return self._bridged[1]

    def _sample_device(self, device: str, out: Samples) -> None:
        path = os.path.join(self.root, device)
        firmware = _read(os.path.join(path, "fw_ver"))
        if firmware is None:
            return  # gone, or not a device
        layout = self._layout(device, path, firmware)
        out.add(INFO, layout.info, 1)
        out.add(PLACEMENT, layout.placement, 1)
        if layout.pci:
            _sample_pcie_link(device, layout.pci, out)
        for port, directory in layout.ports:
            labels = (device, port)
            if self._sample_port(labels, directory, out, layout.virtual):
                for file, spec, multiplier, saturating in layout.counters[port]:
                    value = _counter(_read(file))
                    if value is not None:
                        out.add(spec, labels, value * multiplier)
                        # At its maximum exactly: a driver whose file counts past the width is not that counter.
                        if saturating is not None and value == saturating[1]:
                            out.add(SATURATED, (*labels, saturating[0]), 1)
                for file, counter in layout.hw_counters[port]:
                    value = _counter(_read(file))
                    if value is not None:
                        out.add(HW_COUNTER, (*labels, counter), value)

    def _layout(self, device: str, path: str, firmware: str) -> _Layout:
        """The device's layout, listed again when its link or firmware changed (a device re-plugged, a driver
        reloaded after a firmware update) and at least every LAYOUT_SECONDS (counter files a new driver adds)."""
        try:
            key = (os.readlink(path), firmware)
        except OSError:
            key = (path, firmware)  # not a link (no kernel makes this): listed every LAYOUT_SECONDS
        now = self._clock()
        layout = self._layouts.get(device)
        if layout is not None and layout.key == key and now - layout.made < LAYOUT_SECONDS:
            return layout
        pci = os.path.realpath(os.path.join(path, "device"))
        numa = _read(os.path.join(pci, "numa_node"))
        board, hca = (_read(os.path.join(path, name)) or "" for name in ("board_id", "hca_type"))
        virtual = os.path.lexists(os.path.join(pci, "physfn"))
        function = os.path.basename(pci) if os.path.isdir(pci) else ""
        if layout is not None and layout.placement[1] != function:
            # Another PCI function under this name (a card re-plugged, names shifted at a driver reload): the ports in
            # service were the other card's, and this card's uncabled port must not read as theirs gone down.
            self._in_service = {seen: port for seen, port in self._in_service.items() if seen[0] != device}
        layout = self._layouts[device] = _Layout(
            key,
            now,
            [board, device, firmware, hca],
            [device, function, numa or "-1"],
            # A VF's PCIe link is its card's (its own files read 'Unknown'): the PF serves it.
            pci=pci if os.path.isdir(pci) and not virtual else "",
            virtual=virtual,
        )
        counted = not virtual or self.virtual_function_counters
        ports = os.path.join(path, "ports")
        for port in _listdir(ports):
            if not port.isdigit():
                continue
            directory = os.path.join(ports, port)
            layout.ports.append((port, directory))
            layout.counters[port] = [
                (f"{directory}/{folder}/{file}", *COUNTER_SPECS[file], _saturating(folder, file))
                for folder in ("counters", "counters_ext")
                for file in (_listdir(f"{directory}/{folder}") if counted else ())
                if file in COUNTER_SPECS
            ]
            layout.hw_counters[port] = [
                (f"{directory}/hw_counters/{file}", file)
                for file in (_listdir(f"{directory}/hw_counters") if counted else ())
            ]
        return layout

    def _sample_port(self, labels: tuple[str, str], path: str, out: Samples, virtual: bool = False) -> bool:
        """The port's state, rate and link layer; False where it is gone (its counters are then not read). A VF's
        physical state is not served: its link is its PF's (served there), and a VF the subnet manager has not made
        ACTIVE reads INIT over that LinkUp for good, which AccelmonInfinibandPortNotActive's LinkUp branch would
        take for a port stuck at the subnet manager."""
        state = _state(_read(os.path.join(path, "state")))
        if state is None:
            return False
        out.add(STATE, labels, state)
        physical = None if virtual else _state(_read(os.path.join(path, "phys_state")))
        if physical is not None:
            out.add(PHYSICAL_STATE, labels, physical)
        rate = _rate(_read(os.path.join(path, "rate")))
        if rate is not None:
            out.add(RATE, labels, rate)
        link_layer = _read(os.path.join(path, "link_layer"))
        if link_layer:
            out.add(PORT_INFO, [*labels, link_layer], 1)
        if state == ACTIVE and rate is not None and link_layer:
            known = self._in_service.get(labels)
            gbps = rate / 125_000_000
            if known is None or known.gbps < gbps or known.link_layer != link_layer:
                self._in_service[labels] = topology.Port(*labels, link_layer, gbps)
        return True


# NCCL's test for GPUDirect RDMA through a peer-memory module (net_ib.cc `ibGdrSupportInitOnce`, v2.28.7-1): any of
# these exists. Without one, NCCL still reaches GPU memory through DMA-BUF where the kernel and driver allow it.
PEER_MEMORY_FILES = (
    ("kernel", "mm", "memory_peers", "nv_mem", "version"),
    ("kernel", "mm", "memory_peers", "nv_mem_nc", "version"),
    ("module", "nvidia_peermem", "version"),
)


def _sample_pcie_link(device: str, pci: str, out: Samples) -> None:
    """The HCA's PCIe link now and at best: its function's current_link_speed/width against the lower
    max_link_speed and narrower max_link_width of the function and the port above it (a Gen5 HCA in a Gen4 slot is
    at its best at Gen4). A virtual function, or a file that reads 'Unknown', serves nothing."""
    parent = os.path.dirname(pci)
    for now, best, file, spec, spec_max in (
        ("current_link_speed", "max_link_speed", "speed", PCIE_SPEED, PCIE_SPEED_MAX),
        ("current_link_width", "max_link_width", "width", PCIE_WIDTH, PCIE_WIDTH_MAX),
    ):
        value = _link_value(_read(os.path.join(pci, now)), file)
        limits = [_link_value(_read(os.path.join(where, best)), file) for where in (pci, parent)]
        known = [limit for limit in limits if limit]
        if value and known:
            out.add(spec, [device], value)
            out.add(spec_max, [device], min(known))


def _link_value(text: str | None, kind: str) -> float | None:
    """'32.0 GT/s PCIe' as transfers per second, '16' as lanes; None where unreadable or 'Unknown'."""
    try:
        number = float((text or "").split()[0])
    except (ValueError, IndexError):
        return None
    return number * 1e9 if kind == "speed" else number


def peer_memory_loaded(sysfs: str) -> bool:
    return any(os.path.exists(os.path.join(sysfs, *parts)) for parts in PEER_MEMORY_FILES)


def _has_class(paths: Paths, options: dict[str, object]) -> bool:
    return os.path.isdir(os.path.join(paths.sysfs, "class", "infiniband"))


REGISTRATION = register(
    Registration(
        name="infiniband",
        help="InfiniBand, RoCE and OmniPath port counters from sysfs (default: on where class/infiniband exists)",
        build=lambda options, paths: InfinibandCollector(
            sysfs=paths.sysfs,
            procfs=paths.procfs,
            drill_dir=str(options["drill_dir"]),
            nccl_topo_file=str(options["nccl_topo_file"]),
            virtual_function_counters=bool(options["virtual_function_counters"]),
        ),
        catalogue=CATALOGUE,
        options=(
            seconds("interval_seconds", 5, "how often the port counters are read"),
            drill_store.DRILL_DIR,
            NCCL_TOPO_FILE,
            VIRTUAL_FUNCTION_COUNTERS,
            # Read by the pcie_acs collector, which serves the ACS state now: still accepted here, as one setting
            # with its own, so configs written while this collector served it keep working.
            Option(
                "pcie_acs_state",
                pcie_acs.STATE_PATH,
                "accepted for configs written before ACS had its collector: "
                "the same setting as pcie_acs's pcie_acs_state",
                shared=True,
            ),
            Option(
                "pcie_acs_max_age_seconds",
                3600.0,
                "accepted for configs written before ACS had its collector: "
                "the same setting as pcie_acs's pcie_acs_max_age_seconds",
                minimum=MIN_SECONDS,
                shared=True,
            ),
        ),
        enabled_by_default=_has_class,
        hardware_present=_has_class,
    )
)
