"""The files NCCL reads about a node's topology, read as safely as a monitor must: the conf file (/etc/nccl.conf)
and NCCL_TOPO_FILE. Both are named by a site, a package or a variable, and either may be what no producer writes: a
FIFO (opening one waits for a writer, for good: the collector's sample hung), a link to /dev/zero (an endless line),
a file of megabytes. So each is opened without waiting, read only if it is a regular file, and only so far."""

from __future__ import annotations

import os
import stat

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
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and key in names:
            found.setdefault(key, value)
    return tuple(found.get(name, "") for name in names)
