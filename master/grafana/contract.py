"""What the dashboards ask of the data, for whoever checks a Prometheus-compatible store against them (the test
suite, the Molecule scenarios, the capacity benchmark): every panel query, made concrete with match-all template
variables, and the metric names a query or rule reads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import generate

# accelmon_*/node_* metrics, recording rules (level:metric:operations) and `up{...}`.
METRIC = re.compile(
    r"\b((?:accelmon|node)_[a-zA-Z0-9_]+|(?:node|cluster|job_id|job_gpu|job|gpu|account):[a-z0-9_:]+[a-z0-9_]|up(?=\{))"
)

# Grafana's template variables, as a user who picked "All" sends them.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__range_s": "3600",  # before $__range, which it starts with
    "$__range": "1h",
    "$node": ".*",
    "$gpu": ".*",
    "$device": ".*",
    "$runtime_tag": ".*",
    "$job_id": ".*",
}


# Series a healthy fleet may have none of, served only while something is so: a Prometheus or a store checked against
# the dashboards may lack them (their panels expect no data: `expect_data=False`). The test suite's simulated node has
# most of them (tests/support/simulated_node.py), and each one's own test serves it.
ONLY_WHILE = {
    "accelmon_gpu_health_drill_active": "a drill is in force (tests/test_drill.py)",
    "accelmon_exporter_tls_certificate_expiry_timestamp_seconds": (
        "the exporters serve TLS with the deploy's certificates (tests/test_certificate_expiry.py)"
    ),
    "accelmon_gpu_mig_instance_info": "a GPU is split into MIG instances (tests/test_nvml.py)",
    "accelmon_remediation_paused": "the scheduler collector reads Slurm (tests/test_scheduler.py)",
    "accelmon_nccl_rank_missing": "an NCCL job's rank does not answer RAS (tests/test_nccl.py)",
    "accelmon_nccl_rank_collectives_behind": "an NCCL job's rank stands behind (tests/test_nccl.py)",
    "accelmon_nccl_rank_collectives": "an NCCL job's rank stands behind (tests/test_nccl.py)",
    "accelmon_nccl_communicator_collectives_max": "an NCCL job answers RAS (tests/test_nccl.py)",
    "accelmon_nccl_drill_active": "an NCCL drill is in force (tests/test_nccl_drill.py)",
    "accelmon_nccl_collection_timeouts": "an NCCL job answers RAS (tests/test_ras_corpus.py)",
    "accelmon_nccl_job_ranks_missing": "an NCCL job answers RAS (tests/test_nccl.py)",
    "accelmon_nccl_bus_bandwidth_bytes_per_second": "a job runs NCCL Inspector (tests/test_nccl_inspector.py)",
    "accelmon_gpu_remediation_repairs_total": "the repair loop repaired a GPU (tests/test_remediation.py)",
    "accelmon_node_remediation_events_total": "the Slurm health check decided something (tests/test_remediation.py)",
    "accelmon_node_drain_breaker_nodes": "the circuit breaker holds a drain back (tests/test_remediation.py)",
    "accelmon_node_out_by_accelmon_since_seconds": "Slurm shows a node out by accelmon (tests/test_scheduler.py)",
    "accelmon_gpu_nic_nearest_info": "a node has NVIDIA GPUs and RDMA NICs (tests/test_topology.py)",
    "accelmon_infiniband_drill_active": "a NIC drill is in force (tests/test_nic_drill.py)",
    "accelmon_infiniband_port_saturated": "a port's error counter is at its maximum (tests/test_topology.py)",
    "accelmon_gpu_pcie_path_bridge_info": "the health check's root pass read the PCIe bridges (tests/test_pcie_acs.py)",
    "accelmon_gpu_pcie_p2p_bridge_info": "GPUs joined by PCIe P2P, bridges read (tests/test_pcie_acs.py)",
    "accelmon_pcie_acs_redirect": "the health check's root pass read the PCIe bridges (tests/test_pcie_acs.py)",
    "accelmon:gpu_path_fault": "a part on a GPU's path is at fault (master/prometheus/tests/alerts-test.yml)",
    "accelmon:infiniband_port_fault": "a port GPUs' NCCL traffic uses is at fault (paths-test.yml)",
    "accelmon:gpu_nic_port_on_faulty_device": "a GPU's NCCL port is on a faulty device (paths-test.yml)",
    "accelmon:gpu_nic_rail_port_on_faulty_device": "a GPU's rail port is on a faulty device (paths-test.yml)",
    "accelmon_gpu_nic_rail_info": "GPUs send point to point by other GPUs' NICs: rails (tests/test_topology.py)",
    "node:accelmon_gpus_by_state:count": "a GPU is unhealthy or drained (master/prometheus/tests/ledger-test.yml)",
    "job:accelmon_hung:bool": "a job hangs (ledger-test.yml)",
    "job_gpu:link_degraded:bool": "a job's GPU has a narrow PCIe link or an NVLink link down (alerts-test.yml)",
    # The ledger's GPUs of each state: only while some GPU is in it (the counts, zeros included, always are).
    **{
        f"gpu:accelmon_ledger_{state}:bool": f"a GPU is {state} (ledger-test.yml)"
        for state in ("unreachable", "unhealthy", "hung", "idle", "straggling", "productive", "drained", "free")
    },
}


class PanelQuery(NamedTuple):
    dashboard: str  # the dashboard's uid
    panel: str  # the panel's title
    expr: str  # as the dashboard holds it, variables included
    expect_data: bool  # False where an empty answer is a healthy fleet's (no XIDs, no throttling)
    instant: bool = False  # asked at one moment (tables, bars: generate.INSTANT_KINDS), not as a range


def concrete(expr: str) -> str:
    """The query Grafana sends for `expr` with every variable at "All"."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def panel_queries() -> Iterator[PanelQuery]:
    for dashboard in generate.DASHBOARDS:
        for panel in dashboard.panels:
            for expr, _ in panel.queries:
                instant = panel.kind in generate.INSTANT_KINDS
                yield PanelQuery(dashboard.uid, panel.title, expr, panel.expect_data, instant)
