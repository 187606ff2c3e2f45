"""The CloudWatch publisher: aggregation, request limits, retries, isolation from sampling and /metrics, the config
checks and the cost estimate, against moto's CloudWatch server on loopback (boto3's real HTTP path)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from accelmon import cloudwatch
from accelmon.cloudwatch import Aggregator, CloudWatchSettings, MetricChoice, Publisher, batches, parse_settings
from accelmon.collectors import known_metrics, nvml
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import ConfigError
from tests.support.cloudwatch_doubles import FakeImds, RecordingProxy, SilentSocket
from tests.support.exposition import promtool_check, sample_value
from tests.support.neuron_reports import line, report
from tests.support.paths import FAKE_NEURON_MONITOR, ROOT
from tests.support.processes import exporter_env, free_port, start_exporter, wait_until_serving
from tests.support.waiting import wait_until

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
EC2 = {
    "instance-id": "i-0abc1234def567890",
    "instance-type": "p5.48xlarge",
    "placement/region": REGION,
    "tags/instance/aws:autoscaling:groupName": "trainers",
}


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    # Nothing of this machine's AWS set-up may leak in.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def reader(moto: str):
    return boto3.client("cloudwatch", endpoint_url=moto, region_name=REGION, **_keys())


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def namespace() -> str:
    return f"accelmon-test-{uuid.uuid4().hex[:8]}"  # moto's state is shared by the tests of this module


def statistics(client, space: str, name: str, dimensions: dict[str, str]) -> dict[str, float]:
    """Every statistic of a metric over the last hour, one bucket."""
    end = time.time() + 60
    answer = client.get_metric_statistics(
        Namespace=space,
        MetricName=name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=end - 3600,
        EndTime=end,
        Period=3600,
        Statistics=["SampleCount", "Sum", "Minimum", "Maximum", "Average"],
    )
    points = answer["Datapoints"]
    assert len(points) == 1, (name, dimensions, points)
    return points[0]


def all_metrics(client, space: str) -> list[dict]:
    pages = client.get_paginator("list_metrics").paginate(Namespace=space)
    return [metric for page in pages for metric in page["Metrics"]]


def listed(client, space: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    metrics = all_metrics(client, space)
    return {(m["MetricName"], frozenset((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in metrics}


# --- Aggregation (no network) --------------------------------------------------------------------------------------


def gpu_samples(utilizations: list[float], energy: list[float]) -> Samples:
    samples = Samples()
    for index, (busy, joules) in enumerate(zip(utilizations, energy)):
        labels = (str(index), f"GPU-{index:04d}")
        samples.add(nvml.UTILIZATION, labels, busy)
        samples.add(nvml.ENERGY, labels, joules)
    return samples


def settings_with(**changes) -> CloudWatchSettings:
    choices = (
        MetricChoice("accelmon_gpu_utilization_ratio", "GPUUtilization", "Percent", 100.0),
        MetricChoice("accelmon_gpu_energy_joules_total", "GPUEnergy", "None"),
    )
    return CloudWatchSettings(enabled=True, metrics=choices, **changes)


def test_gauges_become_statistic_sets_and_counters_their_increase():
    aggregator = Aggregator(settings_with(), known_metrics())
    aggregator.observe(gpu_samples([0.5, 0.1], [1000, 5000]))
    gauges, increases = aggregator.close()
    # First period: counters only set their baseline (the energy counter counts from the driver's load).
    assert increases == {}
    assert gauges[("GPUUtilization", "Percent", (("GPU", "0"),))] == cloudwatch.Statistics(1, 50.0, 50.0, 50.0)
    for busy, joules in ((0.2, 1100), (0.9, 1300), (0.4, 1700)):
        aggregator.observe(gpu_samples([busy, 0.1], [joules, 40]))  # GPU 1's counter was reset (driver reload)
    gauges, increases = aggregator.close()
    stats = gauges[("GPUUtilization", "Percent", (("GPU", "0"),))]
    assert (stats.count, stats.minimum, stats.maximum) == (3, 20.0, 90.0)
    assert stats.total == pytest.approx(150.0)
    assert increases == {("GPUEnergy", "None", (("GPU", "0"),)): 700.0, ("GPUEnergy", "None", (("GPU", "1"),)): 40.0}
    # A series that stops (an exited runtime, a lost GPU) leaves no stale datum behind.
    aggregator.observe(gpu_samples([0.3], [1800]))
    gauges, increases = aggregator.close()
    assert set(increases) == {("GPUEnergy", "None", (("GPU", "0"),))}
    assert set(gauges) == {("GPUUtilization", "Percent", (("GPU", "0"),))}


def test_without_the_gpu_dimension_gpus_fold_into_one_metric_that_keeps_the_extremes():
    aggregator = Aggregator(settings_with(dimensions=("InstanceId",)), known_metrics())
    aggregator.observe(gpu_samples([0.5, 0.1, 1.0], [10, 20, 30]))
    aggregator.observe(gpu_samples([0.5, 0.1, 1.0], [11, 22, 33]))
    gauges, increases = aggregator.close()
    assert gauges == {("GPUUtilization", "Percent", ()): cloudwatch.Statistics(6, 320.0, 10.0, 100.0)}
    assert increases == {}
    aggregator.observe(gpu_samples([0.5, 0.1, 1.0], [12, 25, 40]))
    assert aggregator.close()[1] == {("GPUEnergy", "None", ()): 1 + 3 + 7}


def test_gpu_dimension_by_uuid_and_label_match():
    specs = known_metrics()
    choices = (
        MetricChoice(
            "accelmon_neuron_runtime_memory_used_bytes",
            "DeviceMemory",
            "Bytes",
            1.0,
            (("memory_location", "neuron_device"),),
        ),
        MetricChoice("accelmon_gpu_utilization_ratio", "GPUUtilization", "Percent", 100.0),
    )
    aggregator = Aggregator(CloudWatchSettings(metrics=choices, gpu_dimension="uuid"), specs)
    samples = gpu_samples([0.25], [0])
    memory = specs["accelmon_neuron_runtime_memory_used_bytes"]
    samples.add(memory, ("serve", "host"), 7.0)
    samples.add(memory, ("serve", "neuron_device"), 12.0)
    samples.add(memory, ("1234", "neuron_device"), 3.0)
    aggregator.observe(samples)
    gauges, _ = aggregator.close()
    assert gauges[("GPUUtilization", "Percent", (("GPU", "GPU-0000"),))].maximum == 25.0
    # Runtimes (their tags churn) are never a dimension: both runtimes' device memory is one metric.
    assert gauges[("DeviceMemory", "Bytes", ())] == cloudwatch.Statistics(2, 15.0, 3.0, 12.0)


def test_nothing_cloudwatch_refuses_is_sent():
    stats = {
        ("A", "None", ()): cloudwatch.Statistics(1, float("inf"), 1.0, float("inf")),
        ("B", "None", ()): cloudwatch.Statistics(1, 2.0**400, 2.0**400, 2.0**400),
        ("C", "None", ()): cloudwatch.Statistics(1, 1e-100, 1e-100, 1e-100),
    }
    entries = cloudwatch.datums(stats, {("D", "Count", ()): float("nan")}, [], 0.0, 60)
    assert [e["MetricName"] for e in entries] == ["C"]
    assert entries[0]["StatisticValues"] == {"SampleCount": 1.0, "Sum": 0.0, "Minimum": 0.0, "Maximum": 0.0}


def test_batches_never_exceed_the_request_limits():
    small = [cloudwatch.datum("M", "None", [("GPU", str(i))], 0.0, 60, Value=1.0) for i in range(2500)]
    assert [len(b) for b in batches(small, "ns")] == [1000, 1000, 500]
    big = [
        cloudwatch.datum("M", "None", [(f"D{j}", f"{i}-" + "x" * 1020) for j in range(30)], 0.0, 60, Value=1.0)
        for i in range(60)
    ]
    split = batches(big, "ns")
    assert len(split) > 1 and sum(len(b) for b in split) == 60
    assert all(sum(cloudwatch.datum_size(d) for d in b) <= cloudwatch.MAX_REQUEST_BYTES for b in split)


# --- Through boto3 to moto ------------------------------------------------------------------------------------------

WIDE = Catalogue("test", "test").gauge(
    "accelmon_test_wide", "A metric with as many GPUs as a test wants.", ["gpu", "uuid"]
)


def test_requests_stay_within_limits_on_the_wire(moto, aws_env):
    """2,500 GPUs' worth of datums with 1,000-character UUIDs: every request boto3 sends has at most 1000 datums
    and 1 MB (measured on the wire by the proxy), and every datum arrives."""
    proxy = RecordingProxy(moto)
    space = namespace()
    settings = CloudWatchSettings(
        enabled=True,
        region=REGION,
        namespace=space,
        endpoint_url=proxy.url,
        gpu_dimension="uuid",
        dimensions=("GPU",),
        metrics=(MetricChoice("accelmon_test_wide", "Wide"),),
    )
    publisher = Publisher(settings, {"accelmon_test_wide": WIDE})
    samples = Samples()
    for i in range(2500):
        samples.add(WIDE, (str(i), f"GPU-{i:05d}-" + "u" * (1000 if i < 1200 else 10)), float(i))
    publisher.observe("test", samples)
    publisher._close_period(0.0)
    publisher._send()
    try:
        assert publisher.sent == 2500 and publisher.requests == {"success": len(proxy.recorded.requests), "failure": 0}
        assert len(proxy.recorded.requests) >= 4
        print("requests (bytes, datums):", proxy.recorded.requests)
        for size, count in proxy.recorded.requests:
            assert count <= 1000 and size <= 1_048_576, proxy.recorded.requests
        assert sum(count for _, count in proxy.recorded.requests) == 2500
        assert len(all_metrics(reader(moto), space)) == 2500
    finally:
        proxy.close()


def test_throttling_is_retried_with_backoff(moto, aws_env):
    proxy = RecordingProxy(moto, throttle=2)
    space = namespace()
    settings = CloudWatchSettings(
        enabled=True, region=REGION, namespace=space, endpoint_url=proxy.url, dimensions=("GPU",)
    )
    publisher = Publisher(settings, known_metrics())
    publisher.observe("nvml", gpu_samples([0.5], [1.0]))
    publisher._close_period(time.time())
    publisher._send()
    try:
        assert proxy.recorded.throttled == 2
        assert publisher.requests == {"success": 1, "failure": 0} and publisher.retries == 2
        assert statistics(reader(moto), space, "GPUUtilization", {"GPU": "0"})["Maximum"] == 50.0
        self_metrics = publisher.self_metrics().rows
        assert self_metrics[cloudwatch.RETRIES] == [((), 2)]
    finally:
        proxy.close()


def test_an_endpoint_that_keeps_failing_keeps_the_data_and_bounds_the_backlog(aws_env):
    dead = SilentSocket()
    settings = CloudWatchSettings(
        enabled=True,
        region=REGION,
        endpoint_url=dead.url,
        dimensions=("GPU",),
        request_timeout_seconds=0.5,
        max_attempts=1,
        max_pending_datums=1000,
    )
    publisher = Publisher(settings, known_metrics())
    try:
        for period in range(3):
            samples = Samples()
            for i in range(400):
                samples.add(nvml.UTILIZATION, (str(i), ""), 0.5)
            publisher.observe("nvml", samples)
            publisher._close_period(float(period * 60))
            publisher._send()
        # 1200 datums made, 1000 kept: the oldest 200 dropped and counted; nothing claimed as sent.
        assert publisher.requests["failure"] == 3 and publisher.sent == 0
        assert publisher.dropped == 200 and len(publisher._pending) == 1000
        assert publisher._pending[0]["Timestamp"] == 0.0 and publisher._pending[-1]["Timestamp"] == 120.0
    finally:
        dead.close()


# --- The exporter as a user runs it ---------------------------------------------------------------------------------


def start_publishing_exporter(tmp_path, fake_nvml_dir, publishing: dict, port: int, extra_env: dict | None = None):
    nvml_conf = tmp_path / "fake-nvml.conf"
    nvml_conf.write_text("gpus 4\n")
    reports = tmp_path / "reports.jsonl"
    reports.write_text("\n".join(line(report(i)) for i in range(1, 4)) + "\n")
    config = tmp_path / "accelmon.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": f"127.0.0.1:{port}"},
                "collectors": {
                    "nvml": {"enabled": True, "interval_seconds": 0.5},
                    "infiniband": {"enabled": False},
                    "neuron": {
                        "enabled": True,
                        "interval_seconds": 0.5,
                        "period_seconds": 1,
                        "monitor_path": str(FAKE_NEURON_MONITOR),
                    },
                },
                "cloudwatch": {
                    "enabled": True,
                    "region": REGION,
                    "period_seconds": 1,
                    "storage_resolution": 1,
                    **publishing,
                },
            }
        )
    )
    env = exporter_env(fake_nvml_dir, nvml_conf)
    env.update(
        CREDENTIALS,
        FAKE_NEURON_LINES=str(reports),
        FAKE_NEURON_THEN="repeat",
        FAKE_NEURON_DELAY="0.3",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    env.update(extra_env or {})
    log = open(tmp_path / "exporter.log", "w")
    process = start_exporter(["--config", str(config)], env, stderr=log)
    return process, log


def scrape(port: int) -> tuple[str, float]:
    begin = time.monotonic()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return text, time.monotonic() - begin


def test_exporter_publishes_gpu_and_neuron_metrics_with_instance_dimensions(moto, fake_nvml_dir, tmp_path):
    imds, proxy, space, port = FakeImds(EC2), RecordingProxy(moto), namespace(), free_port()
    process, log = start_publishing_exporter(
        tmp_path, fake_nvml_dir, {"namespace": space, "endpoint_url": proxy.url, "imds_endpoint": imds.url}, port
    )
    try:
        wait_until_serving(port)

        def published() -> str | None:
            text, _ = scrape(port)
            return (
                text
                if (sample_value(text, "accelmon_cloudwatch_requests_total", outcome="success") or 0) >= 4
                else None
            )

        text = wait_until(published, timeout=30, every=0.5, what="four successful PutMetricData requests")
        assert sample_value(text, "accelmon_cloudwatch_instance_identity_known") == 1
        assert sample_value(text, "accelmon_cloudwatch_last_success_timestamp_seconds") > time.time() - 30
        promtool_check(text)
        client = reader(moto)
        instance = {"InstanceId": EC2["instance-id"], "InstanceType": "p5.48xlarge", "AutoScalingGroupName": "trainers"}
        metrics = listed(client, space)
        for gpu in range(4):
            for name in ("GPUUtilization", "GPUMemoryUsed", "GPUPowerWatts", "GPUTemperatureCelsius"):
                assert (name, frozenset({**instance, "GPU": str(gpu)}.items())) in metrics, (name, gpu, metrics)
        for core in ("0", "1"):
            assert ("NeuronCoreUtilization", frozenset({**instance, "NeuronCore": core}.items())) in metrics
        assert ("NeuronRuntimeMemoryUsed", frozenset(instance.items())) in metrics
        assert ("NeuronExecutionErrors", frozenset(instance.items())) in metrics
        # The fake driver's GPU 2 is 30 % busy; its statistic sets count every 0.5 s sample.
        busy = statistics(client, space, "GPUUtilization", {**instance, "GPU": "2"})
        assert busy["Minimum"] == busy["Maximum"] == 30.0 and busy["SampleCount"] >= 4
        # Core 1 is 87.5 % busy in one runtime and idle in the other: the extremes survive the fold.
        core = statistics(client, space, "NeuronCoreUtilization", {**instance, "NeuronCore": "1"})
        assert (core["Minimum"], core["Maximum"]) == (0.0, 87.5)
        # The runtime's error counter grows by 1, 2, 3 per report: published as increases, never as its total.
        errors = statistics(client, space, "NeuronExecutionErrors", instance)
        total = sample_value(
            scrape(port)[0], "accelmon_neuron_execution_errors_total", runtime_tag="llama-serve", error_type="generic"
        )
        assert 0 < errors["Sum"] < total
        assert all(count <= 1000 for _, count in proxy.recorded.requests)
        assert imds.unauthorised == 0  # every read carried the IMDSv2 token
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        proxy.close()
        imds.close()


def test_a_dead_endpoint_and_a_silent_imds_slow_neither_sampling_nor_metrics(fake_nvml_dir, tmp_path):
    dead = SilentSocket()
    port = free_port()
    started = time.monotonic()
    process, log = start_publishing_exporter(
        tmp_path,
        fake_nvml_dir,
        {
            "endpoint_url": dead.url,
            "imds_endpoint": dead.url,
            # Short timeouts (the settings' floors are 0.1 and 0.5 s): the publisher blocks on the dead endpoint
            # all the same, and the test waits seconds, not the 10 s a request took with 2 s and 3 s here.
            "imds_timeout_seconds": 0.5,
            "request_timeout_seconds": 1,
            "max_attempts": 2,
        },
        port,
    )
    try:
        wait_until_serving(port)
        assert time.monotonic() - started < 15  # the exporter serves without waiting on IMDS
        slowest, scrapes, deadline = 0.0, 0, time.monotonic() + 30
        # At least 4 s of scrapes, and until a request has failed (1 s timeout, 2 attempts, boto3's backoff):
        # all along, the publisher's thread is blocked on the dead endpoint.
        while time.monotonic() < deadline:
            text, took = scrape(port)
            slowest, scrapes = max(slowest, took), scrapes + 1
            failed = sample_value(text, "accelmon_cloudwatch_requests_total", outcome="failure") or 0
            if scrapes >= 8 and failed >= 1:
                break
            time.sleep(0.5)
        assert process.poll() is None
        # Sampling went on: the latest NVML sample is recent and the exporter still says it succeeds.
        assert sample_value(text, "accelmon_collector_success", collector="nvml") == 1
        assert (
            sample_value(text, "accelmon_collector_last_sample_timestamp_seconds", collector="nvml") > time.time() - 3
        )
        assert sample_value(text, "accelmon_cloudwatch_instance_identity_known") == 0
        assert (sample_value(text, "accelmon_cloudwatch_requests_total", outcome="failure") or 0) >= 1
        assert sample_value(text, "accelmon_cloudwatch_datums_pending") > 0
        assert sample_value(text, "accelmon_cloudwatch_datums_sent_total") == 0
        assert slowest < 1.0, f"a scrape took {slowest:.2f} s while CloudWatch was unreachable"
    finally:
        process.terminate()
        assert process.wait(10) == 0  # a publisher stuck on the network does not hold up shutdown
        log.close()
        dead.close()
    assert "Traceback" not in (tmp_path / "exporter.log").read_text()


# --- Settings and the cost estimate ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, message",
    [
        ({"enabled": "yes"}, "cloudwatch.enabled: expected true or false"),
        ({"region_name": "x"}, "cloudwatch: unknown key(s) region_name"),
        ({"namespace": "AWS/EC2"}, "cloudwatch.namespace"),
        ({"storage_resolution": 10}, "cloudwatch.storage_resolution: expected 1 (high resolution) or 60"),
        ({"period_seconds": 10}, "cloudwatch.period_seconds: expected a number from 60 to 3600"),
        ({"dimensions": ["InstanceId", "Hostname"]}, "cloudwatch.dimensions: expected a list of"),
        ({"gpu_dimension": "serial"}, "cloudwatch.gpu_dimension: expected one of index, uuid"),
        ({"endpoint_url": "monitoring.local"}, "cloudwatch.endpoint_url: expected an http:// or https:// URL"),
        ({"metrics": []}, "cloudwatch.metrics: expected a non-empty list"),
        ({"metrics": [{"metric": "gpu_util", "name": "U"}]}, "cloudwatch.metrics[0].metric: 'gpu_util' is not"),
        ({"metrics": [{"metric": "accelmon_gpu_power_watts", "name": "P", "unit": "Watts"}]}, "metrics[0].unit"),
        ({"metrics": [{"metric": "accelmon_gpu_power_watts", "name": ""}]}, "cloudwatch.metrics[0].name"),
        ({"metrics": [{"metric": "accelmon_gpu_power_watts", "name": "P", "scale": 0}]}, "metrics[0].scale"),
        (
            {"metrics": [{"metric": "accelmon_gpu_power_watts", "name": "P", "match": {"node": "a"}}]},
            "no label(s) node",
        ),
        ({"max_attempts": 2.5}, "cloudwatch.max_attempts: expected a whole number"),
        ({"imds_timeout_seconds": float("inf")}, "cloudwatch.imds_timeout_seconds"),
    ],
)
def test_bad_cloudwatch_settings_are_refused_naming_the_setting(section, message):
    with pytest.raises(ConfigError, match=None) as error:
        parse_settings(section, known_metrics())
    assert message in str(error.value)


def test_check_config_refuses_a_bad_setting_before_anything_runs(tmp_path):
    config = tmp_path / "accelmon.yml"
    config.write_text(yaml.safe_dump({"cloudwatch": {"enabled": True, "storage_resolution": 5}}))
    result = subprocess.run(
        [sys.executable, "-m", "accelmon", "--check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "cloudwatch.storage_resolution" in result.stderr
    assert "Traceback" not in result.stderr


def test_cost_estimate_counts_this_hosts_metrics(fake_nvml_dir, tmp_path):
    nvml_conf = tmp_path / "fake-nvml.conf"
    nvml_conf.write_text("gpus 8\n")
    env = exporter_env(fake_nvml_dir, nvml_conf)

    def cost(section: dict) -> str:
        config = tmp_path / "accelmon.yml"
        config.write_text(yaml.safe_dump({"collectors": {"infiniband": {"enabled": False}}, "cloudwatch": section}))
        result = subprocess.run(
            [sys.executable, "-m", "accelmon", "--cloudwatch-cost", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    # The defaults: 4 GPU metrics x 8 GPUs, one request a minute.
    text = cost({})
    assert "GPUUtilization: 8 metric(s)" in text and "metrics: 32 " in text
    assert f"= ${32 * 0.30:.2f}/month" in text
    requests = 730 * 60
    assert f"1 per period = {requests:,}/month" in text and f"= ${requests / 1000 * 0.01:.2f}/month" in text
    assert f"total: ${32 * 0.30 + requests / 1000 * 0.01:.2f}/month" in text
    # Without the GPU dimension the 8 GPUs fold into one metric of each name; every 5 minutes, 12 requests an hour.
    folded = cost({"dimensions": ["InstanceId"], "period_seconds": 300})
    assert "metrics: 4 " in folded and f"{730 * 12:,}/month" in folded


def test_docs_list_the_publishers_self_metrics():
    text = (Path(ROOT) / "docs" / "metrics.md").read_text()
    for spec in cloudwatch.CATALOGUE.specs:
        assert f"`{spec.name}`" in text


def test_the_docs_list_every_setting_from_its_declaration():
    """docs/cloudwatch.md's settings table is generated from the one declaration that also validates them."""
    from accelmon.cloudwatch.settings import OPTIONS, options_table

    page = (ROOT / "docs" / "cloudwatch.md").read_text()
    assert options_table() in page, "docs/cloudwatch.md: regenerate the settings table from OPTIONS"
    for option in OPTIONS:  # and each is checked: its default passes, a wrong type is refused naming it
        assert option.check(option.default, f"cloudwatch.{option.name}") == option.default
        with pytest.raises(ConfigError, match=f"cloudwatch.{option.name}"):
            parse_settings({option.name: object()}, known_metrics())
