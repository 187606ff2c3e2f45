"""AMD's amdsmi bindings as a host library (as accelmon.host.nvidia is NVML's): loaded once, with why not where they
cannot be. The collector (accelmon.collectors.amd) samples through what this returns; tests pass a fake in."""

from __future__ import annotations

import contextlib
import io
from types import ModuleType

PINNED_BINDINGS = "7.0.2"  # pyproject's `amd` extra: the bindings bind every symbol of the library of that ROCm


def load_amdsmi() -> tuple[ModuleType | None, str]:
    """AMD's bindings, or None and why not. The bindings print to stdout when the library is missing (kept off our
    stdout: --once writes the exposition there) and bind every symbol at import (a library older than they are
    fails there, naming the symbol)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            import amdsmi
    except ModuleNotFoundError:
        return None, "the amdsmi package is not installed (pip install 'accelmon[amd]'; the role does on AMD hosts)"
    except KeyError:
        return None, "libamd_smi.so was not found (ROCm's amd-smi-lib: $ROCM_PATH/lib or the linker's path)"
    except AttributeError as error:
        why = f"libamd_smi.so does not match the amdsmi {PINNED_BINDINGS} bindings ({error})"
        return None, why + ": install the bindings of the host's ROCm"
    except OSError as error:
        return None, f"libamd_smi.so failed to load: {error}"
    return amdsmi, ""
