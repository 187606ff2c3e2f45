"""The exporter's runtime: collectors sample on their own threads; a scrape only reads cached text.

A scrape never waits on hardware. Each collector runs in a `Sampler` thread at its own interval and the
rendered exposition of its latest sample is kept in memory; `/metrics` concatenates those texts and a few
self-metrics. A hung collector only ages its own data, which its self-metrics show. What a collector exports and
how a sample is rendered is the metric model, `accelmon.exporter.metrics`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from accelmon import __version__
from accelmon.exporter.metrics import EOF, Catalogue, Samples, render

log = logging.getLogger("accelmon")


class Collector:
    """Base class: `sample()` returns the families of one sample. Subclasses set `name`.

    `start()` may open devices or start helper threads; `sample()` may raise, which counts as a failed sample.
    """

    name = ""
    # Seconds after start() before a sample has all its values (a value computed over a window needs one full
    # window): --once waits this long before its single sample.
    first_sample_delay = 0.0
    # Reads the other collectors' samples (see `watch`): sampled after them when all sample once (--once, --scan).
    reads_other_samples = False
    # Collectors whose series this one serves in their place: they are still sampled, but not served.
    replaces: tuple[str, ...] = ()

    def hardware_answering(self) -> bool | None:
        """Whether the hardware (or the tool) this collector reads answers now; None where that means nothing."""
        return None

    def start(self) -> None:
        """Prepare the hardware connection; called once on the sampler thread before the first sample."""

    def watch(self, samplers: list[Sampler]) -> None:
        """Given every sampler of the process once they are built (the health collector reads their samples)."""

    def sample(self) -> Samples:
        raise NotImplementedError

    def stop(self) -> None:
        """Release the hardware; called once at shutdown."""


@dataclass
class SampleState:
    latest: Samples | None = None  # the latest successful sample, rendered only when scraped
    generation: int = 0  # counts successful samples: what a rendering is memoized against
    success: bool = False
    duration_seconds: float = 0.0
    last_sample_timestamp: float = 0.0  # wall clock, 0 = never
    last_sample_monotonic: float = 0.0
    errors: int = 0
    samples: int = 0


class Sampler:
    """Runs one collector on its own thread and keeps the rendered text of its latest sample."""

    def __init__(
        self,
        collector: Collector,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        hardware_expected: bool = False,
    ) -> None:
        self.collector = collector
        self.interval = interval
        # The collector was enabled on purpose, or the host shows the hardware (a driver, a device class): then
        # hardware that does not answer is a fault, not a host without it.
        self.hardware_expected = hardware_expected
        self._clock = clock
        self._wall_clock = wall_clock
        self._state = SampleState()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        # The latest sample rendered, per format: rendering follows the scrapes (one per sample at most), not
        # the sampling rate (a 1 s sampler scraped every 15 s renders once in 15).
        self._rendered: dict[bool, tuple[int, bytes]] = {}
        self._render_lock = threading.Lock()
        # Called with (collector name, sample) after each successful sample, on this sampler's thread: they must
        # only hand the sample over (the CloudWatch publisher aggregates it under a short lock).
        self.sinks: list[Callable[[str, Samples], None]] = []

    @property
    def name(self) -> str:
        return self.collector.name

    def rendered(self, state: SampleState, openmetrics: bool = False) -> bytes:
        """`state`'s sample in the text format or OpenMetrics, rendered once per sample and format."""
        if state.latest is None:
            return b""
        with self._render_lock:
            generation, text = self._rendered.get(openmetrics, (-1, b""))
            if generation != state.generation:
                text = render(state.latest, openmetrics)
                self._rendered[openmetrics] = (state.generation, text)
            return text

    def state(self) -> SampleState:
        with self._lock:
            return SampleState(**vars(self._state))

    def sample_once(self) -> bool:
        """Take one sample now, on the calling thread. Returns whether it succeeded."""
        self.start_collector()
        begin = self._clock()
        latest: Samples | None = None
        try:
            latest = self.collector.sample()
            ok = True
        except Exception:
            log.exception("collector %s failed", self.name)
            ok = False
        end = self._clock()
        with self._lock:
            state = self._state
            state.samples += 1
            state.success = ok
            state.duration_seconds = end - begin
            if ok:
                state.latest = latest
                state.generation += 1
                state.last_sample_timestamp = self._wall_clock()
                state.last_sample_monotonic = end
            else:
                state.errors += 1
        if ok and latest is not None:
            for sink in self.sinks:
                try:
                    sink(self.name, latest)
                except Exception:
                    log.exception("a sink of collector %s failed", self.name)
        return ok

    def start_collector(self) -> None:
        """Start the collector (once): open devices, start its helper threads."""
        if not self._started:
            self._started = True
            try:
                self.collector.start()
            except Exception:
                log.exception("collector %s failed to start", self.name)

    def _run(self) -> None:
        next_due = self._clock()
        while not self._stop.is_set():
            self.sample_once()
            # Fixed-rate schedule; after an overrun, start again from now rather than bursting to catch up.
            next_due += self.interval
            now = self._clock()
            if next_due < now:
                next_due = now + self.interval
            self._stop.wait(next_due - now)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"sampler-{self.name}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop sampling and release the hardware, unless the sampler is still inside a call after `timeout`:
        releasing a library (nvmlShutdown) under a thread that is using it is a race; the process exits anyway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("collector %s is stuck in a hardware call: left as it is", self.name)
                return
        try:
            self.collector.stop()
        except Exception:
            log.exception("collector %s failed to stop", self.name)


SELF = Catalogue("exporter", "Exporter self-metrics")
BUILD_INFO = SELF.gauge("accelmon_exporter_build_info", "Version of the accelmon exporter; value is 1.", ["version"])
CERTIFICATE_END = SELF.gauge(
    "accelmon_exporter_tls_certificate_expiry_timestamp_seconds",
    "When the TLS certificate the deploy gave this host's exporter ends (service: accelmon-exporter, node_exporter), "
    "in seconds since the epoch: its notAfter, or its CA's where that comes first. None where it serves plain HTTP.",
    ["service"],
)
SUCCESS = SELF.gauge(
    "accelmon_collector_success",
    "1 if the collector's latest sample succeeded and is fresh (not overdue by more than 3 intervals), else 0.",
    ["collector"],
)
DURATION = SELF.gauge(
    "accelmon_collector_duration_seconds", "How long the collector's latest sample took.", ["collector"]
)
LAST_SAMPLE = SELF.gauge(
    "accelmon_collector_last_sample_timestamp_seconds",
    "Unix time of the collector's latest successful sample (0 if none yet).",
    ["collector"],
)
INTERVAL = SELF.gauge(
    "accelmon_collector_interval_seconds", "How often the collector samples its hardware.", ["collector"]
)
ERRORS = SELF.counter(
    "accelmon_collector_errors_total", "Samples of the collector that failed since the exporter started.", ["collector"]
)
HARDWARE_EXPECTED = SELF.gauge(
    "accelmon_collector_hardware_expected",
    "1 if this host should have the collector's hardware (enabled explicitly, or a driver or device class is "
    "present), else 0.",
    ["collector"],
)
HARDWARE_ANSWERING = SELF.gauge(
    "accelmon_collector_hardware_answering",
    "1 if the collector's hardware answers (NVML initialised, InfiniBand devices in sysfs, neuron-monitor reporting), "
    "else 0. Expected but not answering is a broken driver or tool.",
    ["collector"],
)


class Exporter:
    """The set of samplers of one process and the exposition built from their cached samples."""

    def __init__(
        self,
        samplers: list[Sampler],
        stale_after_intervals: float = 3.0,
        drop_after_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        extra_metrics: Iterable[Callable[[], Samples]] = (),
        certificates_not_after: Mapping[str, float] | None = None,
    ) -> None:
        self.samplers = samplers
        # Collectors another one serves in their place (dcgm_compat's replace_own): sampled, not served.
        self._replaced = {name for sampler in samplers for name in sampler.collector.replaces}
        # Self-metrics of parts that are not collectors (the CloudWatch publisher), rendered on each scrape.
        self.extra_metrics = list(extra_metrics)
        # The end of each certificate the deploy gave this host's exporters (the config's web.certificates_not_after).
        self.certificates_not_after = dict(certificates_not_after or {})
        self._stale_after_intervals = stale_after_intervals
        self._drop_after_seconds = drop_after_seconds
        self._clock = clock

    def start(self) -> None:
        for sampler in self.samplers:
            sampler.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop every sampler within `timeout` in all (a hung one does not add its wait to the others')."""
        for sampler in self.samplers:
            sampler.request_stop()
        deadline = time.monotonic() + timeout
        for sampler in self.samplers:
            sampler.stop(max(0.0, deadline - time.monotonic()))

    def _self_metrics(self, states: list[tuple[Sampler, SampleState]], now: float) -> Samples:
        samples = Samples()
        samples.add(BUILD_INFO, [__version__], 1)
        for service, end in sorted(self.certificates_not_after.items()):
            samples.add(CERTIFICATE_END, [service], end)
        for sampler, state in states:
            fresh = self._is_fresh(sampler, state, now, self._stale_after_intervals * sampler.interval)
            samples.add(SUCCESS, [sampler.name], 1 if state.success and fresh else 0)
            samples.add(DURATION, [sampler.name], state.duration_seconds)
            samples.add(LAST_SAMPLE, [sampler.name], state.last_sample_timestamp)
            samples.add(INTERVAL, [sampler.name], sampler.interval)
            samples.add(ERRORS, [sampler.name], state.errors)
            answering = sampler.collector.hardware_answering()
            if answering is not None:
                samples.add(HARDWARE_EXPECTED, [sampler.name], 1 if sampler.hardware_expected else 0)
                samples.add(HARDWARE_ANSWERING, [sampler.name], 1 if answering else 0)
        return samples

    @staticmethod
    def _is_fresh(sampler: Sampler, state: SampleState, now: float, max_age: float) -> bool:
        # A sampler that has not sampled yet is not stale: it has had no chance.
        if state.samples == 0:
            return True
        return now - state.last_sample_monotonic <= max(max_age, sampler.interval + 1.0)

    def exposition(self, openmetrics: bool = False) -> bytes:
        """Everything a scrape returns, in the text format or OpenMetrics: each collector's latest sample
        (rendered once per sample), then the self-metrics."""
        now = self._clock()
        states = [(sampler, sampler.state()) for sampler in self.samplers]
        parts = []
        for sampler, state in states:
            # Data from a collector that has hung for long is dropped rather than served as if current.
            if sampler.name not in self._replaced and self._is_fresh(sampler, state, now, self._drop_after_seconds):
                parts.append(sampler.rendered(state, openmetrics))
        parts.append(render(self._self_metrics(states, now), openmetrics))
        parts += [render(metrics(), openmetrics) for metrics in self.extra_metrics]
        if openmetrics:
            parts.append(EOF)
        return b"".join(parts)

    def collect_once(self) -> tuple[bytes, list[str]]:
        """Sample every collector once on this thread, after the longest first-sample delay of any of them;
        returns the exposition and the failed collectors."""
        for sampler in self.samplers:
            sampler.start_collector()
        delay = max((sampler.collector.first_sample_delay for sampler in self.samplers), default=0.0)
        if delay > 0:
            log.info("waiting %.1f s for one full sample window", delay)
            time.sleep(delay)
        failed = [sampler.name for sampler in self.samplers if not sampler.sample_once()]
        return self.exposition(), failed
