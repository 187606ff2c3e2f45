"""The exporter's machinery: the metric model, the collector contract (Registration, checks, options),
the sampling runtime and the HTTP server. It imports no other folder (docs/architecture.md).
"""
