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

The package, by concern: `settings` (the config section), `identity` (IMDSv2), `aggregate` (statistic sets, datums,
requests within PutMetricData's limits), `publisher` (its thread and self-metrics), `cost` (the monthly bill).
"""

from accelmon.cloudwatch.aggregate import (
    Aggregator,
    Statistics,
    batches,
    datum,
    datum_size,
    datums,
)
from accelmon.cloudwatch.cost import cost_report, monthly_cost
from accelmon.cloudwatch.identity import instance_identity
from accelmon.cloudwatch.limits import MAX_REQUEST_BYTES
from accelmon.cloudwatch.publisher import CATALOGUE, RETRIES, Publisher
from accelmon.cloudwatch.settings import CloudWatchSettings, MetricChoice, check_boto3, parse_settings

__all__ = [
    "CATALOGUE",
    "MAX_REQUEST_BYTES",
    "RETRIES",
    "Aggregator",
    "CloudWatchSettings",
    "MetricChoice",
    "Publisher",
    "Statistics",
    "batches",
    "check_boto3",
    "cost_report",
    "datum",
    "datum_size",
    "datums",
    "instance_identity",
    "monthly_cost",
    "parse_settings",
]
