"""Who holds a TCP port or connection on this host: the owner of each socket listening on a port, or of the client
end of connections, from procfs's `net/tcp` and `net/tcp6`.

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
from typing import Iterable, Optional, Tuple

Pair = Tuple[Tuple[str, int], Tuple[str, int]]  # a connection's (own address, port), (peer's address, port)

LISTEN = "0A"  # TCP_LISTEN (include/net/tcp_states.h), as net/tcp prints a state
# TCP_ESTABLISHED. A TIME_WAIT line's uid is 0 whoever owned it (get_timewait4_sock prints 0): only this state is read.
ESTABLISHED = "01"
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


def connection_uids(procfs: str, pairs: Iterable[Pair]) -> dict[Pair, int]:
    """The uid of each connected socket whose own end and peer are one of `pairs` ((address, port), (address,
    port)): the client ends of connections a server accepted, seen from the server, in one reading of the files
    for them all. An IPv4 pair is looked for in net/tcp, and IPv4-mapped in net/tcp6 (a client's AF_INET6 socket).
    Pairs not listed (gone, or no file readable) are left out. Reading stops once every pair is found: the kernel
    prints the files as they are read (seq_file), so the rest is never made."""
    wanted: dict[str, dict[tuple[str, str], Pair]] = {"tcp": {}, "tcp6": {}}
    for pair in pairs:
        (own, own_port), (peer, peer_port) = pair
        forms = [("tcp6", own, peer)]
        if ipaddress.ip_address(own).version == 4:
            forms = [("tcp", own, peer), ("tcp6", f"::ffff:{own}", f"::ffff:{peer}")]
        for name, local, remote in forms:
            wanted[name][(f"{hex_address(local)}:{own_port:04X}", f"{hex_address(remote)}:{peer_port:04X}")] = pair
    found: dict[Pair, int] = {}
    left = len({pair for by_name in wanted.values() for pair in by_name.values()})
    for name, by_ends in wanted.items():
        if not by_ends:
            continue
        try:
            with open(os.path.join(procfs, "net", name), encoding="ascii", errors="replace") as stream:
                for line in stream:
                    fields = line.split(None, 4)  # sl, local, remote, state, the rest (uid its 4th field)
                    if len(fields) < 5 or fields[3] != ESTABLISHED or (fields[1], fields[2]) not in by_ends:
                        continue
                    uid = fields[4].split(None, 4)[3:4]
                    if uid and uid[0].isdigit():
                        found[by_ends[(fields[1], fields[2])]] = int(uid[0])
                    if len(found) == left:
                        return found
        except OSError:
            continue
    return found


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
