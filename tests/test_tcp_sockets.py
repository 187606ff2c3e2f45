"""accelmon.host.tcp_sockets: who owns a socket, from procfs's net/tcp and net/tcp6."""

from __future__ import annotations

import os
import socket

from accelmon.host import tcp_sockets

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def line(local: str, remote: str, state: str, uid: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 4242 1\n"


def test_a_connections_owner_is_read_from_its_established_line_only(tmp_path):
    """A client end is found by its own and its peer's address and port; a TIME_WAIT line, which the kernel prints
    with uid 0 whoever owned it, is no answer; an IPv4 client of an AF_INET6 socket is found IPv4-mapped."""
    (tmp_path / "net").mkdir()
    client, server = "0100007F:9C40", "0100007F:4C0E"  # 127.0.0.1:40000 -> 127.0.0.1:19470 on little-endian
    if tcp_sockets.hex_address("127.0.0.1") != "0100007F":  # a big-endian host prints the words as they are
        client, server = "7F000001:9C40", "7F000001:4C0E"
    (tmp_path / "net" / "tcp").write_text(HEADER + line(client, server, "06", 0) + line(client, server, "01", 1000))
    mapped = tcp_sockets.hex_address("::ffff:127.0.0.2")
    (tmp_path / "net" / "tcp6").write_text(HEADER + line(f"{mapped}:9C40", f"{mapped}:4C0E", "01", 7))
    first, gone, v6 = (
        (("127.0.0.1", 40000), ("127.0.0.1", 19470)),
        (("127.0.0.1", 40001), ("127.0.0.1", 19470)),
        (("127.0.0.2", 40000), ("127.0.0.2", 19470)),
    )
    assert tcp_sockets.connection_uids(str(tmp_path), [first, gone, v6]) == {first: 1000, v6: 7}
    assert tcp_sockets.connection_uids(str(tmp_path / "none"), [first]) == {}


def test_this_process_owns_its_own_connection_on_the_real_procfs():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as client:
            pair = (client.getsockname()[:2], client.getpeername()[:2])
            assert tcp_sockets.connection_uids("/proc", [pair]) == {pair: os.getuid()}
