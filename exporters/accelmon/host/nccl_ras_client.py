"""The client side of NCCL's RAS socket: one STATUS query under one deadline and one cap, in the form sized to the
job (FORMS), and a query left open past its deadline until NCCL has answered it (Pending). accelmon.host.nccl_ras reads
the answers; docs/jobs.md, "NCCL RAS", says why each step is so.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from typing import Optional

PROTOCOLS = (1, 2)  # the versions whose answers this reads (NCCL 2.24 to 2.30 answer 2)
MAX_LINE = 4096


class RasError(Exception):
    """A query that did not give an answer to read; `kind` is one of the collector's results."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.pending: Optional[Pending] = None  # ask(keep=True) past its deadline: the connection left open


class Exchange:
    """One connection to a RAS socket under one deadline."""

    def __init__(self, host: str, port: int, timeout: float, max_bytes: int) -> None:
        self.deadline = time.monotonic() + timeout
        self.max_bytes = max_bytes
        self.buffer = b""
        self.received = 0  # bytes of the answer read after STATUS
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except ConnectionRefusedError as error:
            raise RasError("refused", f"{host}:{port}: nothing listening") from error
        except socket.timeout as error:
            raise RasError("timeout", f"{host}:{port}: no connection in {timeout:g} s") from error
        except OSError as error:
            raise RasError("refused", f"{host}:{port}: {error}") from error

    def close(self) -> None:
        self.sock.close()

    def _receive(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RasError("timeout", "no complete answer before the deadline")
        self.sock.settimeout(left)
        try:
            return self.sock.recv(65536)
        except socket.timeout as error:
            raise RasError("timeout", "no complete answer before the deadline") from error
        except OSError as error:
            raise RasError("cut_short", str(error)) from error

    def send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode() + b"\n")
        except OSError as error:
            raise RasError("cut_short", f"sending {line!r}: {error}") from error

    def line(self) -> str:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise RasError("protocol", "a reply line without an end")
            chunk = self._receive()
            if not chunk:
                raise RasError("cut_short", "the socket closed before a reply")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def rest(self) -> str:
        """Everything until the server closes the socket, at most max_bytes."""
        parts, size = [self.buffer], len(self.buffer)
        self.received = size
        while True:
            chunk = self._receive()
            if not chunk:
                break
            size += len(chunk)
            self.received = size
            if size > self.max_bytes:
                raise RasError("too_large", f"an answer of more than {self.max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts).decode(errors="replace")


# A STATUS makes one collection at every tag from 2.24 to 2.30: the RAS network's is compiled out (`#if 0` in
# rasClientRun's RAS_CLIENT_INIT case, src/ras/client_support.cc: v2.24.3-1:426-436, v2.28.7-1:488-497,
# v2.30.7-1:523-532), so only the communicators' is run. RAS waits the client's TIMEOUT for each leg, then
# aborts the collection RAS_COLLECTIVE_EXTRA_TIMEOUT later: 5 s x NCCL_RAS_TIMEOUT_FACTOR (rasCollsHandleTimeouts,
# src/ras/collectives.cc:423-478, and ras_internal.h:13-14,218-221 at v2.28.7-1; the factor is 1 unless the job sets
# it, ras.cc:77). Legs that timed out are counted (`timeouts_count`; text: "Encountered %d communication timeouts").
# TIMEOUT 0 disables the timeout.
RAS_EXTRA_SECONDS = 5
MARGIN_SECONDS = 2  # the connection, the handshake, RAS writing its answer and sending it


def ras_timeout(timeout: float, factor: float = 1) -> int:
    """The TIMEOUT to send so that RAS's one collection ends within `timeout` (MARGIN_SECONDS to spare) where the
    job's NCCL_RAS_TIMEOUT_FACTOR is `factor`: at least 1."""
    return max(1, int(timeout - MARGIN_SECONDS - RAS_EXTRA_SECONDS * factor))


# What is asked (FORMS). NCCL makes the whole answer before it sends a byte of it, in one buffer grown 4 KiB at a time
# (rasOutAppend, RAS_OUT_INCREMENT, src/ras/client_support.cc v2.24.3-1:74,1466; v2.28.7-1:95,1708; v2.30.7-1:100,1735):
# quadratic, on the job's single RAS thread, which serves nothing else meanwhile (its keepalives included).
# - json: SET FORMAT json, STATUS (2.28.7+): every rank of every communicator, about 535 bytes each;
# - verbose: VERBOSE STATUS, the text form listing every group of ranks under half its communicator
#   (rasCountIsOutlier, RAS_CLIENT_VERBOSE_OUTLIER_FRACTION 0.5, every release from 2.24);
# - short: STATUS in the text form, which lists a group's ranks only up to 10 and a quarter of the communicator
#   (RAS_CLIENT_DETAIL_THRESHOLD 10, RAS_CLIENT_OUTLIER_FRACTION 0.25): a few KiB whatever the job's size; its summary
#   table gives each communicator's size, from which the collector sizes the next query.
FORMS = ("json", "verbose", "short")


def ask(
    host: str, port: int, timeout: float, max_bytes: int, want: str = "json", factor: float = 1, keep: bool = False
) -> tuple[str, str]:
    """(format, answer) of one STATUS query in the form `want` (FORMS; "text" is "verbose"): JSON where this NCCL
    has it, else the verbose text. A JSON answer over `max_bytes` is asked again in the verbose text form. RasError
    when there is none; with `keep`, a query past its deadline with no answer yet raises it with `pending` set: the
    connection left open (NCCL still making the answer), for the caller to settle before it asks again."""
    try:
        return ask_once(host, port, timeout, max_bytes, want, factor, keep)
    except RasError as error:
        if error.kind != "too_large" or want != "json":
            raise
    return ask_once(host, port, timeout, max_bytes, "verbose", factor, keep)


def ask_once(
    host: str, port: int, timeout: float, max_bytes: int, want: str, factor: float = 1, keep: bool = False
) -> tuple[str, str]:
    exchange = Exchange(host, port, timeout, max_bytes)
    kept = False
    try:
        exchange.send("CLIENT PROTOCOL 2")
        reply = exchange.line()
        found = re.fullmatch(r"(?i)SERVER PROTOCOL (\d+)", reply)
        if not found:
            raise RasError("protocol", f"not a RAS server: {reply[:80]!r}")
        if int(found.group(1)) not in PROTOCOLS:
            raise RasError("protocol", f"RAS protocol {found.group(1)}, not one this reads ({PROTOCOLS})")
        # RAS waits this long for each leg of its collection from the job's processes: within our own deadline.
        exchange.send(f"TIMEOUT {ras_timeout(timeout, factor)}")
        if exchange.line().upper() != "OK":
            raise RasError("protocol", "TIMEOUT refused")
        form = "text"
        if want == "json":
            exchange.send("SET FORMAT json")
            form = "json" if exchange.line().upper() == "OK" else "text"  # before 2.28.7: "ERROR: Unknown command"
        exchange.send("STATUS" if form == "json" or want == "short" else "VERBOSE STATUS")
        try:
            return form, exchange.rest()
        except RasError as error:
            if keep and error.kind == "timeout":
                error.pending = Pending(exchange, form, max_bytes)
                kept = True
            raise
    finally:
        if not kept:
            exchange.close()


class Pending:
    """A query past its deadline whose answer NCCL may still be making: while it is, that job is not asked again
    (a second STATUS would wait behind it on the single RAS thread and make a second answer after it)."""

    def __init__(self, exchange: Exchange, form: str, max_bytes: int) -> None:
        self.exchange, self.form, self.max_bytes = exchange, form, max_bytes
        self.started = time.monotonic()
        self.size = exchange.received

    def settle(self, budget: float = 2.0) -> Optional[int]:
        """None while NCCL has not answered; else the answer's size in bytes (over max_bytes: over the cap), read and
        dropped, the connection closed. JSON is sent only once made whole, so its first byte frees the RAS thread
        (what is not read within `budget` is not counted); the text form's header comes first: it is settled when
        the socket closes."""
        sock, until = self.exchange.sock, time.monotonic() + budget
        try:
            while self.size <= self.max_bytes:
                waiting = self.form == "json" and self.size > 0
                sock.settimeout(max(0.0, until - time.monotonic()) if waiting else 0)
                try:
                    chunk = sock.recv(1 << 20)
                except (BlockingIOError, socket.timeout):
                    if waiting:
                        break
                    return None
                if not chunk:
                    break
                self.size += len(chunk)
        except OSError:
            pass  # reset: NCCL ended the connection
        self.close()
        return self.size

    def close(self) -> None:
        self.exchange.close()


# Where a job's RAS socket is asked: this node's addresses, loopback, the address its user's socket listens on.


def local_addresses(procfs: str) -> set[str]:
    """This node's IP addresses, as RAS writes a rank's host: IPv4 from `net/fib_trie` (its LOCAL entries), IPv6
    from `net/if_inet6`."""
    found = {"127.0.0.1", "::1"}
    try:
        with open(os.path.join(procfs, "net", "fib_trie"), encoding="utf-8") as stream:
            last = ""
            for line in stream:
                words = line.split()
                if len(words) == 2 and words[0] in ("|--", "+--"):
                    last = words[1]
                elif words[:3] == ["/32", "host", "LOCAL"] and last:
                    found.add(last)
    except OSError:
        pass
    try:
        with open(os.path.join(procfs, "net", "if_inet6"), encoding="utf-8") as stream:
            for line in stream:
                raw = line.split()[0] if line.split() else ""
                if len(raw) == 32:
                    found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except (OSError, ValueError):
        pass
    return found


def is_local(host: str) -> bool:
    """A host whose sockets this node's net/tcp lists: loopback (RAS's NCCL_RAS_ADDR is localhost:PORT)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def asked_address(host: str, listening: set[str]) -> str:
    """The address to connect to for `host` when the job's sockets listen on `listening`: never a name to resolve.
    NCCL binds the one address NCCL_RAS_ADDR=localhost:PORT resolves to first (rasClientInitSocket,
    src/ras/client_support.cc v2.28.7-1:163-190); another user may bind the other loopback's PORT (127.0.0.1 and ::1
    do not conflict) for an instant at a time, between the checks of net/tcp. Connecting to "localhost" tries ::1
    first where /etc/hosts names it too (Debian's default): that user's answer, believed as the job's."""
    mapped = sorted({"127.0.0.1" if a == "0.0.0.0" else "::1" if a == "::" else a for a in listening})
    if host in mapped or not mapped:
        return host
    return next((a for a in mapped if is_local(a)), mapped[0])


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "localhost", int(port)
