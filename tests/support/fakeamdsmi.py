"""The fake libamd_smi.so (tests/fakeamdsmi/fake_amdsmi.c), built with the system's C compiler, beside stubs for
every other entry point the pinned amdsmi bindings bind at import (their list is read from the installed bindings'
source, never imported: importing them needs the library). AMD's real bindings find the fake through
$ROCM_PATH/lib."""

from __future__ import annotations

import ctypes
import importlib.util
import re
import subprocess
from pathlib import Path

from tests.support.paths import FAKE_AMDSMI_SOURCE

BOUND = re.compile(r"_libraries\['libamd_smi\.so'\]\.(\w+)")
DEFINED = re.compile(r"^amdsmi_status_t (amdsmi_\w+)\(", re.MULTILINE)


def bound_symbols() -> set[str]:
    """Every libamd_smi.so symbol the installed amdsmi bindings bind when imported."""
    spec = importlib.util.find_spec("amdsmi")
    assert spec and spec.submodule_search_locations, "the amdsmi bindings are not installed (pyproject's test extra)"
    wrapper = Path(next(iter(spec.submodule_search_locations))) / "amdsmi_wrapper.py"
    return set(BOUND.findall(wrapper.read_text()))


def build_fake_amdsmi(rocm: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """rocm/lib/libamd_smi.so: the fake, and a NOT_SUPPORTED stub for each bound symbol it does not define; the
    symbols in `leave_out` are not there at all (an older library than the bindings)."""
    library = rocm / "lib" / "libamd_smi.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    defined = set(DEFINED.findall(FAKE_AMDSMI_SOURCE.read_text()))
    stubs = rocm / "stubs.c"
    stubs.write_text(
        "/* Generated: entry points the fake does not answer; AMDSMI_STATUS_NOT_SUPPORTED (2), as for a field the GPU"
        " lacks. */\n"
        + "".join(f"int {name}(void) {{ return 2; }}\n" for name in sorted(bound_symbols() - defined - set(leave_out)))
    )
    source = FAKE_AMDSMI_SOURCE.read_text()
    for name in leave_out:
        source = source.replace(f"amdsmi_status_t {name}(", f"static amdsmi_status_t left_out_{name}(")
    fake = rocm / "fake_amdsmi.c"
    fake.write_text(source)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wno-unused-function",
            "-Wno-format-truncation",
            "-shared",
            "-fPIC",
            "-o",
            str(library),
            str(fake),
            str(stubs),
        ],
        check=True,
    )
    return library


class FakeAmdSmi:
    """The fake loaded into this process (the bindings' CDLL of the same path gets this very library)."""

    def __init__(self, library: Path, config: Path) -> None:
        self.library = ctypes.CDLL(str(library))
        self.config = config
        self.library.fakeAmdSmiCallsOf.restype = ctypes.c_ulonglong
        self.library.fakeAmdSmiCallsOf.argtypes = [ctypes.c_char_p]
        self.library.fakeAmdSmiSizeOf.restype = ctypes.c_ulong
        self.library.fakeAmdSmiSizeOf.argtypes = [ctypes.c_char_p]

    def configure(self, text: str) -> None:
        """Directives for the next amdsmi_init (see fake_amdsmi.c)."""
        self.config.write_text(text)

    def calls_of(self, function: str) -> int:
        return int(self.library.fakeAmdSmiCallsOf(function.encode()))

    def set_lost(self, index: int, lost: bool = True) -> None:
        self.library.fakeAmdSmiSetLost(index, int(lost))

    def size_of(self, structure: str) -> int:
        return int(self.library.fakeAmdSmiSizeOf(structure.encode()))


if __name__ == "__main__":  # python -m tests.support.fakeamdsmi ROCM_DIR: for the Molecule worker scenario
    import sys

    print(build_fake_amdsmi(Path(sys.argv[1])))
