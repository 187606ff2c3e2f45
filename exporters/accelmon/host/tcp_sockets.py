"""Who holds a TCP port or connection on this host: the owner of each socket listening on a port, or of one
connection's client end, from procfs's `net/tcp` and `net/tcp6`.

Linux prints one line a socket (net/ipv4/tcp_ipv4.c, get_tcp4_sock; net/ipv6/tcp_ipv6.c, get_tcp6_sock):
`sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...`, the local address as
HEX_ADDRESS:HEX_PORT, the state in hex (0A: TCP_LISTEN), and the uid the socket belongs to (sock_i_uid: the user
that made it; a connection a listener accepts inherits it). The files are readable by every user and list every
socket of the network namespace, whatever its process.

Example line::

       0: 0100007F:6DD4 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 48151 1 ...
"""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Optional

LISTEN = "0A"  # TCP_LISTEN (include/net/tcp_states.h), as net/tcp prints a state
ESTABLISHED = "01"  # TCP_ESTABLISHED; a TIME_WAIT line's uid is 0 whoever owned it, so only this state is read
FILES = ("tcp", "tcp6")


def address_of(hex_address: str) -> str:
    """net/tcp's local address as text: each 32-bit word printed %08X in the host's byte order (IPv4 one word,
    IPv6 four; 127.0.0.1 is 0100007F on a little-endian host)."""
    raw = b"".join(int(hex_address[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_address), 8))
    return str(ipaddress.ip_address(raw))


def hex_address(address: str) -> str:
    """An address as net/tcp prints it (the inverse of `address_of`): 127.0.0.1 is 0100007F on a little-endian host."""
    raw = ipaddress.ip_address(address).packed
    return "".join(f"{int.from_bytes(raw[i : i + 4], sys.byteorder):08X}" for i in range(0, len(raw), 4))


def connection_uid(procfs: str, local: tuple[str, int], remote: tuple[str, int]) -> Optional[int]:
    """The uid of the connected socket whose own end is `local` and whose peer is `remote` (address, port): the
    client end of a connection a server accepted, seen from the server. An IPv4 pair is looked for in net/tcp, then
    IPv4-mapped in net/tcp6 (a client's AF_INET6 socket); None when no such socket is listed. Reading stops at the
    line found, so the kernel prints no more of the file than that (seq_file prints as it is read)."""
    pairs = [("tcp6", local[0], remote[0])]
    if ipaddress.ip_address(local[0]).version == 4:
        pairs = [("tcp", local[0], remote[0]), ("tcp6", f"::ffff:{local[0]}", f"::ffff:{remote[0]}")]
    for name, own, peer in pairs:
        needle = f" {hex_address(own)}:{local[1]:04X} {hex_address(peer)}:{remote[1]:04X} {ESTABLISHED} "
        try:
            with open(os.path.join(procfs, "net", name), encoding="ascii", errors="replace") as stream:
                for line in stream:
                    if needle in line:
                        fields = line.split()
                        return int(fields[7]) if len(fields) > 7 and fields[7].isdigit() else None
        except OSError:
            continue
    return None


def listening_uids(procfs: str, port: int) -> Optional[set[int]]:
    """The uids of the sockets listening on `port` (any local address, IPv4 or IPv6): empty when none listens, None
    when neither file can be read (no answer to who holds it)."""
    found = listening_sockets(procfs, port)
    return None if found is None else {uid for _, uid in found}


def listening_sockets(procfs: str, port: int) -> Optional[set[tuple[str, int]]]:
    """(local address, uid) of each socket listening on `port`, IPv4 or IPv6: empty when none listens, None when
    neither file can be read."""
    found: set[tuple[str, int]] = set()
    read_any = False
    for name in FILES:
        try:
            with open(os.path.join(procfs, "net", name), encoding="ascii", errors="replace") as stream:
                read_any = True
                next(stream, None)  # the header
                for line in stream:
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != LISTEN:
                        continue
                    hex_address, _, hex_port = fields[1].rpartition(":")
                    try:
                        if int(hex_port, 16) == port:
                            found.add((address_of(hex_address), int(fields[7])))
                    except ValueError:
                        continue
        except OSError:
            continue
    return found if read_any else None
