"""What publishing costs a month, for `accelmon-exporter --cloudwatch-cost`."""

from __future__ import annotations

import math

from accelmon.cloudwatch.aggregate import Aggregator, batches, datums
from accelmon.cloudwatch.settings import INSTANCE_DIMENSIONS, CloudWatchSettings
from accelmon.exporter.metrics import MetricSpec, Samples

# List prices in US East (N. Virginia), from https://aws.amazon.com/cloudwatch/pricing/ as recorded on 2026-11-23
# (other regions differ; the free tier's 10 metrics and 1 million requests are per account, not subtracted here).
PRICES_AS_OF = "2026-11-23, us-east-1"
METRIC_PRICE_TIERS = ((10_000, 0.30), (240_000, 0.10), (750_000, 0.05), (math.inf, 0.02))  # metrics a month, $ each
REQUEST_PRICE_PER_1000 = 0.01
HOURS_PER_MONTH = 730  # AWS's own convention for monthly estimates


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
