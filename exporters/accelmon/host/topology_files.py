"""The files NCCL reads about a node's topology, read as safely as a monitor must: the conf file (/etc/nccl.conf)
and NCCL_TOPO_FILE. Both are named by a site, a package or a variable, and either may be what no producer writes: a
FIFO (opening one waits for a writer, for good: the collector's sample hung), a link to /dev/zero (an endless line),
a file of megabytes. So each is opened without waiting, read only if it is a regular file, and only so far."""

from __future__ import annotations

import os
import re
import stat
from typing import Callable

CONF_LIMIT = 64 << 10  # bytes of the conf file read: a site's is a few lines


def read_regular(path: str, limit: int) -> bytes:
    """The first `limit` + 1 bytes of the regular file at `path` (a link is followed, as NCCL's fopen follows it);
    OSError where it is absent or unreadable, ValueError where it is no regular file."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as stream:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        return stream.read(limit + 1)


def nccl_conf_value(path: str, name: str = "NCCL_IB_HCA") -> str:
    """A variable as NCCL's conf file sets it (param.cc `setEnvFile`: `NAME=value` lines, `#` comments), '' if
    absent. /etc/nccl.conf holds what a site sets for every job of the node."""
    return nccl_conf_values(path, (name,))[0]


def nccl_conf_values(path: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """Several variables of NCCL's conf file in one reading, each '' if absent (the first line that sets it), from
    its first CONF_LIMIT bytes; a file that is no regular file is none."""
    found: dict[str, str] = {}
    try:
        text = read_regular(path, CONF_LIMIT)[:CONF_LIMIT].decode("utf-8", "replace")
    except (OSError, ValueError):
        text = ""
    # Lines as NCCL's getline splits them, at "\n" only: a "\r" (a file saved with CRLF) stays in the value, where
    # NCCL_IB_HCA=mlx5_0\r matches no device for NCCL (splitlines() also split at \r, \v, \f, \x1c-\x1e, \x85
    # and dropped it); each line a C string, ended at its first NUL; values cut at 1023 bytes, as setEnvFile's.
    for line in text.split("\n"):
        line = line.partition("\0")[0]
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and key in names:
            found.setdefault(key, value[:1023])
    return tuple(found.get(name, "") for name in names)


def nccl_int(text: str, default: int) -> int:
    """An integer setting as NCCL reads it (param.cc `ncclLoadParam`: unset or empty, the default; else strtoll's
    leading number, 0 where there is none; past int64, strtoll's ERANGE: the default)."""
    if not text:
        return default
    match = re.match(r"\s*[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if match is None:
        return 0
    digits = match.group(1)
    if len(digits) > 24:  # past int64 in any base (and past Python's int() digit limit in a hostile file)
        return default
    value = int(match.group(0), 16 if digits[:2] in ("0x", "0X") else 8 if digits[:1] == "0" else 10)
    return value if -(1 << 63) <= value < 1 << 63 else default


def ib_hca_filter(spec: str) -> Callable[[str, str], bool]:
    """NCCL_IB_HCA as NCCL reads it (misc/utils.cc `parseStringList`, `matchIfList`; net_ib.cc `ncclIbInitDevices`,
    v2.28.7-1): comma-separated name prefixes, each with an optional `:port` read by atoi (leading blanks and a sign
    taken: `mlx5_0: 1` is port 1, `:-1` any port; no number is port 0, which no port is); a leading `^` excludes
    them, a leading `=` (after `^`) makes the names exact. Unset or empty: every device."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    wanted = []
    for item in spec.split(","):
        name, colon, port = item.partition(":")
        if name:
            number = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]{1,18})", port)  # atoi's; past 18 digits matches no port
            wanted.append((name, (int(number.group(1)) if number else 0) if colon else -1))

    def match(device: str, port: str) -> bool:
        found = not wanted or any(
            (device == name if exact else device.startswith(name)) and want in (-1, int(port)) for name, want in wanted
        )
        return found != exclude

    return match
