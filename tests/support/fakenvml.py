"""The fake libnvidia-ml.so.1 (tests/fakenvml/fake_nvml.c): built with the system's C compiler, found by pynvml
through LD_LIBRARY_PATH or loaded into the test process, and steered through its configuration file and a few
functions of its own."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from tests.support.paths import FAKE_NVML_SOURCE


def build_fake_nvml(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "libnvidia-ml.so.1"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wno-format-truncation",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(library),
            str(FAKE_NVML_SOURCE),
            "-lpthread",
        ],
        check=True,
    )
    return library


class FakeNvml:
    """The fake driver loaded into this process; pynvml finds it by its soname."""

    def __init__(self, library: ctypes.CDLL, config: Path) -> None:
        self.library = library
        self.config = config
        library.fakeNvmlCallCount.restype = ctypes.c_ulonglong
        library.fakeNvmlCallsOf.restype = ctypes.c_ulonglong
        library.fakeNvmlCallsOf.argtypes = [ctypes.c_char_p]

    @classmethod
    def load(cls, directory: Path, config: Path) -> FakeNvml:
        # Loaded RTLD_GLOBAL first, pynvml's CDLL("libnvidia-ml.so.1") gets this very library.
        return cls(ctypes.CDLL(str(directory / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL), config)

    def configure(self, text: str) -> None:
        """Directives for the next nvmlInit (see fake_nvml.c: the file is read again when it changed)."""
        self.config.write_text(text)

    def calls(self) -> int:
        return int(self.library.fakeNvmlCallCount())

    def calls_of(self, function: str) -> int:
        """How often the NVML entry point `function` (its C name) was called since the library was loaded."""
        return int(self.library.fakeNvmlCallsOf(function.encode()))

    def set_lost(self, index: int, lost: bool = True) -> None:
        self.library.fakeNvmlSetLost(index, int(lost))

    def queue_xid(self, index: int, xid: int) -> None:
        self.library.fakeNvmlQueueXid(index, ctypes.c_ulonglong(xid))

    def release(self) -> None:
        self.library.fakeNvmlRelease()
