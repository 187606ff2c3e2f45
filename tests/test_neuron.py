"""The Neuron collector: reports to metrics, per-period counts accumulated, supervision of neuron-monitor."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accelmon.collectors import collectors
from accelmon.collectors.neuron import NeuronCollector
from accelmon.exporter.registry import Paths
from tests.support.exposition import check_golden, promtool_check, text_of
from tests.support.exposition import sample_value as value
from tests.support.jobs_tree import slurm_job_cgroup
from tests.support.neuron_reports import line, report, runtime
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

FAKE_MONITOR = str(ROOT / "tests" / "fakeneuron" / "neuron-monitor")


def feed(collector: NeuronCollector, *lines: str) -> None:
    for text in lines:
        collector.state.add_line(text.encode(), time.monotonic(), 1_700_000_000.0)


def sample(collector: NeuronCollector) -> str:
    return text_of(collector)


def test_report_to_metrics_golden():
    collector = NeuronCollector(monitor="/nonexistent")
    feed(collector, line(report(1)), line(report(2)), line(report(3, ecc_uncorrected=1)))
    text = sample(collector)
    promtool_check(text)
    check_golden("neuron_trn1.prom", text)
    assert value(text, "accelmon_neuroncore_utilization_ratio", runtime_tag="llama-serve", neuroncore="1") == 0.875
    assert value(text, "accelmon_neuroncore_flops", runtime_tag="llama-serve", neuroncore="1") == 2e12
    assert value(
        text, "accelmon_neuron_execution_latency_seconds", runtime_tag="llama-serve", latency="device", percentile="p99"
    ) == pytest.approx(0.0105)
    # The untagged runtime is named by its pid; it is idle, so its latency is null: no series.
    assert value(text, "accelmon_neuron_runtime_info", runtime_tag="4242", pid="4242") == 1
    assert value(text, "accelmon_neuron_execution_latency_seconds", runtime_tag="4242") is None
    assert (
        value(text, "accelmon_neuroncore_memory_used_bytes", runtime_tag="4242", neuroncore="1", category="model_code")
        == 176285056
    )
    assert value(text, "accelmon_neuron_hardware_info", neuron_device_type="trainium", neuroncore_version="v2") == 1
    assert value(text, "accelmon_neuron_devices") == 16
    assert value(text, "accelmon_neuron_system_vcpu_usage_ratio", usage_type="user") == pytest.approx(0.3277)


def test_per_period_counts_accumulate_once_per_capture():
    collector = NeuronCollector(monitor="/nonexistent")
    feed(collector, line(report(1)), line(report(2)), line(report(2)), line(report(3, ecc_uncorrected=1)))
    text = sample(collector)
    # Errors per period 1, 2, (2 repeated: same capture, not added again), 3.
    assert value(text, "accelmon_neuron_execution_errors_total", runtime_tag="llama-serve", error_type="generic") == 6
    assert (
        value(text, "accelmon_neuron_execution_status_total", runtime_tag="llama-serve", status_type="completed") == 300
    )
    assert value(text, "accelmon_neuron_hw_ecc_events_total", neuron_device="0", event_type="mem_ecc_uncorrected") == 1
    assert value(text, "accelmon_neuron_hw_ecc_events_total", neuron_device="0", event_type="mem_ecc_corrected") == 3
    assert value(text, "accelmon_neuron_system_context_switches_total") == 3000
    assert value(text, "accelmon_neuron_monitor_reports_total") == 4


def test_malformed_lines_are_skipped_and_counted():
    collector = NeuronCollector(monitor="/nonexistent")
    good = line(report(1))
    feed(collector, good, good[: len(good) // 2], "garbage{", "[1, 2]", '{"neuron_runtime_data": 7}', line(report(2)))
    text = sample(collector)
    assert value(text, "accelmon_neuron_monitor_malformed_lines_total") == 4
    assert value(text, "accelmon_neuron_monitor_reports_total") == 2
    assert value(text, "accelmon_neuron_execution_errors_total", runtime_tag="llama-serve", error_type="generic") == 3


def test_series_of_an_exited_runtime_disappear():
    collector = NeuronCollector(monitor="/nonexistent")
    feed(collector, line(report(1)))
    assert value(sample(collector), "accelmon_neuron_runtime_info", runtime_tag="4242") == 1
    for capture in range(2, 50):  # pids churn: each report a new short-lived runtime
        feed(
            collector,
            line(report(capture, [runtime("llama-serve", 3101, capture), runtime("", 9000 + capture, capture)])),
        )
    text = sample(collector)
    assert value(text, "accelmon_neuron_runtime_info", runtime_tag="4242") is None
    assert value(text, "accelmon_neuron_execution_errors_total", runtime_tag="4242") is None
    tags = {
        s.labels["runtime_tag"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "runtime_tag" in s.labels
    }
    assert tags == {"llama-serve", "9049"}
    assert len(collector.state.exec_status) == 2 * 6  # two live runtimes, six outcomes each: no growth


def test_group_errors_are_counted_not_exported_as_data():
    broken = report(1)
    broken["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["error"] = "failed to read counters"
    collector = NeuronCollector(monitor="/nonexistent")
    feed(collector, line(broken))
    text = sample(collector)
    assert value(text, "accelmon_neuron_monitor_group_errors_total", group="neuroncore_counters") == 1
    assert value(text, "accelmon_neuroncore_utilization_ratio", runtime_tag="llama-serve") is None
    assert value(text, "accelmon_neuroncore_utilization_ratio", runtime_tag="4242") == pytest.approx(0.4201)


def test_a_runtime_in_a_job_carries_the_job_on_its_info_series(tmp_path):
    # The collector as the exporter builds it: the cgroup tree under the configured sysfs root.
    slurm_job_cgroup(tmp_path / "fs" / "cgroup", 77, (3101,))
    registration = collectors()["neuron"]
    options = {option.name: option.default for option in registration.options}
    collector = registration.build({**options, "monitor_path": "/nonexistent"}, Paths(sysfs=str(tmp_path)))
    feed(collector, line(report(1)))
    text = sample(collector)
    promtool_check(text)
    assert value(text, "accelmon_neuron_runtime_info", runtime_tag="llama-serve", pid="3101", job_id="77") == 1
    assert value(text, "accelmon_neuron_runtime_info", runtime_tag="4242", pid="4242", job_id="") == 1
    # Only the info series names the job: per-runtime data is joined to it on runtime_tag at query time.
    assert value(text, "accelmon_neuroncore_utilization_ratio", runtime_tag="llama-serve", neuroncore="1") == 0.875
    others = [entry for entry in text.splitlines() if not entry.startswith(("#", "accelmon_neuron_runtime_info"))]
    assert not [entry for entry in others if "job_id" in entry]


def run_with_fake(tmp_path: Path, monkeypatch, lines: list[str], then: str, **options) -> NeuronCollector:
    data = tmp_path / "lines.jsonl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("FAKE_NEURON_LINES", str(data))
    monkeypatch.setenv("FAKE_NEURON_THEN", then)
    monkeypatch.setenv("FAKE_NEURON_STARTS", str(tmp_path / "starts"))
    collector = NeuronCollector(monitor=FAKE_MONITOR, **options)
    collector.start()
    return collector


def test_runs_neuron_monitor_with_its_config_and_reads_reports(tmp_path, monkeypatch):
    collector = run_with_fake(tmp_path, monkeypatch, [line(report(1)), line(report(2))], "hang", period_seconds=1)
    try:
        wait_until(lambda: collector.state.reports == 2)
        text = sample(collector)
        assert value(text, "accelmon_neuron_monitor_up") == 1
        config = (tmp_path / "starts").read_text().split()[0]
        assert '"period": "1s"' in Path(config).read_text()
    finally:
        collector.stop()
    assert not Path(config).exists()  # its private directory is cleaned up


def test_exiting_monitor_is_restarted_with_backoff_never_spinning(tmp_path, monkeypatch):
    collector = run_with_fake(tmp_path, monkeypatch, [line(report(1)), "trunc{"], "exit", max_backoff_seconds=60)

    def starts() -> list[float]:  # when each start began, on the system's monotonic clock (the fake writes it)
        written = tmp_path / "starts"
        return [float(line.split()[1]) for line in written.read_text().splitlines()] if written.exists() else []

    try:
        # Three starts, each after a longer wait than the one before (2 s, then 4 s): a lower bound, which a busy
        # machine only lengthens; a crash loop without backoff would start it hundreds of times.
        began = wait_until(lambda: len(starts()) >= 3 and starts(), timeout=30, what="three starts")
        assert began[1] - began[0] >= 2.0 - 0.05 and began[2] - began[1] >= 4.0 - 0.05
        text = sample(collector)
        assert value(text, "accelmon_neuron_monitor_restarts_total") in (len(began) - 1, len(starts()) - 1)
        assert value(text, "accelmon_neuron_monitor_malformed_lines_total") >= 1
    finally:
        collector.stop()


def test_a_silent_monitor_is_restarted_and_its_data_not_served(tmp_path, monkeypatch):
    collector = run_with_fake(tmp_path, monkeypatch, [line(report(1))], "hang", stall_seconds=1.0)
    try:
        wait_until(lambda: collector.state.restarts >= 1)
        wait_until(lambda: value(sample(collector), "accelmon_neuroncore_utilization_ratio") is None, 5)
    finally:
        collector.stop()


def test_no_neuron_monitor_is_no_data():
    collector = NeuronCollector(monitor="/nonexistent/neuron-monitor")
    collector.start()
    try:
        text = sample(collector)
        assert value(text, "accelmon_neuron_monitor_up") == 0
        assert "accelmon_neuroncore" not in text
    finally:
        collector.stop()


def test_malformed_lines_are_counted_but_logged_once_a_minute(caplog):
    """Garbage from the monitor wrote 75 MB of warnings a minute: one warning per line."""
    state = NeuronCollector(monitor="/nonexistent").state
    with caplog.at_level("WARNING", logger="accelmon.neuron"):
        for half_second in range(200):  # 100 s of garbage, two lines a second
            state.add_line(b"not json", now=1000.0 + half_second * 0.5, wall=0.0)
    assert state.malformed == 200
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 2  # the first, then one a minute later with the count in between
    assert "119 more since the last warning" in warnings[1]


def test_an_over_long_line_is_one_malformed_line_and_reading_goes_on(tmp_path, monkeypatch):
    """A 100 MB line took 14.8 s of CPU in quadratic copying and counted as 4 malformed lines."""
    from accelmon.host import neuron_monitor

    monkeypatch.setattr(neuron_monitor, "MAX_LINE_BYTES", 1 << 20)
    huge = "x" * (5 << 20)  # five times the limit
    collector = run_with_fake(tmp_path, monkeypatch, [huge, line(report(1))], "hang", period_seconds=1)
    try:
        wait_until(lambda: collector.state.reports == 1)
        assert collector.state.malformed == 1
    finally:
        collector.stop()


def test_a_monitor_that_never_ends_a_line_is_restarted(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NEURON_DELAY", "0.05")
    collector = run_with_fake(tmp_path, monkeypatch, [line(report(1))], "dribble", stall_seconds=1.0)
    try:
        wait_until(lambda: collector.state.restarts >= 1, 10)
    finally:
        collector.stop()


def test_a_restart_leaves_no_child_of_the_monitor_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NEURON_CHILD", str(tmp_path / "child.pid"))
    collector = run_with_fake(tmp_path, monkeypatch, [line(report(1))], "hang", period_seconds=1)
    try:
        wait_until(lambda: (tmp_path / "child.pid").exists() and collector.state.reports == 1)
        child = int((tmp_path / "child.pid").read_text())
    finally:
        collector.stop()

    def gone() -> bool:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return state == "Z"  # killed, waiting for its parent (here: whoever reaps orphans) to reap it

    wait_until(gone, 5), "the monitor's child outlived it, holding the pipe"
