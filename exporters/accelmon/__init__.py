"""accelmon: Prometheus exporter for GPU, Neuron and InfiniBand hardware."""

__version__ = "0.1.0"
