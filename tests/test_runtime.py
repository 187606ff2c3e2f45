"""The exporter core: isolation of collectors, staleness, self-metrics and the HTTP endpoint."""

from __future__ import annotations

import threading
import time

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.runtime import Collector, Exporter, Sampler
from tests.support.waiting import returns_while_blocked, wait_until

CATALOGUE = Catalogue("test", "test")
VALUE = CATALOGUE.gauge("test_value", "A value.", ["source"])


class Steady(Collector):
    name = "steady"

    def __init__(self) -> None:
        self.count = 0

    def sample(self):
        self.count += 1
        samples = Samples()
        samples.add(VALUE, [self.name], self.count)
        return samples


class Blocking(Collector):
    """Answers once, then blocks inside sample() until released, like a GPU that fell off the bus."""

    name = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def sample(self):
        self.calls += 1
        if self.calls > 1:
            self.release.wait(30)
        samples = Samples()
        samples.add(VALUE, [self.name], 1)
        return samples


class Failing(Collector):
    name = "failing"

    def sample(self):
        raise RuntimeError("hardware said no")


class BrokenStart(Steady):
    name = "broken_start"

    def start(self) -> None:
        raise OSError("no device")


def test_a_blocked_collector_does_not_block_others_or_the_scrape():
    steady, blocking = Steady(), Blocking()
    samplers = [Sampler(steady, 0.05), Sampler(blocking, 0.05)]
    exporter = Exporter(samplers, stale_after_intervals=2, drop_after_seconds=1.5)
    exporter.start()
    try:
        wait_until(lambda: blocking.calls >= 2, what="the blocking collector's second call")
        count_then = steady.count
        wait_until(lambda: steady.count > count_then + 5, what="the steady collector sampling on")
        # The blocked one becomes overdue (> interval + 1 s): the scrape says so, and answers while it is blocked.
        wait_until(
            lambda: 'accelmon_collector_success{collector="blocking"} 0.0\n' in exporter.exposition().decode(),
            what="the blocked collector reported as failing",
        )
        text = returns_while_blocked(lambda: exporter.exposition().decode())
        assert 'accelmon_collector_success{collector="steady"} 1.0\n' in text
        wait_until(
            lambda: 'test_value{source="blocking"}' not in exporter.exposition().decode(),
            what="the blocked collector's series dropped",
        )
        assert 'test_value{source="steady"}' in exporter.exposition().decode()
    finally:
        blocking.release.set()
        exporter.stop()


def test_a_failing_collector_is_reported_and_counted():
    exporter = Exporter([Sampler(Failing(), 1.0), Sampler(Steady(), 1.0)])
    text, failed = exporter.collect_once()
    text, failed = exporter.collect_once()
    assert failed == ["failing"]
    body = text.decode()
    assert 'accelmon_collector_success{collector="failing"} 0.0\n' in body
    assert 'accelmon_collector_errors_total{collector="failing"} 2.0\n' in body
    assert 'accelmon_collector_success{collector="steady"} 1.0\n' in body
    assert 'test_value{source="steady"} 2.0\n' in body


def test_a_collector_that_cannot_start_still_samples():
    exporter = Exporter([Sampler(BrokenStart(), 1.0)])
    text, failed = exporter.collect_once()
    assert failed == []
    assert 'test_value{source="broken_start"} 1.0\n' in text.decode()


def test_self_metrics():
    exporter = Exporter([Sampler(Steady(), 2.5)])
    text = exporter.collect_once()[0].decode()
    assert 'accelmon_exporter_build_info{version="0.1.0"} 1.0\n' in text
    assert 'accelmon_collector_interval_seconds{collector="steady"} 2.5\n' in text
    stamp = [line for line in text.splitlines() if line.startswith("accelmon_collector_last_sample_timestamp")]
    assert abs(float(stamp[0].split()[-1]) - time.time()) < 60


def test_counter_names_must_end_in_total():
    catalogue = Catalogue("x", "x")
    try:
        catalogue.counter("x_errors", "bad")
    except ValueError as error:
        assert "_total" in str(error)
    else:
        raise AssertionError("a counter without _total was accepted")
