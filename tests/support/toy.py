"""A collector with one steady sample, for tests of the HTTP side that need an exporter but no hardware."""

from __future__ import annotations

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.runtime import Collector

VALUE = Catalogue("test", "test").gauge("test_value", "A value.", ["source"])


class Steady(Collector):
    """Serves `test_value{source="steady"} 1` at every sample."""

    name = "steady"

    def sample(self) -> Samples:
        samples = Samples()
        samples.add(VALUE, ["steady"], 1)
        return samples
