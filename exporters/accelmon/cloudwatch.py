"""Publishes a chosen set of the exporter's own samples to Amazon CloudWatch (optional; `cloudwatch:` in the config).

Why inside the exporter rather than a companion reading /metrics: the samplers already hold every value at full
resolution, so each period's datum is a statistic set (count, sum, min, max) over every sample of that period (a
1 s spike shows in Maximum; a companion scraping /metrics every 60 s would see one value in sixty), without a second
Python process (~25 MiB) and without parsing text. Isolation is kept by threads: a sampler hands its sample to
`Publisher.observe` (a dictionary update under a lock held for microseconds); the network, IMDS and boto3's
retries all run on the publisher's own thread, with bounded timeouts and a bounded backlog, so a dead endpoint
slows neither sampling nor /metrics. boto3 is imported only when publishing is on (it costs ~30 MiB).

Cost: CloudWatch bills each distinct (namespace, name, dimensions) a month and each PutMetricData request. A period
sends one datum per metric whatever the sampling rate, in as few requests as the limits allow (1000 datums and
1 MB each); dimensions are chosen per deployment (dropping the GPU dimension folds 8 GPUs into one metric whose
Minimum/Maximum still show the extremes). `accelmon-exporter --cloudwatch-cost` prints the bill for this host.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from accelmon.core import Catalogue, MetricSpec, Samples
from accelmon.registry import ConfigError, finite

log = logging.getLogger("accelmon.cloudwatch")

# PutMetricData's limits (CloudWatch API reference): datums and bytes per request, dimensions per datum, and the
# magnitudes it accepts (values outside are rejected, NaN and infinities too).
MAX_DATUMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000  # 1 MB, with the encoding estimated from above (see `datum_size`)
MAX_DIMENSIONS = 30
LARGEST_VALUE = 2.0**360
SMALLEST_VALUE = 2.0**-260

UNITS = (
    "Seconds Microseconds Milliseconds Bytes Kilobytes Megabytes Gigabytes Terabytes Bits Kilobits Megabits "
    "Gigabits Terabits Percent Count Bytes/Second Kilobytes/Second Megabytes/Second Gigabytes/Second "
    "Terabytes/Second Bits/Second Kilobits/Second Megabits/Second Gigabits/Second Terabits/Second Count/Second None"
).split()

# The dimensions a datum can carry: the instance's (from IMDSv2) and the device's (from the series' labels).
INSTANCE_DIMENSIONS = ("InstanceId", "InstanceType", "AutoScalingGroupName")
DEVICE_DIMENSIONS = {"GPU": ("gpu", "uuid"), "NeuronCore": ("neuroncore",)}  # dimension -> (label by index, by uuid)
DIMENSIONS = (*INSTANCE_DIMENSIONS, *DEVICE_DIMENSIONS)

# What the seed systems publish: the GPU AMI's gpumon (utilization, memory, power, temperature per GPU) and AWS's
# neuron-monitor-cloudwatch.py (NeuronCore utilization, runtime memory, execution errors).
DEFAULT_METRICS: tuple[dict[str, Any], ...] = (
    {"metric": "accelmon_gpu_utilization_ratio", "name": "GPUUtilization", "unit": "Percent", "scale": 100},
    {"metric": "accelmon_gpu_memory_used_bytes", "name": "GPUMemoryUsed", "unit": "Bytes"},
    {"metric": "accelmon_gpu_power_watts", "name": "GPUPowerWatts", "unit": "None"},
    {"metric": "accelmon_gpu_temperature_celsius", "name": "GPUTemperatureCelsius", "unit": "None"},
    {
        "metric": "accelmon_neuroncore_utilization_ratio",
        "name": "NeuronCoreUtilization",
        "unit": "Percent",
        "scale": 100,
    },
    {
        "metric": "accelmon_neuron_runtime_memory_used_bytes",
        "name": "NeuronRuntimeMemoryUsed",
        "unit": "Bytes",
        "match": {"memory_location": "neuron_device"},
    },
    {"metric": "accelmon_neuron_execution_errors_total", "name": "NeuronExecutionErrors", "unit": "Count"},
)

# List prices in US East (N. Virginia), from https://aws.amazon.com/cloudwatch/pricing/ as recorded on 2026-11-23
# (other regions differ; the free tier's 10 metrics and 1 million requests are per account, not subtracted here).
PRICES_AS_OF = "2026-11-23, us-east-1"
METRIC_PRICE_TIERS = ((10_000, 0.30), (240_000, 0.10), (750_000, 0.05), (math.inf, 0.02))  # metrics a month, $ each
REQUEST_PRICE_PER_1000 = 0.01
HOURS_PER_MONTH = 730  # AWS's own convention for monthly estimates


@dataclass(frozen=True)
class MetricChoice:
    """One exporter metric published to CloudWatch: which series (`match` filters on labels), under what name."""

    metric: str
    name: str
    unit: str = "None"
    scale: float = 1.0
    match: tuple[tuple[str, str], ...] = ()


@dataclass
class CloudWatchSettings:
    enabled: bool = False
    region: str = ""  # empty: the instance's region from IMDS, else the AWS chain's (AWS_REGION, ~/.aws/config)
    namespace: str = "accelmon"
    period_seconds: float = 60.0
    storage_resolution: int = 60  # 1 = high resolution (sub-minute periods); 60 = standard
    dimensions: tuple[str, ...] = ("InstanceId", "InstanceType", "AutoScalingGroupName", "GPU", "NeuronCore")
    gpu_dimension: str = "index"  # the GPU dimension's value: the NVML index or the UUID
    metrics: tuple[MetricChoice, ...] = field(default_factory=lambda: tuple(_metric(m, "") for m in DEFAULT_METRICS))
    endpoint_url: str = ""  # a VPC endpoint, or a test double; empty: the region's public endpoint
    imds_endpoint: str = "http://169.254.169.254"
    imds_timeout_seconds: float = 1.0
    request_timeout_seconds: float = 10.0
    max_attempts: int = 5  # per request, first try included; throttling backs off exponentially with jitter
    max_pending_datums: int = 20_000  # unsent datums kept while the endpoint is down; the oldest go first


def _metric(raw: Any, where: str) -> MetricChoice:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with metric, name, unit, scale, match; got {raw!r}")
    unknown = sorted(set(raw) - {"metric", "name", "unit", "scale", "match"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: match, metric, name, scale, unit")
    metric, name = raw.get("metric"), raw.get("name")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"{where}.metric: expected an accelmon metric name, got {metric!r}")
    if not isinstance(name, str) or not 1 <= len(name) <= 255 or not name.isascii() or name.startswith(":"):
        raise ConfigError(f"{where}.name: expected a CloudWatch metric name (1-255 ASCII characters), got {name!r}")
    unit = raw.get("unit", "None")
    if unit not in UNITS:
        raise ConfigError(f"{where}.unit: expected one of CloudWatch's units ({', '.join(UNITS)}), got {unit!r}")
    scale = finite(raw.get("scale", 1))
    if scale is None or scale <= 0:
        raise ConfigError(f"{where}.scale: expected a positive number, got {raw.get('scale')!r}")
    match = raw.get("match") or {}
    if not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in match.items()):
        raise ConfigError(f"{where}.match: expected a mapping of label names to values, got {match!r}")
    return MetricChoice(metric, name, unit, scale, tuple(sorted(match.items())))


def _text(data: dict[str, Any], key: str, default: str, where: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _number(data: dict[str, Any], key: str, default: float, lowest: float, highest: float, where: str) -> float:
    value = data.get(key, default)
    number = finite(value)
    if number is None or not lowest <= number <= highest:
        raise ConfigError(f"{where}.{key}: expected a number from {lowest:g} to {highest:g}, got {value!r}")
    return number


def parse_settings(data: Any, known_metrics: dict[str, MetricSpec], where: str = "cloudwatch") -> CloudWatchSettings:
    """The `cloudwatch:` section, checked in full: every wrong value is a ConfigError naming it."""
    if data is None:
        return CloudWatchSettings()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = {option.name for option in fields(CloudWatchSettings)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    defaults = CloudWatchSettings()
    enabled = data.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled: expected true or false, got {enabled!r}")
    namespace = _text(data, "namespace", defaults.namespace, where)
    if not 1 <= len(namespace) <= 255 or namespace.startswith("AWS/") or not namespace.isascii():
        raise ConfigError(f"{where}.namespace: expected 1-255 ASCII characters not starting AWS/, got {namespace!r}")
    resolution = data.get("storage_resolution", defaults.storage_resolution)
    if resolution not in (1, 60) or isinstance(resolution, bool):
        raise ConfigError(f"{where}.storage_resolution: expected 1 (high resolution) or 60, got {resolution!r}")
    # Standard resolution keeps one value a minute: a shorter period would only cost more requests.
    period = _number(data, "period_seconds", defaults.period_seconds, 1 if resolution == 1 else 60, 3600, where)
    dimensions = data.get("dimensions", list(defaults.dimensions))
    if not isinstance(dimensions, list) or not all(d in DIMENSIONS for d in dimensions):
        raise ConfigError(f"{where}.dimensions: expected a list of {', '.join(DIMENSIONS)}; got {dimensions!r}")
    if len(set(dimensions)) != len(dimensions) or len(dimensions) > MAX_DIMENSIONS:
        raise ConfigError(f"{where}.dimensions: each at most once; got {dimensions!r}")
    gpu_dimension = data.get("gpu_dimension", defaults.gpu_dimension)
    if gpu_dimension not in ("index", "uuid"):
        raise ConfigError(f"{where}.gpu_dimension: expected index or uuid, got {gpu_dimension!r}")
    raw_metrics = data.get("metrics", list(DEFAULT_METRICS))
    if not isinstance(raw_metrics, list) or not raw_metrics:
        raise ConfigError(f"{where}.metrics: expected a non-empty list, got {raw_metrics!r}")
    metrics = tuple(_metric(raw, f"{where}.metrics[{i}]") for i, raw in enumerate(raw_metrics))
    for i, choice in enumerate(metrics):
        if choice.metric not in known_metrics:
            raise ConfigError(
                f"{where}.metrics[{i}].metric: {choice.metric!r} is not an accelmon metric (docs/metrics.md lists them)"
            )
        labels = set(known_metrics[choice.metric].labels)
        stray = sorted(k for k, _ in choice.match if k not in labels)
        if stray:
            raise ConfigError(f"{where}.metrics[{i}].match: {choice.metric} has no label(s) {', '.join(stray)}")
    seen_names = [(choice.name, choice.match) for choice in metrics]
    if len(set(seen_names)) != len(seen_names):
        raise ConfigError(f"{where}.metrics: two entries publish the same name with the same match")
    endpoint = _text(data, "endpoint_url", "", where)
    imds = _text(data, "imds_endpoint", defaults.imds_endpoint, where)
    for key, url in (("endpoint_url", endpoint), ("imds_endpoint", imds)):
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.{key}: expected an http:// or https:// URL, got {url!r}")
    attempts = _number(data, "max_attempts", defaults.max_attempts, 1, 10, where)
    if attempts != int(attempts):
        raise ConfigError(f"{where}.max_attempts: expected a whole number, got {attempts!r}")
    return CloudWatchSettings(
        enabled=enabled,
        region=_text(data, "region", "", where),
        namespace=namespace,
        period_seconds=period,
        storage_resolution=int(resolution),
        dimensions=tuple(dimensions),
        gpu_dimension=gpu_dimension,
        metrics=metrics,
        endpoint_url=endpoint,
        imds_endpoint=imds,
        imds_timeout_seconds=_number(data, "imds_timeout_seconds", defaults.imds_timeout_seconds, 0.1, 10, where),
        request_timeout_seconds=_number(
            data, "request_timeout_seconds", defaults.request_timeout_seconds, 0.5, 60, where
        ),
        max_attempts=int(attempts),
        max_pending_datums=int(
            _number(data, "max_pending_datums", defaults.max_pending_datums, MAX_DATUMS_PER_REQUEST, 1e7, where)
        ),
    )


def check_boto3() -> None:
    """ConfigError unless boto3 can be imported (the `cloudwatch` extra): said before anything runs."""
    try:
        import boto3  # noqa: F401
    except ImportError as error:
        raise ConfigError("cloudwatch.enabled: publishing needs boto3 (pip install 'accelmon[cloudwatch]')") from error


# --- Instance identity (IMDSv2) ------------------------------------------------------------------------------------


def instance_identity(endpoint: str, timeout: float) -> dict[str, str]:
    """InstanceId, InstanceType, Region and AutoScalingGroupName (when the instance's tags are in IMDS) by IMDSv2:
    a session token first (PUT), then the reads. {} off EC2 or when IMDS does not answer within `timeout`."""
    base = endpoint.rstrip("/")
    try:
        request = urllib.request.Request(
            f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            token = response.read().decode()
    except (OSError, ValueError) as error:
        log.info("no instance metadata (IMDSv2 at %s: %s): publishing without instance dimensions", base, error)
        return {}

    def read(path: str) -> str:
        request = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read().decode().strip()
        except (OSError, ValueError):
            return ""  # a 404 (tags not exposed to IMDS) or a timeout: that item is unknown

    identity = {
        "InstanceId": read("instance-id"),
        "InstanceType": read("instance-type"),
        "Region": read("placement/region"),
        "AutoScalingGroupName": read("tags/instance/aws:autoscaling:groupName"),
    }
    return {key: value for key, value in identity.items() if value}


# --- Aggregation ---------------------------------------------------------------------------------------------------


@dataclass
class Statistics:
    """The observations of one datum over one period."""

    count: int = 0
    total: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


def _publishable(value: float) -> float | None:
    """value as CloudWatch accepts it: None for NaN, infinities and magnitudes over 2^360; tiny ones as 0."""
    if not math.isfinite(value) or abs(value) > LARGEST_VALUE:
        return None
    return 0.0 if abs(value) < SMALLEST_VALUE else value


# (metric name, unit, dimensions as ((name, value), ...)) of one datum
DatumKey = tuple[str, str, tuple[tuple[str, str], ...]]


class Aggregator:
    """Folds samples into one period's datums: gauges into statistic sets over every sample of every series that
    maps to the datum; counters into the increase over the period (a reset counts from 0, as `increase()` does)."""

    def __init__(self, settings: CloudWatchSettings, specs: dict[str, MetricSpec]) -> None:
        self.settings = settings
        # spec -> [(choice, label positions to match, device dimensions as (name, label position))]
        self.plan: dict[MetricSpec, list[tuple[MetricChoice, list[tuple[int, str]], list[tuple[str, int]]]]] = {}
        for choice in settings.metrics:
            spec = specs[choice.metric]
            where = [(spec.labels.index(label), value) for label, value in choice.match]
            device: list[tuple[str, int]] = []
            for dimension, labels in DEVICE_DIMENSIONS.items():
                label = labels[-1] if settings.gpu_dimension == "uuid" else labels[0]
                if dimension in settings.dimensions and label in spec.labels:
                    device.append((dimension, spec.labels.index(label)))
            self.plan.setdefault(spec, []).append((choice, where, device))
        self.gauges: dict[DatumKey, Statistics] = {}
        # counters: the latest value of each series, and what it was at the end of the last closed period
        self.counter_latest: dict[tuple[DatumKey, tuple[str, ...]], float] = {}
        self.counter_baseline: dict[tuple[DatumKey, tuple[str, ...]], float] = {}

    def observe(self, samples: Samples) -> None:
        for spec, choices in self.plan.items():
            rows = samples.rows.get(spec)
            if not rows:
                continue
            for choice, where, device in choices:
                for labels, value in rows:
                    if any(labels[i] != wanted for i, wanted in where):
                        continue
                    dims = tuple((name, labels[i]) for name, i in device if labels[i])
                    key = (choice.name, choice.unit, dims)
                    if spec.kind == "counter":
                        self.counter_latest[(key, labels)] = value
                    else:
                        stats = self.gauges.get(key)
                        if stats is None:
                            stats = self.gauges[key] = Statistics()
                        stats.add(value * choice.scale)

    def close(self) -> tuple[dict[DatumKey, Statistics], dict[DatumKey, float]]:
        """The period's gauge statistics and counter increases; starts the next period."""
        gauges, self.gauges = self.gauges, {}
        increases: dict[DatumKey, float] = {}
        scale = {choice.name: choice.scale for choice in self.settings.metrics}
        for series, latest in self.counter_latest.items():
            baseline = self.counter_baseline.get(series)
            if baseline is None:
                continue  # first seen: its value so far is not this period's (the energy counter counts from boot)
            increase = latest - baseline if latest >= baseline else latest
            key = series[0]
            increases[key] = increases.get(key, 0.0) + increase * scale[key[0]]
        # Series not seen this period are gone (an exited runtime): their baselines go with them.
        self.counter_baseline, self.counter_latest = dict(self.counter_latest), {}
        return gauges, increases


def datums(
    gauges: dict[DatumKey, Statistics],
    increases: dict[DatumKey, float],
    instance: list[tuple[str, str]],
    timestamp: float,
    resolution: int,
) -> list[dict[str, Any]]:
    """PutMetricData's MetricData entries for one closed period."""
    out = []
    for (name, unit, device), stats in gauges.items():
        low, high, total = _publishable(stats.minimum), _publishable(stats.maximum), _publishable(stats.total)
        if stats.count == 0 or low is None or high is None or total is None:
            continue
        values = {"SampleCount": float(stats.count), "Sum": total, "Minimum": low, "Maximum": high}
        out.append(_datum(name, unit, [*instance, *device], timestamp, resolution, StatisticValues=values))
    for (name, unit, device), increase in increases.items():
        value = _publishable(increase)
        if value is not None:
            out.append(_datum(name, unit, [*instance, *device], timestamp, resolution, Value=value))
    return out


def _datum(
    name: str, unit: str, dims: list[tuple[str, str]], timestamp: float, resolution: int, **value: Any
) -> dict[str, Any]:
    return {
        "MetricName": name,
        "Dimensions": [{"Name": k, "Value": v[:1024]} for k, v in dims[:MAX_DIMENSIONS]],
        "Timestamp": timestamp,
        "Unit": unit,
        "StorageResolution": resolution,
        **value,
    }


def datum_size(datum: dict[str, Any]) -> int:
    """An upper bound of the datum's bytes in a request: twice its JSON text (CBOR, boto3's protocol for CloudWatch
    today, and JSON are at most that) plus 32 bytes a field (the query protocol names each field, e.g.
    `MetricData.member.7.Dimensions.member.2.Value=`). Measured on the wire by the tests."""
    fields = 8 + 2 * len(datum["Dimensions"])
    return 2 * len(json.dumps(datum, default=str)) + 32 * fields


def batches(entries: Iterable[dict[str, Any]], namespace: str) -> list[list[dict[str, Any]]]:
    """entries split into requests within PutMetricData's limits: at most 1000 datums and 1 MB each."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 200 + 3 * len(namespace)  # Action, Version, Namespace
    for entry in entries:
        entry_size = datum_size(entry)
        if current and (len(current) >= MAX_DATUMS_PER_REQUEST or size + entry_size > MAX_REQUEST_BYTES):
            out.append(current)
            current, size = [], 200 + 3 * len(namespace)
        current.append(entry)
        size += entry_size
    if current:
        out.append(current)
    return out


# --- Self-metrics --------------------------------------------------------------------------------------------------

CATALOGUE = Catalogue(
    "cloudwatch",
    "CloudWatch publisher self-metrics",
    "Present when `cloudwatch.enabled` is true. A request is one PutMetricData call including boto3's retries; "
    "a datum is one metric's value (a statistic set or a counter's increase) for one period.",
)
REQUESTS = CATALOGUE.counter(
    "accelmon_cloudwatch_requests_total", "PutMetricData requests, by outcome (success or failure).", ["outcome"]
)
RETRIES = CATALOGUE.counter(
    "accelmon_cloudwatch_retries_total", "Retries of PutMetricData requests (throttling, 5xx, timeouts) by boto3.", ()
)
SENT = CATALOGUE.counter("accelmon_cloudwatch_datums_sent_total", "Datums CloudWatch accepted.", ())
DROPPED = CATALOGUE.counter(
    "accelmon_cloudwatch_datums_dropped_total",
    "Datums dropped unsent: the oldest, once more than max_pending_datums waited, or refused by CloudWatch.",
    (),
)
PENDING = CATALOGUE.gauge("accelmon_cloudwatch_datums_pending", "Datums waiting to be sent.", ())
LAST_SUCCESS = CATALOGUE.gauge(
    "accelmon_cloudwatch_last_success_timestamp_seconds", "Unix time of the latest accepted request (0 if none).", ()
)
IDENTITY = CATALOGUE.gauge(
    "accelmon_cloudwatch_instance_identity_known",
    "1 once the instance's identity (IMDSv2) is known and its dimensions are published, else 0.",
    (),
)


# --- The publisher -------------------------------------------------------------------------------------------------


class Publisher:
    """Aggregates samples handed over by the samplers and sends each closed period from its own thread."""

    def __init__(
        self,
        settings: CloudWatchSettings,
        specs: dict[str, MetricSpec],
    ) -> None:
        self.settings = settings
        self._aggregator = Aggregator(settings, specs)
        self._lock = threading.Lock()  # guards the aggregator: samplers observe, the publisher closes periods
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._identity: dict[str, str] | None = None
        self._next_identity_try = 0.0
        self._pending: deque[dict[str, Any]] = deque()
        self._counts_lock = threading.Lock()
        self.requests = {"success": 0, "failure": 0}
        self.retries = 0
        self.sent = 0
        self.dropped = 0
        self.last_success = 0.0

    # Called on sampler threads: only a dictionary update.
    def observe(self, collector: str, samples: Samples) -> None:
        with self._lock:
            self._aggregator.observe(samples)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cloudwatch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop; the unfinished period is sent if that takes less than `timeout` (the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def self_metrics(self) -> Samples:
        samples = Samples()
        with self._counts_lock:
            for outcome, count in self.requests.items():
                samples.add(REQUESTS, [outcome], count)
            samples.add(RETRIES, (), self.retries)
            samples.add(SENT, (), self.sent)
            samples.add(DROPPED, (), self.dropped)
            samples.add(PENDING, (), len(self._pending))
            samples.add(LAST_SUCCESS, (), self.last_success)
            samples.add(IDENTITY, (), 1 if self._identity else 0)
        return samples

    def _boto3_client(self, region: str) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            region_name=region or None,
            connect_timeout=self.settings.request_timeout_seconds,
            read_timeout=self.settings.request_timeout_seconds,
            # boto3's standard retries: throttling and transient errors, exponential backoff with jitter.
            retries={"mode": "standard", "max_attempts": self.settings.max_attempts},
        )
        return boto3.client("cloudwatch", endpoint_url=self.settings.endpoint_url or None, config=config)

    def _instance(self) -> list[tuple[str, str]]:
        """The instance dimensions chosen, once IMDS has answered (asked again every 5 minutes until it does)."""
        now = time.monotonic()
        if self._identity is None and now >= self._next_identity_try:
            identity = instance_identity(self.settings.imds_endpoint, self.settings.imds_timeout_seconds)
            if identity:
                self._identity = identity
                log.info("instance identity: %s", ", ".join(f"{k}={v}" for k, v in sorted(identity.items())))
            else:
                self._next_identity_try = now + 300
        identity = self._identity or {}
        chosen = [name for name in INSTANCE_DIMENSIONS if name in self.settings.dimensions]
        return [(name, identity[name]) for name in chosen if name in identity]

    def _run(self) -> None:
        period = self.settings.period_seconds
        # Periods line up with the wall clock (as CloudWatch's own), each datum stamped with its period's start.
        start = math.floor(time.time() / period) * period
        self._instance()
        self._connect()  # boto3's import and client (~0.4 s of CPU) once, before the first period ends
        while True:
            end = start + period
            stopping = self._stop.wait(max(0.0, end - time.time()))
            self._close_period(start)
            self._send(final=stopping)
            if stopping:
                return
            start = end

    def _connect(self) -> bool:
        """Whether a CloudWatch client exists, made now if need be (in the instance's region when none is set)."""
        if self._client is None:
            region = self.settings.region or (self._identity or {}).get("Region", "")
            try:
                self._client = self._boto3_client(region)
            # NoRegionError, a broken AWS config file: said, and tried again next period.
            except Exception as error:  # noqa: BLE001 (whatever boto3 raises must not end the publisher)
                self._count_failure(f"cannot make a CloudWatch client: {error}")
                return False
        return True

    def _close_period(self, start: float) -> None:
        with self._lock:
            gauges, increases = self._aggregator.close()
        entries = datums(gauges, increases, self._instance(), start, self.settings.storage_resolution)
        with self._counts_lock:
            self._pending.extend(entries)
            overflow = len(self._pending) - self.settings.max_pending_datums
            for _ in range(max(0, overflow)):
                self._pending.popleft()
            if overflow > 0:
                self.dropped += overflow
                log.warning("CloudWatch backlog full: dropped the %d oldest datums", overflow)

    def _send(self, final: bool = False) -> None:
        if not self._pending or not self._connect():
            return
        with self._counts_lock:
            pending = list(self._pending)
        for batch in batches(pending, self.settings.namespace):
            if self._stop.is_set() and not final:
                return
            try:
                response = self._client.put_metric_data(Namespace=self.settings.namespace, MetricData=batch)
            except Exception as error:  # noqa: BLE001 (whatever boto3 raises must not end the publisher)
                # After boto3's own retries. A refusal of the data itself (400, not throttling) would be refused
                # again: dropped. Anything else (network, 5xx, credentials) keeps the data for the next period.
                answer = getattr(error, "response", None) or {}  # a ClientError's; None on a timeout
                code = answer.get("Error", {}).get("Code", "")
                attempts = answer.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                refused = code in ("InvalidParameterValue", "InvalidParameterCombination", "MissingParameter")
                with self._counts_lock:
                    self.retries += attempts
                    if refused:
                        self._drop_sent(len(batch))
                        self.dropped += len(batch)
                fate = "dropped" if refused else "kept for the next period"
                self._count_failure(f"PutMetricData of {len(batch)} datums failed ({fate}): {error}")
                if not refused:
                    return
                continue
            with self._counts_lock:
                self.requests["success"] += 1
                self.retries += response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                self.sent += len(batch)
                self.last_success = time.time()
                self._drop_sent(len(batch))

    def _drop_sent(self, count: int) -> None:
        for _ in range(min(count, len(self._pending))):
            self._pending.popleft()

    def _count_failure(self, message: str) -> None:
        with self._counts_lock:
            self.requests["failure"] += 1
        log.warning("%s", message)


# --- Cost ----------------------------------------------------------------------------------------------------------


def monthly_cost(metrics: int, requests_per_period: int, period_seconds: float) -> dict[str, float]:
    """What publishing costs a month at the list prices of PRICES_AS_OF."""
    remaining, metric_cost = float(metrics), 0.0
    for size, price in METRIC_PRICE_TIERS:
        taken = min(remaining, size)
        metric_cost += taken * price
        remaining -= taken
        if remaining <= 0:
            break
    requests = requests_per_period * HOURS_PER_MONTH * 3600 / period_seconds
    request_cost = requests / 1000 * REQUEST_PRICE_PER_1000
    return {
        "metrics": metrics,
        "requests_per_month": requests,
        "metric_cost": metric_cost,
        "request_cost": request_cost,
        "total": metric_cost + request_cost,
    }


def cost_report(settings: CloudWatchSettings, specs: dict[str, MetricSpec], sampled: list[Samples]) -> str:
    """--cloudwatch-cost's text: the metrics this host would publish (from one sample of each collector, counted
    twice so counters show) and what they cost a month."""
    aggregator = Aggregator(settings, specs)
    for samples in sampled:
        aggregator.observe(samples)
    aggregator.close()
    for samples in sampled:
        aggregator.observe(samples)
    gauges, increases = aggregator.close()
    # Counters: the second sample gives an increase (0) for every series the first one had.
    instance = [(name, "i-0123456789abcdef0") for name in INSTANCE_DIMENSIONS if name in settings.dimensions]
    entries = datums(gauges, increases, instance, 0.0, settings.storage_resolution)
    per_period = len(batches(entries, settings.namespace))
    cost = monthly_cost(len(entries), per_period, settings.period_seconds)
    names: dict[str, int] = {}
    for entry in entries:
        names[entry["MetricName"]] = names.get(entry["MetricName"], 0) + 1
    lines = [
        f"CloudWatch cost of this host's publishing (list prices of {PRICES_AS_OF}; "
        f"period {settings.period_seconds:g} s, storage resolution {settings.storage_resolution} s)",
        f"dimensions: {', '.join(settings.dimensions) or 'none'} "
        "(instance dimensions counted as if IMDS answers; each adds no metric on one host)",
    ]
    lines += [f"  {name}: {count} metric(s)" for name, count in sorted(names.items())]
    lines += [
        f"metrics: {cost['metrics']:.0f}  x  ${METRIC_PRICE_TIERS[0][1]:.2f}/metric-month (first 10,000; "
        f"then $0.10, $0.05, $0.02)  = ${cost['metric_cost']:.2f}/month",
        f"PutMetricData requests: {per_period} per period = {cost['requests_per_month']:,.0f}/month  x  "
        f"${REQUEST_PRICE_PER_1000:.2f}/1000  = ${cost['request_cost']:.2f}/month",
        f"total: ${cost['total']:.2f}/month for this host (the account's free tier, 10 metrics and 1 million "
        "requests, not subtracted)",
    ]
    return "\n".join(lines)
