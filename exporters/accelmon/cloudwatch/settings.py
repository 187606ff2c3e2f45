"""The `cloudwatch:` section of the exporter's config: what is published, under which names, units and dimensions,
and how; every wrong value is a ConfigError naming it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelmon.cloudwatch.limits import DEVICE_DIMENSIONS, MAX_DATUMS_PER_REQUEST, MAX_DIMENSIONS
from accelmon.exporter.metrics import MetricSpec
from accelmon.exporter.validation import ConfigError, Option, finite

UNITS = (
    "Seconds Microseconds Milliseconds Bytes Kilobytes Megabytes Gigabytes Terabytes Bits Kilobits Megabits "
    "Gigabits Terabits Percent Count Bytes/Second Kilobytes/Second Megabytes/Second Gigabytes/Second "
    "Terabytes/Second Bits/Second Kilobits/Second Megabits/Second Gigabits/Second Terabits/Second Count/Second None"
).split()

# The dimensions a datum can carry: the instance's (from IMDSv2) and the device's (from the series' labels).
INSTANCE_DIMENSIONS = ("InstanceId", "InstanceType", "AutoScalingGroupName")
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


# The section's settings, declared once: validated from here, listed in docs/cloudwatch.md from here (a test checks
# the page), and passed through by the role as given (`accelmon_exporter_cloudwatch`). `metrics` (a list of
# mappings) is checked by `_metric` against the exporter's metric catalogue.
OPTIONS = (
    Option("enabled", False, "publish to CloudWatch"),
    Option("region", "", "the AWS region; empty: the instance's (IMDS), else the AWS chain's", empty=True),
    Option("namespace", "accelmon", "CloudWatch namespace (1-255 ASCII characters, not AWS/...)"),
    Option("period_seconds", 60.0, "one datum per metric per period (at least 60 at standard resolution)",
           minimum=1, maximum=3600),
    Option("storage_resolution", 60.0, "1 (high resolution: sub-minute periods) or 60 (standard)", minimum=1,
           maximum=60, whole=True),
    Option("gpu_dimension", "index", "the GPU dimension's value", choices=("index", "uuid")),
    Option("endpoint_url", "", "a VPC endpoint (http:// or https://); empty: the region's public one", empty=True),
    Option("imds_endpoint", "http://169.254.169.254", "where IMDSv2 answers"),
    Option("imds_timeout_seconds", 1.0, "IMDS's timeout per request", minimum=0.1, maximum=10),
    Option("request_timeout_seconds", 10.0, "PutMetricData's timeout per request", minimum=0.5, maximum=60),
    Option("max_attempts", 5.0, "tries per request, the first included (throttling backs off)", minimum=1,
           maximum=10, whole=True),
    Option("max_pending_datums", 20_000.0, "unsent datums kept while the endpoint is down (the oldest go first)",
           minimum=MAX_DATUMS_PER_REQUEST, maximum=10_000_000, whole=True),
)  # fmt: skip


def options_table() -> str:
    """docs/cloudwatch.md's table of the settings, from OPTIONS."""
    rows = ["| setting | default, bounds | meaning |", "| --- | --- | --- |"]
    for option in OPTIONS:
        line = option.describe()
        default = line[line.index("(") + 1 : line.index("):")]
        rows.append(f"| `{option.name}` | {default} | {option.help} |")
    rows.append(f"| `dimensions` | default [{', '.join(CloudWatchSettings.dimensions)}] | the dimensions each datum "
                f"carries, each of {', '.join(DIMENSIONS)} at most once (fewer: fewer billed metrics) |")  # fmt: skip
    rows.append("| `metrics` | gpumon's and neuron-monitor-cloudwatch's (above) | what is published: `metric`, `name`, "
                "`unit`, `scale`, `match` |")  # fmt: skip
    return "\n".join(rows)


def parse_settings(data: Any, known_metrics: dict[str, MetricSpec], where: str = "cloudwatch") -> CloudWatchSettings:
    """The `cloudwatch:` section, checked in full: every wrong value is a ConfigError naming it."""
    if data is None:
        return CloudWatchSettings()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = {option.name for option in OPTIONS} | {"dimensions", "metrics"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    values = {o.name: o.check(data[o.name], f"{where}.{o.name}") if o.name in data else o.default for o in OPTIONS}
    namespace = str(values["namespace"])
    if len(namespace) > 255 or namespace.startswith("AWS/") or not namespace.isascii():
        raise ConfigError(f"{where}.namespace: expected 1-255 ASCII characters not starting AWS/, got {namespace!r}")
    if values["storage_resolution"] not in (1, 60):
        raise ConfigError(
            f"{where}.storage_resolution: expected 1 (high resolution) or 60, got {data['storage_resolution']!r}"
        )
    # Standard resolution keeps one value a minute: a shorter period would only cost more requests.
    if values["storage_resolution"] == 60 and float(values["period_seconds"]) < 60:  # type: ignore[arg-type]
        raise ConfigError(f"{where}.period_seconds: expected a number from 60 to 3600, got {data['period_seconds']!r}")
    dimensions = data.get("dimensions", list(CloudWatchSettings.dimensions))
    if not isinstance(dimensions, list) or not all(d in DIMENSIONS for d in dimensions):
        raise ConfigError(f"{where}.dimensions: expected a list of {', '.join(DIMENSIONS)}; got {dimensions!r}")
    if len(set(dimensions)) != len(dimensions) or len(dimensions) > MAX_DIMENSIONS:
        raise ConfigError(f"{where}.dimensions: each at most once; got {dimensions!r}")
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
    for key in ("endpoint_url", "imds_endpoint"):
        url = str(values[key])
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.{key}: expected an http:// or https:// URL, got {url!r}")
    return CloudWatchSettings(
        enabled=bool(values["enabled"]),
        region=str(values["region"]),
        namespace=namespace,
        period_seconds=float(values["period_seconds"]),  # type: ignore[arg-type]
        storage_resolution=int(values["storage_resolution"]),  # type: ignore[call-overload]
        dimensions=tuple(dimensions),
        gpu_dimension=str(values["gpu_dimension"]),
        metrics=metrics,
        endpoint_url=str(values["endpoint_url"]),
        imds_endpoint=str(values["imds_endpoint"]),
        imds_timeout_seconds=float(values["imds_timeout_seconds"]),  # type: ignore[arg-type]
        request_timeout_seconds=float(values["request_timeout_seconds"]),  # type: ignore[arg-type]
        max_attempts=int(values["max_attempts"]),  # type: ignore[call-overload]
        max_pending_datums=int(values["max_pending_datums"]),  # type: ignore[call-overload]
    )


def check_boto3() -> None:
    """ConfigError unless boto3 can be imported (the `cloudwatch` extra): said before anything runs."""
    try:
        import boto3  # noqa: F401
    except ImportError as error:
        raise ConfigError("cloudwatch.enabled: publishing needs boto3 (pip install 'accelmon[cloudwatch]')") from error
