"""The /metrics endpoint: one asyncio event loop on its own thread, with every resource a client can hold bounded.

The thread-per-connection server it replaces let one client grow the exporter to gigabytes: no limit on connections,
up to 100 headers of 64 KiB buffered each, and a timeout per read, so a header every 29 s held a thread for most of
an hour. Here a connection costs a coroutine and at most MAX_HEAD_BYTES of buffer; there are at most MAX_CONNECTIONS
of them, counted from their accept (a TLS handshake that never ends holds a slot, not a file descriptor beyond the
pool), and at most MAX_CONNECTIONS_PER_CLIENT from one client (`client_group`: an address, but the loopback's 127/8
and an IPv6 /64 each one client). When a newcomer finds its client's share taken, that client's oldest connection not
yet trusted is closed for it; when it finds the pool taken, the oldest untrusted one of the client holding the most.
Trusted: authenticated by password or by a client certificate, or, where the server asks for neither, answered once.
So many addresses (a 32-node job's, a worker user's 127.x.y.z, an IPv6 /64's) no longer shut a scraper out, and
Prometheus's keep-alive connection is never the one closed. A loopback connection of root's (the deploy's check) has
ROOT_SLOTS of its own, which no other client's newcomer takes. A connection's first byte must come within
HEAD_SECONDS, and a request's head whole within HEAD_SECONDS of its first byte; an idle keep-alive connection is
closed after IDLE_SECONDS. A request refused for its password ends its connection, and a client whose passwords
failed FREE_FAILURES times has one checked per CHECK_SECONDS at most, until one passes. Where `allowed` networks are
given (the config's web.allowed_clients: the Prometheus servers), any other address is closed at its accept, before a
TLS handshake. A scrape never waits on hardware: the body is the exporter's latest samples, rendered by
prometheus_client once per sample (in the text format, or in OpenMetrics for a client that asks for it) and
gzip-compressed when the client accepts it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import functools
import gzip
import ipaddress
import itertools
import logging
import os
import socket
import ssl
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Tuple, Union

from prometheus_client.exposition import choose_encoder

from accelmon.exporter.webconfig import WebConfig

log = logging.getLogger("accelmon.http")
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
# A connection as ((client address, port), (server address, port)); the uids of the client sockets of those found.
Pair = Tuple[Tuple[str, int], Tuple[str, int]]
PeerUids = Callable[[List[Pair]], Dict[Pair, int]]

MAX_HEAD_BYTES = 8192  # request line and headers; Prometheus sends about 300 bytes
MAX_CONNECTIONS = 256
# One client's share (client_group): a Prometheus pair, a federation and a person's curl need a few each.
MAX_CONNECTIONS_PER_CLIENT = 8
# Loopback connections whose socket belongs to root (the deploy's check runs as root): a share of their own, apart
# from the loopback's 127/8, which any user of the host can fill. Only another of root's closes one.
ROOT_SLOTS = 2
ROOT_GROUP = "uid 0 on the loopback"
# Looking up sockets' owners reads /proc/net/tcp (40-70 ms on a loaded VM: the kernel walks its whole connection
# table): only for loopback newcomers that find their share or the pool taken, all those waiting at once, and in at
# most this share of the time.
OWNER_SHARE = 0.1
MAX_PENDING = 256  # newcomers waiting for their owner's lookup (a descriptor each)
# SO_LINGER on, 0 s: a connection refused or closed for a newcomer is reset, leaving no TIME_WAIT socket behind
# (a line more in /proc/net/tcp for 60 s each, which a flood would have grown by thousands a second).
RESET = struct.pack("ii", 1, 0)
# Failed passwords a client may have checked at full speed; beyond, one bcrypt check per CHECK_SECONDS (until one
# passes): 8 keep-alive connections sending wrong passwords kept a core busy (~4.9 checks a second at cost 12).
FREE_FAILURES = 5
CHECK_SECONDS = 1.0
MAX_FAILED_CLIENTS = 4096  # clients whose failed passwords are remembered (a dict entry each)
HEAD_SECONDS = 5.0
IDLE_SECONDS = 60.0  # Prometheus keeps its connection open between scrapes (15 s by default)
WRITE_SECONDS = 10.0  # a client that does not read its reply does not hold it for longer
BACKLOG = 128  # Python's default of 5 overflowed under 50 concurrent scrapers
INDEX = b"<html><head><title>accelmon</title></head><body><a href='/metrics'>Metrics</a></body></html>"
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}
CHALLENGE = 'WWW-Authenticate: Basic realm="accelmon-exporter"'


class _Connection:
    """An admitted connection: its socket, its client's address, whether it has proved itself."""

    def __init__(self, sock: socket.socket, client: str, group: str) -> None:
        self.sock = sock
        self.client = client
        self.group = group  # client_group (or ROOT_GROUP): whose share and failed passwords it counts in
        self.trusted = False
        self.task: asyncio.Task[None] | None = None
        self.serving = False  # its task has begun (and closes the socket on its way out)

    def close(self) -> None:
        """Ends it with a reset, and its task: one waiting for its password's check (behind others, or CHECK_SECONDS)
        stayed, with its check queued, until that check ran. A cancel that Python <3.12's wait_for swallows (its read
        done at once) is caught where the task would queue a check (_authorized)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already gone
            pass
        if self.task is not None:
            self.task.cancel()
            if not self.serving:  # a task cancelled before its first step never runs its `finally`
                self.sock.close()


class MetricsServer:
    """Serves `exposition()` on `host:port` (port 0: any free port) from a loop on a thread of its own."""

    def __init__(
        self,
        exposition: Callable[[bool], bytes],  # (openmetrics) -> body
        host: str,
        port: int,
        server_header: str,
        web: WebConfig | None = None,
        allowed: tuple[IPNetwork, ...] = (),
        peer_uids: PeerUids | None = None,
    ) -> None:
        self.exposition = exposition
        self.allowed = allowed  # () lets any address in
        self.peer_uids = peer_uids  # None: no slot kept for root
        self._pending: list[tuple[socket.socket, object, Pair]] = []  # newcomers waiting for their owner
        self._owner_next = 0.0  # monotonic time before which no owner is looked up (OWNER_SHARE)
        self._owner_timer: asyncio.TimerHandle | None = None
        self.server_header = server_header
        self.web = web or WebConfig()
        # bcrypt checks (0.06-0.25 s of CPU each) run one at a time off the loop: wrong passwords cost one core
        # at most, and never stall the scrapes of clients that passed before. The next check is that of the client
        # with the fewest failed checks, then the oldest: clients sending wrong passwords wait behind the others.
        self._bcrypt = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-auth")
        self._checks: list[tuple[int, str, str, str, asyncio.Future[bool]]] = []  # (arrival, group, user, ...)
        self._checking = False
        self._arrivals = itertools.count()
        self._failures: dict[str, int] = {}  # failed checks per client_group, until one passes
        self._checked_at: dict[str, float] = {}  # when the last check of a client in _failures began
        self._wakeup: asyncio.TimerHandle | None = None  # the next check held back by CHECK_SECONDS
        self._socket = listening_socket(host, port)
        self.server_address = self._socket.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[_Connection, None] = {}  # admitted, oldest first (dicts keep insertion order)
        self._by_group: dict[str, int] = {}  # open connections per client_group
        self._tasks: set[asyncio.Task[None]] = set()
        # Per format, (exposition, its gzip): compressed once per sample, shared by every scraper until the next.
        self._gzipped: dict[bool, tuple[bytes, bytes]] = {}

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def start(self) -> None:
        self._socket.listen(BACKLOG)
        self._socket.setblocking(False)
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._accepting = started.result(10)

    async def _listen(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        """Accepts connections itself rather than through asyncio.start_server, whose TLS server calls back only once
        the handshake is done: the allow-list and the limits must apply from the accept."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self._socket)
            except OSError as error:  # out of file descriptors, mostly: wait for some to be freed
                log.warning("http: cannot accept a connection: %s", error)
                await asyncio.sleep(0.1)
                continue
            self._arrive(conn, peer)

    def _arrive(self, conn: socket.socket, peer: object) -> None:
        """Refuses a newcomer not allowed; holds a loopback one that finds its share or the pool taken (or its client
        held back for its passwords) until its socket's owner is known (root's keep slots of their own); places any
        other at once."""
        client = client_address(peer)
        if self.allowed and not any(client in network for network in self.allowed):
            log.debug("http: %s refused: not an allowed client", peer)
            _abort(conn)
            return
        if self.peer_uids is None or not client.is_loopback or not self._contended(client_group(client)):
            self._start(conn, peer)
            return
        try:
            local = conn.getsockname()
        except OSError:  # gone already
            _abort(conn)
            return
        port = peer[1] if isinstance(peer, tuple) and len(peer) > 1 else 0
        pair = ((str(client), int(port)), (str(client_address(local)), int(local[1])))
        self._pending.append((conn, peer, pair))
        if len(self._pending) > MAX_PENDING:  # bounded: the oldest waiting goes
            _abort(self._pending.pop(0)[0])
        self._look_up_owners()

    def _look_up_owners(self) -> None:
        """Places the newcomers waiting for their owner, looked up in one reading of the socket table for all of
        them, as soon as OWNER_SHARE allows: a flood of loopback connections costs a bounded share of the server's
        time, and root's newcomer is looked up whatever the flood's rate (up to MAX_PENDING between two lookups)."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        if started < self._owner_next:
            if self._owner_timer is None:
                self._owner_timer = loop.call_later(self._owner_next - started, self._owners_due)
            return
        pending, self._pending = self._pending, []
        try:
            uids = self.peer_uids([pair for _, _, pair in pending]) if self.peer_uids else {}
        except (OSError, ValueError) as error:  # hostile or odd procfs text: no slot of root's this time
            log.debug("http: socket owners not read: %s", error)
            uids = {}
        self._owner_next = started + (time.monotonic() - started) / OWNER_SHARE
        for conn, peer, pair in pending:
            self._start(conn, peer, root=uids.get(pair) == 0)

    def _owners_due(self) -> None:
        self._owner_timer = None
        self._look_up_owners()

    def _start(self, conn: socket.socket, peer: object, root: bool = False) -> None:
        connection = self._admit(conn, peer, root)
        if connection is None:
            _abort(conn)
            return
        # The loop keeps only a weak reference to a task: held here until it ends.
        task = connection.task = asyncio.get_running_loop().create_task(self._serve(peer, connection))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit(self, conn: socket.socket, peer: object, root: bool = False) -> _Connection | None:
        """The new connection's place in the pool, or None to close it: at its client's share (root's on the
        loopback apart), that client's oldest connection not yet trusted is closed for it; with every slot taken,
        that of the client holding the most."""
        client = client_address(peer)
        group = ROOT_GROUP if root else client_group(client)
        if self._by_group.get(group, 0) >= _share(group):
            evicted = self._evict(group)
        elif len(self._connections) >= MAX_CONNECTIONS:
            # The client holding the most gives way, not the newcomer's, unless the newcomer's holds as many.
            mine = self._by_group.get(group, 0)
            larger = sorted((n, g) for g, n in self._by_group.items() if n > mine and g != ROOT_GROUP)
            evicted = any(self._evict(victim) for victim in [g for _, g in reversed(larger)] + [group])
        else:
            evicted = True
        if not evicted:
            log.debug("http: %s refused: %d connections open and trusted, %d of its client's", peer,
                      len(self._connections), self._by_group.get(group, 0))  # fmt: skip
            return None
        connection = _Connection(conn, str(client), group)
        self._connections[connection] = None
        self._by_group[group] = self._by_group.get(group, 0) + 1
        return connection

    def _contended(self, group: str) -> bool:
        """Whether a newcomer of client `group` may lose to others: its share or the pool taken, or its client's
        passwords held back (FREE_FAILURES): root's check there waited behind another user's wrong passwords."""
        return (
            self._by_group.get(group, 0) >= _share(group)
            or len(self._connections) >= MAX_CONNECTIONS
            or self._failures.get(group, 0) >= FREE_FAILURES
        )

    def _evict(self, group: str) -> bool:
        """Closes the oldest untrusted connection of client `group`; False if it has none."""
        for connection in self._connections:
            if not connection.trusted and connection.group == group:
                log.debug("http: connection of %s closed for a newcomer", connection.client)
                self._forget(connection)
                connection.close()
                return True
        return False

    def _forget(self, connection: _Connection) -> None:
        if connection in self._connections:  # not forgotten before (evicted, then ended)
            del self._connections[connection]
            self._by_group[connection.group] -= 1
            if not self._by_group[connection.group]:
                del self._by_group[connection.group]

    def stop(self) -> None:
        async def close() -> None:
            if self._accepting is not None:
                self._accepting.cancel()
            connections = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in connections:
                task.cancel()
            # Each closes its transport on the way out: none is left to be collected after the loop is closed.
            await asyncio.gather(*connections, return_exceptions=True)
            for connection in self._connections:  # admitted, but cancelled before its task began
                connection.sock.close()
            for conn, _, _ in self._pending:
                conn.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()
        self._socket.close()
        self._bcrypt.shutdown(wait=False)

    async def _serve(self, peer: object, connection: _Connection) -> None:
        connection.serving = True
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader)
        writer: asyncio.StreamWriter | None = None
        try:
            # A TLS handshake is bounded like a request head: a client that never finishes it is cut off.
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                connection.sock,
                ssl=self.web.ssl_context,
                ssl_handshake_timeout=HEAD_SECONDS if self.web.ssl_context else None,
            )
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            # A client certificate verified in the handshake (mutual TLS) is trust enough.
            connection.trusted = bool(writer.get_extra_info("peercert"))
            first = True
            while await self._one_request(reader, writer, first, connection):
                first = False
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as error:
            log.debug("http: client %s went away: %r", peer, error)
        except asyncio.CancelledError:
            # stop() or _Connection.close() (closed for a newcomer). Ending normally rather than cancelled: Python
            # 3.11's streams log a cancelled connection task as an error ("Exception in callback ... CancelledError").
            log.debug("http: connection of %s closed", peer)
        except asyncio.LimitOverrunError:
            log.debug("http: client %s sent a head over %d bytes", peer, MAX_HEAD_BYTES)
            if writer is not None:
                await self._reply(writer, 400, "text/plain; charset=utf-8", b"request head too large\n", close=True)
        finally:
            self._forget(connection)
            if writer is not None:
                writer.close()  # else the handshake failed, and asyncio closed the transport it made

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opening: bool, connection: _Connection
    ) -> bool:
        """Reads and answers one request; False when the connection is done. A new connection (`opening`) must send
        within HEAD_SECONDS: a silent one is closed, not kept IDLE_SECONDS as a keep-alive between scrapes is."""
        first = await asyncio.wait_for(reader.read(1), HEAD_SECONDS if opening else IDLE_SECONDS)
        if not first:
            return False
        # The whole head within HEAD_SECONDS, in at most MAX_HEAD_BYTES (the reader's limit raises beyond).
        rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        lines = (first + rest).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._reply(writer, 400, "text/plain; charset=utf-8", b"bad request\n", close=True)
            return False
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        path = target.split("?", 1)[0]
        # Every request is checked (a proxy may carry several clients' requests on one connection); one that passes
        # makes its connection trusted: no newcomer takes its place. Without passwords, being answered once does
        # (plain HTTP: a scraper's keep-alive connection, not a silent one, keeps its place).
        authorized = not self.web.requires_auth or await self._authorized(headers.get("authorization", ""), connection)
        connection.trusted = connection.trusted or authorized
        if not authorized:
            # Closed: each new try costs the client a connection (and a TLS handshake), not just a request.
            await self._reply(writer, 401, "text/plain; charset=utf-8", b"unauthorized\n", True, extra=CHALLENGE)
            return False
        elif method not in ("GET", "HEAD"):
            await self._reply(writer, 405, "text/plain; charset=utf-8", b"only GET and HEAD\n", close, head=False)
        elif path == "/metrics":
            # Content negotiation as prometheus_client does it: OpenMetrics for a client that asks for it.
            try:
                content_type = choose_encoder(headers.get("accept", ""))[1]
            except (TypeError, ValueError):  # prometheus_client 0.26 fails on `version=abc`: the text format then
                content_type = choose_encoder("")[1]
            openmetrics = content_type.startswith("application/openmetrics-text")
            body = self.exposition(openmetrics)
            gzipped = "gzip" in headers.get("accept-encoding", "")
            if gzipped:
                body = self._compressed(body, openmetrics)
            await self._reply(writer, 200, content_type, body, close, head=method == "HEAD", gzipped=gzipped)
        elif path == "/":
            await self._reply(writer, 200, "text/html; charset=utf-8", INDEX, close, head=method == "HEAD")
        else:
            await self._reply(writer, 404, "text/plain; charset=utf-8", b"not found\n", close, head=method == "HEAD")
        return not close

    async def _authorized(self, authorization: str, connection: _Connection) -> bool:
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        if self.web.is_known(user, password):
            return True
        if connection not in self._connections:  # closed for a newcomer, and its task's cancel lost (see close)
            return False
        checked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._checks.append((next(self._arrivals), connection.group, user, password, checked))
        self._next_check()
        return await checked

    def _next_check(self) -> None:
        """Starts the next bcrypt check unless one runs (on the loop's thread, as every caller is)."""
        self._checks = [waiting for waiting in self._checks if not waiting[4].done()]  # connections gone
        if self._checking:
            return
        now = time.monotonic()
        ready = [waiting for waiting in self._checks if self._due(waiting[1]) <= now]
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        if not ready:
            if self._checks:  # every one held back by CHECK_SECONDS: woken when the first is due
                due = min(self._due(waiting[1]) for waiting in self._checks)
                self._wakeup = asyncio.get_running_loop().call_later(due - now, self._next_check)
            return
        # The fewest failures now, not when it arrived: a flood's first checks arrive before any has failed.
        chosen = min(ready, key=lambda waiting: (self._failures.get(waiting[1], 0), waiting[0]))
        self._checks.remove(chosen)
        _, group, user, password, checked = chosen
        if group in self._failures:
            self._checked_at[group] = now
        self._checking = True
        running = asyncio.get_running_loop().run_in_executor(self._bcrypt, self.web.check, user, password)
        running.add_done_callback(functools.partial(self._check_done, group, checked))

    def _due(self, group: str) -> float:
        """When a check of client `group` may begin: at once, unless it failed FREE_FAILURES times."""
        if self._failures.get(group, 0) < FREE_FAILURES:
            return 0.0
        return self._checked_at.get(group, 0.0) + CHECK_SECONDS

    def _check_done(self, group: str, checked: asyncio.Future[bool], running: asyncio.Future[bool]) -> None:
        self._checking = False
        passed = not running.cancelled() and running.exception() is None and bool(running.result())
        if passed:
            self._failures.pop(group, None)
            self._checked_at.pop(group, None)
        else:
            if len(self._failures) >= MAX_FAILED_CLIENTS:  # bounded: a flood of addresses starts it again
                self._failures.clear()
                self._checked_at.clear()
            self._failures[group] = self._failures.get(group, 0) + 1
        if not checked.done():
            checked.set_result(passed)
        self._next_check()

    def _compressed(self, body: bytes, openmetrics: bool) -> bytes:
        """gzip of the exposition, compressed once per change: scrapers between two samples share it."""
        plain, compressed = self._gzipped.get(openmetrics, (b"", b""))
        if body != plain:
            compressed = gzip.compress(body, compresslevel=6)
            self._gzipped[openmetrics] = (body, compressed)
        return compressed

    async def _reply(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        body: bytes,
        close: bool,
        head: bool = False,
        gzipped: bool = False,
        extra: str = "",
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {REASONS[status]}",
            f"Server: {self.server_header}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        if gzipped:
            lines.append("Content-Encoding: gzip")
        if status == 405:
            lines.append("Allow: GET, HEAD")
        if extra:
            lines.append(extra)
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
        await asyncio.wait_for(writer.drain(), WRITE_SECONDS)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port`. No host means every address of both families, as Go's listener (node_exporter's)
    takes it: bound to 0.0.0.0 alone, the port stayed free on IPv6, where any user of the host could listen with
    IPV6_V6ONLY and answer the scrapers that reach it by IPv6. IPv4 alone only where the host has no IPv6."""
    if not host:
        try:
            dual = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:  # IPv6 off in the kernel (ipv6.disable=1)
            pass
        else:
            try:
                dual.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                dual.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                dual.bind(("::", port))
                return dual
            except OSError as error:
                dual.close()
                if error.errno != errno.EADDRNOTAVAIL:  # in use (an impostor's too) fails the start, loudly
                    raise
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", port))
    except OSError:
        sock.close()
        raise
    return sock


def notify_systemd(state: str, environ: dict[str, str] | None = None) -> bool:
    """Tells systemd the service's `state` ("READY=1" once /metrics is served) through $NOTIFY_SOCKET, as
    sd_notify(3) does: with Type=notify, `systemctl restart` returns only once the exporter serves, and fails when it
    exits before (a port another process holds, a config it cannot read), so a deploy knows. Whether it was sent (no
    socket outside systemd: nothing to do)."""
    address = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address  # '@': the abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.sendto(state.encode(), target)
    except OSError as error:
        log.warning("cannot tell systemd %s: %s", state, error)
        return False
    return True


def client_address(peer: object) -> IPAddress:
    """A connection's client address, an IPv4 client of a dual-stack socket (::ffff:10.0.0.1) as IPv4."""
    host = peer[0] if isinstance(peer, tuple) and peer else "::"
    address = ipaddress.ip_address(str(host).split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_group(address: IPAddress) -> str:
    """The client a failed password is held against: its address, but IPv6's /64 (one host's, or one site's) and
    IPv4's loopback 127/8 (any user of the host binds any of it) whole, so that fresh addresses gain nothing."""
    if address.is_loopback and address.version == 4:
        return "127.0.0.0/8"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _abort(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    except OSError:
        pass
    sock.close()


def _share(group: str) -> int:
    return ROOT_SLOTS if group == ROOT_GROUP else MAX_CONNECTIONS_PER_CLIENT


def allowed_networks(values: object) -> tuple[IPNetwork, ...]:
    """web.allowed_clients as networks: CIDRs or single addresses (ValueError naming a bad one). Strict: an entry
    that would never match, or match more than it says, is refused rather than read some other way."""
    if not isinstance(values, list):
        raise ValueError("expected a list of addresses or networks (CIDR), e.g. [10.0.0.5, 10.0.0.0/24]")
    networks = []
    for value in values:
        text = str(value)
        if "%" in text:  # a zone is the host's interface, never part of a client's address (client_address drops it)
            raise ValueError(f"{value!r}: give the address without its zone (%...)")
        try:
            # strict: 10.0.0.5/0 is a typo that would let in every address, not 0.0.0.0/0 meant
            network = ipaddress.ip_network(text, strict=True)
        except ValueError as error:
            raise ValueError(f"{value!r} is no address or network: {error}") from error
        mapped = network.network_address.ipv4_mapped if isinstance(network, ipaddress.IPv6Network) else None
        if mapped is not None and network.prefixlen >= 96:
            # IPv4 clients of a dual-stack socket are matched as IPv4 (client_address): ::ffff:a.b.c.d as a.b.c.d
            network = ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
        networks.append(network)
    return tuple(networks)
