"""The publisher: aggregates the samples the samplers hand over and sends each closed period from its own thread,
with its self-metrics."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

from accelmon.cloudwatch.aggregate import Aggregator, batches, datums
from accelmon.cloudwatch.identity import instance_identity
from accelmon.cloudwatch.settings import INSTANCE_DIMENSIONS, CloudWatchSettings
from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples

log = logging.getLogger("accelmon.cloudwatch")

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
