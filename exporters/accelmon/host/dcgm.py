"""The DCGM host: connecting to a running DCGM host engine (nv-hostengine) through the Python bindings that ship
with DCGM, for every collector that reads DCGM (`profiling`'s DCGM backend, `dcgm_health`). Never the embedded
mode, which would lock out dcgmi and other readers of the engine.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from accelmon.exporter.validation import Option

DCGM_HOST = Option("dcgm_host", "localhost:5555", "the DCGM host engine (nv-hostengine) to connect to")
# DCGM 4, then DCGM 3: where the bindings that ship with DCGM live.
DCGM_BINDINGS_PATH = Option(
    "dcgm_bindings_path",
    "/usr/share/datacenter-gpu-manager-4/bindings/python3:/usr/local/dcgm/bindings/python3",
    "directories (colon-separated) searched for DCGM's Python bindings",
)


def dcgm_modules(bindings_paths: tuple[str, ...]) -> tuple[ModuleType, ModuleType] | None:
    """DCGM's own Python bindings (pydcgm, dcgm_structs), from the first of `bindings_paths` that has them."""
    for path in bindings_paths:
        if path not in sys.path:
            sys.path.append(path)
    try:
        return importlib.import_module("pydcgm"), importlib.import_module("dcgm_structs")
    except ImportError:
        return None


def dcgm_connect(bindings_paths: tuple[str, ...], host: str, group_name: str) -> tuple[Any, Any, Any, dict[int, str]]:
    """(pydcgm, handle, group of every GPU, GPU id -> UUID) from the host engine at `host`; raises on failure.
    An address means "connect to nv-hostengine": never the embedded mode that would lock out dcgmi."""
    modules = dcgm_modules(bindings_paths)
    if modules is None:
        raise ImportError(f"DCGM bindings not found in {', '.join(bindings_paths)}")
    pydcgm, structs = modules
    handle = pydcgm.DcgmHandle(ipAddress=host, opMode=structs.DCGM_OPERATION_MODE_AUTO)
    try:
        group = pydcgm.DcgmGroup(handle, groupName=group_name, groupType=structs.DCGM_GROUP_DEFAULT)
        system = handle.GetSystem()
        uuids = {gpu: str(system.discovery.GetGpuAttributes(gpu).identifiers.uuid) for gpu in group.GetGpuIds()}
    except Exception:
        handle.Shutdown()
        raise
    return pydcgm, handle, group, uuids
