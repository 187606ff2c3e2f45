"""The collectors of accelmon-exporter, one module each.

Each module declares everything it knows in one `accelmon.registry.Registration` and registers itself when
imported; `accelmon.registry.collectors()` imports every module here. Nothing else lists the collectors.
"""
