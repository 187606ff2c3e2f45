"""The /metrics endpoint: one asyncio event loop on its own thread, with every resource a client can hold bounded.

The thread-per-connection server it replaces let one client grow the exporter to gigabytes: no limit on
connections, up to 100 headers of 64 KiB buffered each, and a timeout per read, so a header every 29 s held a
thread for most of an hour. Here a connection costs a coroutine and at most MAX_HEAD_BYTES of buffer; there are at
most MAX_CONNECTIONS of them, and at most MAX_CONNECTIONS_PER_CLIENT from one address (more are closed at once: one
client that opens 256 silent connections no longer takes the scraper's place); a connection's first byte must come
within HEAD_SECONDS, and a request's head whole within HEAD_SECONDS of its first byte; an idle keep-alive connection
is closed after IDLE_SECONDS. Where `allowed` networks are given (the config's web.allowed_clients: the
Prometheus servers), any other address is closed before it is read. A scrape never waits on hardware: the
body is the exporter's latest samples, rendered by prometheus_client once per sample (in the text format, or in
OpenMetrics for a client that asks for it) and gzip-compressed when the client accepts it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import ipaddress
import logging
import os
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Union

from prometheus_client.exposition import choose_encoder

from accelmon.exporter.webconfig import WebConfig

log = logging.getLogger("accelmon.http")
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

MAX_HEAD_BYTES = 8192  # request line and headers; Prometheus sends about 300 bytes
MAX_CONNECTIONS = 256
# One address's share: a Prometheus pair, a federation and a person's curl need a few each.
MAX_CONNECTIONS_PER_CLIENT = 8
HEAD_SECONDS = 5.0
IDLE_SECONDS = 60.0  # Prometheus keeps its connection open between scrapes (15 s by default)
WRITE_SECONDS = 10.0  # a client that does not read its reply does not hold it for longer
BACKLOG = 128  # Python's default of 5 overflowed under 50 concurrent scrapers
INDEX = b"<html><head><title>accelmon</title></head><body><a href='/metrics'>Metrics</a></body></html>"
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}
CHALLENGE = 'WWW-Authenticate: Basic realm="accelmon-exporter"'


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
    ) -> None:
        self.exposition = exposition
        self.allowed = allowed  # () lets any address in
        self.server_header = server_header
        self.web = web or WebConfig()
        # bcrypt checks (0.06-0.25 s of CPU each) run one at a time off the loop: wrong passwords cost one core
        # at most, and never stall the scrapes of clients that passed before.
        self._bcrypt = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-auth")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        self.server_address = self._socket.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.open_connections = 0
        self._by_client: dict[str, int] = {}  # open connections per client address
        # Per format, (exposition, its gzip): compressed once per sample, shared by every scraper until the next.
        self._gzipped: dict[bool, tuple[bytes, bytes]] = {}

    def start(self) -> None:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = started.result(10)

    async def _listen(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(
            self._serve,
            sock=self._socket,
            backlog=BACKLOG,
            limit=MAX_HEAD_BYTES,
            ssl=self.web.ssl_context,
            # A TLS handshake is bounded like a request head: a client that never finishes it is cut off.
            ssl_handshake_timeout=HEAD_SECONDS if self.web.ssl_context else None,
        )

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            connections = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in connections:
                task.cancel()
            # Each closes its transport on the way out: none is left to be collected after the loop is closed.
            await asyncio.gather(*connections, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()
        self._socket.close()
        self._bcrypt.shutdown(wait=False)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = client_address(peer)
        if self.allowed and not any(client in network for network in self.allowed):
            log.debug("http: %s refused: not an allowed client", peer)
            writer.close()
            return
        key = str(client)
        if self.open_connections >= MAX_CONNECTIONS or self._by_client.get(key, 0) >= MAX_CONNECTIONS_PER_CLIENT:
            log.debug("http: %s refused: %d connections open, %d of its own", peer, self.open_connections,
                      self._by_client.get(key, 0))  # fmt: skip
            writer.close()
            return
        self.open_connections += 1
        self._by_client[key] = self._by_client.get(key, 0) + 1
        try:
            first = True
            while await self._one_request(reader, writer, first):
                first = False
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError) as error:
            log.debug("http: client %s went away: %r", peer, error)
        except asyncio.CancelledError:
            # Only stop() cancels a connection. Ending normally rather than cancelled: Python 3.11's streams log a
            # cancelled connection task as an error ("Exception in callback ... CancelledError").
            log.debug("http: connection of %s closed at shutdown", peer)
        except asyncio.LimitOverrunError:
            log.debug("http: client %s sent a head over %d bytes", peer, MAX_HEAD_BYTES)
            await self._reply(writer, 400, "text/plain; charset=utf-8", b"request head too large\n", close=True)
        finally:
            self.open_connections -= 1
            self._by_client[key] -= 1
            if not self._by_client[key]:
                del self._by_client[key]
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opening: bool) -> bool:
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
        if self.web.requires_auth and not await self._authorized(headers.get("authorization", "")):
            await self._reply(writer, 401, "text/plain; charset=utf-8", b"unauthorized\n", close, extra=CHALLENGE)
        elif method not in ("GET", "HEAD"):
            await self._reply(writer, 405, "text/plain; charset=utf-8", b"only GET and HEAD\n", close, head=False)
        elif path == "/metrics":
            # Content negotiation as prometheus_client does it: OpenMetrics for a client that asks for it.
            content_type = choose_encoder(headers.get("accept", ""))[1]
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

    async def _authorized(self, authorization: str) -> bool:
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
        return await asyncio.get_running_loop().run_in_executor(self._bcrypt, self.web.check, user, password)

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


def allowed_networks(values: object) -> tuple[IPNetwork, ...]:
    """web.allowed_clients as networks: CIDRs or single addresses (ValueError naming a bad one)."""
    if not isinstance(values, list):
        raise ValueError("expected a list of addresses or networks (CIDR), e.g. [10.0.0.5, 10.0.0.0/24]")
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(str(value), strict=False))
        except ValueError as error:
            raise ValueError(f"{value!r} is no address or network: {error}") from error
    return tuple(networks)
