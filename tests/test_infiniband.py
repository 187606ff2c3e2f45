"""The InfiniBand collector: parity with node_exporter on the same sysfs trees, and real-world edge cases."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accelmon.collectors.infiniband import InfinibandCollector
from tests.support.exposition import check_golden, promtool_check, text_of
from tests.support.infiniband_tree import add_device, node_exporter, scrape_node_exporter, standard_tree, write
from tests.support.processes import exporter_env, on_fixtures, run_once


def series(text: str, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                found[(sample.name[len(prefix) :], tuple(sorted(sample.labels.items())))] = sample.value
    return found


def node_exporter_output(sysfs: Path) -> str:
    with node_exporter(sysfs) as port:
        return scrape_node_exporter(port)


def ours(sysfs: Path) -> str:
    return text_of(InfinibandCollector(str(sysfs)))


def legacy_and_omnipath_tree(root: Path) -> Path:
    add_device(root, "mlx4_1", {1: {"base": 3}}, hca_type="MT26428", pci_address="0000:04:00.0", hw_counters=False)
    ext = root / "devices" / "pci0000:00" / "0000:04:00.0" / "infiniband" / "mlx4_1" / "ports" / "1" / "counters_ext"
    for index, name in enumerate(
        [
            "port_multicast_rcv_packets",
            "port_multicast_xmit_packets",
            "port_rcv_data_64",
            "port_rcv_packets_64",
            "port_unicast_rcv_packets",
            "port_unicast_xmit_packets",
            "port_xmit_data_64",
            "port_xmit_packets_64",
        ]
    ):
        write(ext / name, str(2**35 + index))
    add_device(
        root,
        "hfi1_0",
        {
            1: {
                "rate": "100 Gb/sec (4X EDR)",
                "counters": {"VL15_dropped": "N/A (no PMA)", "symbol_error": "N/A (no PMA)"},
            }
        },
        board_id="Intel Omni-Path Host Fabric Interface Adapter 100 Series",
        fw_ver="1.27.0",
        hca_type=None,
        pci_address="0000:81:00.0",
        numa_node=1,
        hw_counters=False,
    )
    return root


@pytest.mark.parametrize("tree", [standard_tree, legacy_and_omnipath_tree])
def test_values_equal_node_exporters_series_for_series(tmp_path, tree):
    sysfs = tree(tmp_path / "sys")
    theirs = series(node_exporter_output(sysfs), "node_infiniband_")
    mine = series(ours(sysfs), "accelmon_infiniband_")
    assert theirs, "node_exporter exported no InfiniBand series"
    names = {name for name, _ in theirs}
    shared = {key: value for key, value in mine.items() if key[0] in names}
    assert shared == theirs


def test_extras_beyond_node_exporter(tmp_path):
    text = ours(standard_tree(tmp_path / "sys"))
    mine = series(text, "accelmon_infiniband_")
    assert mine[("placement_info", (("device", "mlx5_1"), ("numa_node", "1"), ("pci_address", "0000:b1:00.0")))] == 1
    assert mine[("port_info", (("device", "mlx4_0"), ("link_layer", "Ethernet"), ("port", "2")))] == 1
    out_of_buffer = ("hw_events_total", (("counter", "out_of_buffer"), ("device", "mlx5_0"), ("port", "1")))
    assert mine[out_of_buffer] == 10 + 100 + 6
    assert not any(k[0] == "hw_events_total" and ("device", "mlx4_0") in k[1] for k in mine)  # no hw_counters dir


def test_counters_beyond_32_bits_and_word_multiplier(tmp_path):
    mine = series(ours(standard_tree(tmp_path / "sys")), "accelmon_infiniband_")
    port = (("device", "mlx5_0"), ("port", "1"))
    assert mine[("port_data_received_bytes_total", port)] == (2**40 + 3) * 4
    assert mine[("port_data_transmitted_bytes_total", port)] == 2**33 * 4
    assert mine[("state_id", (("device", "mlx5_1"), ("port", "1")))] == 1  # the port that is down
    assert mine[("rate_bytes_per_second", (("device", "mlx5_1"), ("port", "1")))] == 10 * 125_000_000


def test_broken_devices_do_not_drop_the_others(tmp_path):
    sysfs = standard_tree(tmp_path / "sys")
    # A device removed between listing and reading: its class link dangles.
    (sysfs / "class" / "infiniband" / "mlx5_9").symlink_to(tmp_path / "gone")
    # A port whose rate and counters cannot be read, and a device without ports.
    add_device(sysfs, "mlx5_2", {1: {}}, pci_address="0000:c1:00.0")
    port = sysfs / "devices" / "pci0000:00" / "0000:c1:00.0" / "infiniband" / "mlx5_2" / "ports" / "1"
    (port / "rate").unlink()
    shutil.rmtree(port / "counters")
    add_device(sysfs, "mlx5_3", {}, pci_address="0000:c2:00.0")
    mine = series(ours(sysfs), "accelmon_infiniband_")
    assert mine[("state_id", (("device", "mlx5_2"), ("port", "1")))] == 4
    assert ("rate_bytes_per_second", (("device", "mlx5_2"), ("port", "1"))) not in mine
    assert mine[("state_id", (("device", "mlx5_0"), ("port", "1")))] == 4
    assert not any(("device", "mlx5_9") in labels for _, labels in mine)


def test_a_device_is_listed_again_when_it_changes_and_every_layout_period(tmp_path):
    """What a device's tree holds is listed once and trusted until its class link or firmware changes (a device
    re-plugged, a firmware update), or LAYOUT_SECONDS pass (counter files a new driver adds); values are read
    every sample."""
    sysfs = tmp_path / "sys"
    add_device(sysfs, "mlx5_0", {1: {"base": 5}}, pci_address="0000:17:00.0")
    now = [0.0]
    collector = InfinibandCollector(str(sysfs), clock=lambda: now[0])
    mlx5_0 = (("device", "mlx5_0"), ("port", "1"))
    new_counter = ("hw_events_total", (("counter", "new_counter"), *mlx5_0))

    def read() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return series(text_of(collector), "accelmon_infiniband_")

    first = read()
    port = sysfs / "devices" / "pci0000:00" / "0000:17:00.0" / "infiniband" / "mlx5_0" / "ports" / "1"
    write(port / "counters" / "symbol_error", "77")
    write(port / "hw_counters" / "new_counter", "9")
    now[0] = 60.0
    second = read()
    assert second[("symbol_error_total", mlx5_0)] == 77  # values every sample
    assert new_counter not in second  # the listing is trusted
    now[0] = 301.0
    assert read()[new_counter] == 9  # listed again after the period
    # Firmware updated: the driver made the device again; its identity is read again at once.
    write(port.parent.parent / "fw_ver", "28.40.1000")
    write(port.parent.parent / "board_id", "MT_0000000970")
    info = [labels for name, labels in read() if name == "info"]
    assert info == [(("board_id", "MT_0000000970"), ("device", "mlx5_0"), ("firmware_version", "28.40.1000"),
                     ("hca_type", "MT4129"))]  # fmt: skip
    # Re-plugged elsewhere (another PCI address under the same name): its placement follows.
    (sysfs / "class" / "infiniband" / "mlx5_0").unlink()
    add_device(sysfs, "mlx5_0", {1: {"base": 5}}, pci_address="0000:9a:00.0", numa_node=1)
    placed = [labels for name, labels in read() if name == "placement_info"]
    assert placed == [(("device", "mlx5_0"), ("numa_node", "1"), ("pci_address", "0000:9a:00.0"))]
    assert first.keys() - {key for key in first if key[0] in ("info", "placement_info")} <= read().keys()
    # Removed: nothing of it is served, and nothing of it is kept.
    (sysfs / "class" / "infiniband" / "mlx5_0").unlink()
    assert read() == {}
    assert collector._layouts == {}


def test_no_infiniband_is_no_data(tmp_path):
    assert InfinibandCollector(str(tmp_path)).sample().rows == {}


def test_once_golden_with_promtool(tmp_path):
    standard_tree(tmp_path / "sys")
    result = run_once(on_fixtures(tmp_path, "infiniband", "health"), exporter_env(None, None))
    assert result.returncode == 0, result.stderr
    assert 'accelmon_collector_success{collector="infiniband"} 1.0\n' in result.stdout
    promtool_check(result.stdout)
    check_golden("infiniband_standard.prom", result.stdout)


def _card_with_virtual_functions(root: Path, count: int) -> Path:
    """One ConnectX card (mlx5_0, its PF) and `count` SR-IOV virtual functions bound on the host, each an RDMA device
    of its own whose PCI function links its PF by `physfn`, as the kernel makes them (pci-iov)."""
    add_device(root, "mlx5_0", {1: {}}, pci_address="0000:17:00.0")
    pf = root / "devices" / "pci0000:00" / "0000:17:00.0"
    for index in range(count):
        address = f"0000:17:{1 + index // 8:02x}.{index % 8}"
        add_device(root, f"mlx5_{index + 1}", {1: {"rate": "200 Gb/sec (4X HDR)"}}, pci_address=address)
        vf = root / "devices" / "pci0000:00" / address
        (vf / "physfn").symlink_to(os.path.relpath(pf, vf))
        (pf / f"virtfn{index}").symlink_to(os.path.relpath(vf, pf))
    return root


def test_virtual_functions_serve_their_state_not_their_counters_so_a_scrape_stays_under_the_sample_limit(tmp_path):
    """330 VFs: with their counters the node's scrape would pass the master's 20,000 samples (with a GPU node's other
    ~1,900); by default each VF serves its identity, placement, state, rate and link layer (its physical state is its
    PF's), its card (the PF) everything."""
    sysfs = _card_with_virtual_functions(tmp_path / "sys", 330)
    found = series(ours(sysfs), "accelmon_infiniband_")
    by_device: dict[str, set[str]] = {}
    for name, labels in found:
        device = dict(labels).get("device")
        if device:
            by_device.setdefault(device, set()).add(name)
    assert by_device["mlx5_7"] == {"info", "placement_info", "state_id", "rate_bytes_per_second", "port_info"}, (
        by_device["mlx5_7"])  # fmt: skip
    assert {"port_data_received_bytes_total", "pcie_link_width"} <= by_device["mlx5_0"], by_device["mlx5_0"]
    assert len(found) < 330 * 6 + 200, len(found)
    # Asked for, the VFs' counters are read too (the bound is then the operator's to raise).
    everything = series(
        text_of(InfinibandCollector(str(sysfs), virtual_function_counters=True)), "accelmon_infiniband_"
    )
    assert len(everything) > 20_000 - 1_900, len(everything)
    assert any(
        name == "port_data_received_bytes_total" and ("device", "mlx5_7") in labels for name, labels in everything
    )


def test_the_virtual_function_option_reaches_the_collector_through_the_exporters_config(tmp_path):
    """`collectors.infiniband.virtual_function_counters: true` in the exporter's file, as the role writes it."""
    args = on_fixtures(tmp_path, "infiniband")
    _card_with_virtual_functions(tmp_path / "sys", 2)
    settings = tmp_path / "accelmon.yml"
    settings.write_text(json.dumps({"collectors": {"infiniband": {"virtual_function_counters": True}}}))
    counted = run_once(args, exporter_env(None, None))
    assert counted.returncode == 0, counted.stderr
    assert 'accelmon_infiniband_port_data_received_bytes_total{device="mlx5_2",port="1"}' in counted.stdout
    settings.write_text(json.dumps({"collectors": {"infiniband": {"virtual_function_counters": False}}}))
    bounded = run_once(args, exporter_env(None, None)).stdout
    assert 'accelmon_infiniband_state_id{device="mlx5_2",port="1"}' in bounded
    assert 'accelmon_infiniband_port_data_received_bytes_total{device="mlx5_2"' not in bounded


@pytest.mark.e2e
def test_virtual_functions_at_init_over_a_link_up_do_not_alert_as_ports_not_active(tmp_path):
    """SR-IOV InfiniBand VFs where the subnet manager does not virtualise them read INIT with physical LinkUp (their
    PF's link) for good. promtool over the collector's own scrapes: AccelmonInfinibandPortNotActive stays silent on
    them (before: its LinkUp branch fired for all four), and still fires for a PF port at INIT over LinkUp."""
    import shutil
    import subprocess

    import yaml

    from tests.support.path_rules import input_series
    from tests.support.pci_tree import healthy_idle_node
    from tests.support.rules import master_rules

    sysfs, procfs = healthy_idle_node(tmp_path)
    for name in ("mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"):  # VFs as the kernel marks them (pci-iov: physfn)
        vf = (sysfs / "class/infiniband" / name / "device").resolve()
        (vf / "physfn").symlink_to("../0000:04:00.0")
    for name, port in (("mlx5_2", "1"), ("mlx5_3", "1"), ("mlx5_4", "1"), ("mlx5_5", "1"), ("mlx5_0", "2")):
        (sysfs / "class/infiniband" / name / "ports" / port / "state").write_text("2: INIT\n")  # the VFs; a PF's
        (sysfs / "class/infiniband" / name / "ports" / port / "phys_state").write_text("5: LinkUp\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = [text_of(collector) for _ in range(10)]
    firing = ('ALERTS{alertname="AccelmonInfinibandPortNotActive",alertstate="firing",device="mlx5_0",'
              'instance="n1:19470",node="n1",port="2",severity="warning"}')  # fmt: skip
    test = {"rule_files": [str(master_rules() / "rules" / "accelmon-alerts.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": input_series(scrapes), "promql_expr_test": [{
                "expr": 'ALERTS{alertname="AccelmonInfinibandPortNotActive",alertstate="firing"}', "eval_time": "9m",
                "exp_samples": [{"labels": firing, "value": 1}]}]}]}  # fmt: skip
    path = tmp_path / "vf-test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules", str(path)], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
