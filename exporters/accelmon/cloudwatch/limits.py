"""PutMetricData's limits and the device dimensions a datum can carry: what the settings are checked against and
what the aggregation keeps to (one module, imported by both)."""

# PutMetricData's limits (CloudWatch API reference): datums and bytes per request, dimensions per datum, and the
# magnitudes it accepts (values outside are rejected, NaN and infinities too).
MAX_DATUMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000  # 1 MB, with the encoding estimated from above (see `datum_size`)
MAX_DIMENSIONS = 30
LARGEST_VALUE = 2.0**360
SMALLEST_VALUE = 2.0**-260

# The device dimensions a datum can carry, from the series' labels: dimension -> (label by index, by uuid).
DEVICE_DIMENSIONS = {"GPU": ("gpu", "uuid"), "NeuronCore": ("neuroncore",)}
