"""Prints what a worker needs to know of an accelmon wheel: its name, version and a digest of what it installs.

A wheel's bytes also record the tool that built it (.dist-info/WHEEL names setuptools and its version, RECORD
lists that file's hash), so the same source built by another setuptools, or on another controller, is other
bytes. The role installs a wheel on a worker only when this line differs from the one it recorded there after the
last install (tasks/install.yml): the same source never reinstalls and restarts the exporter, any change to what
would be installed does. The digest covers every file the wheel installs outside its .dist-info, the commands it
installs (entry_points.txt) and the metadata pip acts on (Requires-Python, Requires-Dist, Provides-Extra).

Usage: wheel_digest.py WHEEL  ->  "accelmon 0.1.0 <sha256 hex>". The controller's Python, standard library only.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from email.parser import Parser

# What pip acts on when it installs the wheel; the rest of METADATA (the long description, the license's
# spelling, Metadata-Version) changes with the build tool and changes nothing installed.
INSTALL_FIELDS = ("Requires-Python", "Requires-Dist", "Provides-Extra")


def _normalized(value: str) -> str:
    """A requirement as any setuptools writes it: without spaces, double quotes in markers."""
    return re.sub(r"\s+", "", value).replace("'", '"')


def identity(path: str) -> str:
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as wheel:
        dist_info = [name for name in wheel.namelist() if name.split("/", 1)[0].endswith(".dist-info")]
        metadata_name = next(entry for entry in dist_info if entry.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
        name = re.sub(r"[-_.]+", "-", metadata["Name"]).lower()
        version = metadata["Version"]
        for field in INSTALL_FIELDS:
            for value in sorted(_normalized(v) for v in metadata.get_all(field) or []):
                digest.update(f"{field}: {value}\n".encode())
        for entry in sorted(wheel.namelist()):
            if entry.endswith("/"):
                continue
            if entry in dist_info and not entry.endswith(".dist-info/entry_points.txt"):
                continue
            content = wheel.read(entry)
            label = entry
            if entry.endswith(".dist-info/entry_points.txt"):
                label = "entry_points.txt"  # the same whatever the dist-info directory is called
                content = b"\n".join(line.strip() for line in content.splitlines() if line.strip())
            digest.update(f"{label}\0{len(content)}\0".encode())
            digest.update(content)
    return f"{name} {version} {digest.hexdigest()}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: wheel_digest.py WHEEL")
    print(identity(sys.argv[1]))
