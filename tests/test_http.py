"""The /metrics server under normal use and under the attacks that broke the thread-per-connection server."""

from __future__ import annotations

import base64
import gzip
import ipaddress
import os
import select
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection

import pytest

from accelmon.cli import make_server
from accelmon.exporter import server as http
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.host import tcp_sockets
from tests.support.processes import exporter_env, free_port, rss_kib, start_exporter, stop, wait_until_serving
from tests.support.toy import Steady
from tests.support.waiting import wait_until


@pytest.fixture
def served():
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, "127.0.0.1:0")
    server.start()
    yield server
    server.stop()


def url(server: http.MetricsServer, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_metrics_index_head_gzip_and_errors(served):
    with urllib.request.urlopen(url(served), timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        body = response.read()
    assert b'test_value{source="steady"} 1' in body
    head = urllib.request.Request(url(served), method="HEAD")  # it answered 501
    with urllib.request.urlopen(head, timeout=5) as response:
        assert response.status == 200 and int(response.headers["Content-Length"]) == len(body)
        assert response.read() == b""
    compressed = urllib.request.Request(url(served), headers={"Accept-Encoding": "gzip"})  # none before
    with urllib.request.urlopen(compressed, timeout=5) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(response.read()) == body
    with urllib.request.urlopen(url(served, "/"), timeout=5) as response:
        assert b"/metrics" in response.read()
    for request, status in ((url(served, "/nope"), 404), (urllib.request.Request(url(served), method="POST"), 405)):
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=5)
        assert error.value.code == status


def test_keep_alive_serves_several_requests_on_one_connection(served):
    with socket.create_connection(("127.0.0.1", served.server_address[1]), timeout=5) as client:
        for _ in range(3):
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while b"test_value" not in reply:
                reply += client.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 OK")


def test_stopping_with_idle_connections_logs_no_error(caplog):
    """SIGTERM with a scraper's keep-alive connection open: its task is cancelled, which Python 3.11's streams
    reported as "Exception in callback ... CancelledError" at ERROR (seen in bench/cloudwatch_bench.py)."""
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, "127.0.0.1:0")
    server.start()
    clients = [socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) for _ in range(3)]
    clients[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert clients[0].recv(65536).startswith(b"HTTP/1.1 200 OK")
    time.sleep(0.2)  # every connection is now waiting in its read
    with caplog.at_level("DEBUG"):
        server.stop()
    for client in clients:
        client.close()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text


def test_listen_backlog_is_128(served):
    """ss shows a listening socket's backlog as Send-Q. Python's default of 5 overflowed under 50 scrapers."""
    listening = subprocess.run(
        ["ss", "-ltnH", f"sport = :{served.server_address[1]}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listening[2] == str(http.BACKLOG) == "128", listening


def test_a_head_that_never_ends_is_cut_off(served, monkeypatch):
    monkeypatch.setattr(http, "HEAD_SECONDS", 0.5)
    with socket.create_connection(("127.0.0.1", served.server_address[1]), timeout=10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")  # and nothing more
        started = time.monotonic()
        assert client.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < 5


def test_an_oversized_head_is_refused(served):
    with socket.create_connection(("127.0.0.1", served.server_address[1]), timeout=10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"a" * (2 * http.MAX_HEAD_BYTES) + b"\r\n\r\n")
        assert client.recv(100).startswith(b"HTTP/1.1 400")


def scrape_from(source: str, server: http.MetricsServer) -> bytes:
    """GET /metrics from the loopback address `source` (127.0.0.2 is as much this host's as 127.0.0.1 on Linux)."""
    connection = HTTPConnection("127.0.0.1", server.server_address[1], timeout=5, source_address=(source, 0))
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        connection.close()


def test_200_slow_header_clients_leave_scrapes_answering(served):
    """Each used to hold a thread; now each holds a coroutine, and scrapes go on."""
    port = served.server_address[1]
    slow = []
    try:
        for n in range(200):  # from 25 addresses: 8 each, the most one client may hold
            client = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.1.{n // 8}", 0))
            client.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            slow.append(client)
        assert b"test_value" in scrape_from("127.0.0.2", served)
    finally:
        for client in slow:
            client.close()


def test_one_client_holding_every_slot_it_may_leaves_the_scraper_its_place(monkeypatch):
    """Issue 66, point 2: 300 silent connections from one address took all 256 slots (before authentication, 60 s to
    the first byte) and the scrape was reset. One client now holds MAX_CONNECTIONS_PER_CLIENT at most, the rest
    closed at once; a silent one is closed after HEAD_SECONDS; the scraper, another client, is answered. The hog is
    the loopback's 127/8 and the scraper ::1 (its own /64): a scraper on 127.0.0.2 is the hog's own client, answered
    in the place of one of the hog's connections, which proves nothing of another client's place. The server has no
    procfs to tell root's loopback sockets by (peer_uids): no slot is kept for root, whoever runs the test."""
    monkeypatch.setattr(http, "HEAD_SECONDS", 1.0)
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        pytest.skip(f"no ::1 here to scrape from as another client than the loopback's 127/8: {error}")
    assert http.client_group(ipaddress.ip_address("::1")) != http.client_group(ipaddress.ip_address("127.0.0.1"))
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, ":0")  # IPv4 and IPv6
    assert server.peer_uids is None  # root's loopback connections get no slots of their own
    server.start()
    port = server.server_address[1]
    hog = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
    try:
        connection = HTTPConnection("::1", port, timeout=5)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and b"test_value" in response.read()
        finally:
            connection.close()
        wait_until(lambda: server.open_connections <= http.MAX_CONNECTIONS_PER_CLIENT, timeout=5, every=0.05,
                   what="the hog's extra connections closed")  # fmt: skip
        started = time.monotonic()
        assert hog[-1].recv(10) == b""  # a connection that never sends is closed after HEAD_SECONDS
        assert time.monotonic() - started < 3
    finally:
        for client in hog:
            client.close()
        server.stop()


def test_only_the_allowed_clients_are_answered():
    """web.allowed_clients (the Prometheus servers): any other address is closed before it is read."""
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, "127.0.0.1:0", allowed=http.allowed_networks(["127.0.0.2", "10.0.0.0/8"]))
    server.start()
    try:
        assert b"test_value" in scrape_from("127.0.0.2", server)
        # Refused at the accept with a reset (server.py): the connect, the send or the read may meet it.
        try:
            with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as other:
                other.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = other.recv(100)
        except (ConnectionResetError, BrokenPipeError):  # closed with the request unread
            answer = b""
        assert answer == b""
    finally:
        server.stop()
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300' is no address or network"):
        http.allowed_networks(["10.0.0.300"])
    assert http.client_address(("::ffff:10.0.0.5", 4242, 0, 0)) == ipaddress.ip_address("10.0.0.5")


def test_header_flood_does_not_grow_the_exporter(tmp_path):
    """100 connections each sending 99 headers of 65 KB took the exporter from 23.5 MB to 492 MB, kept after
    they left. Now each is cut off at MAX_HEAD_BYTES: RSS stays under twice its idle value."""
    port = free_port()
    no_collectors = ["--no-collector.nvml", "--no-collector.infiniband", "--no-collector.neuron"]
    process = start_exporter([f"--web.listen-address=127.0.0.1:{port}", *no_collectors], exporter_env(None, None))
    try:
        wait_until_serving(port)
        idle = rss_kib(process.pid)
        header = b"X-Flood: " + b"a" * 65_000 + b"\r\n"
        clients = []
        for _ in range(100):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            try:
                for _ in range(99):
                    client.sendall(header)
            except OSError:
                pass  # the server cut it off, as it should
            clients.append(client)
        flooded = rss_kib(process.pid)
        for client in clients:
            client.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
        assert flooded < 2 * idle, (idle, flooded)
    finally:
        process.terminate()
        process.wait(10)


def test_openmetrics_for_a_client_that_asks_for_it(served):
    """Content negotiation as prometheus_client does it; the body passes prometheus_client's strict OpenMetrics
    parser (counters as counters, info metrics as info, one # EOF at the very end)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    request = urllib.request.Request(url(served), headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        body = response.read().decode()
    assert body.endswith("# EOF\n") and body.count("# EOF") == 1
    kinds = {family.name: family.type for family in text_string_to_metric_families(body)}
    assert kinds["accelmon_collector_errors"] == "counter"
    assert kinds["accelmon_exporter_build"] == "info"
    assert kinds["test_value"] == "gauge"
    with urllib.request.urlopen(url(served), timeout=5) as response:  # no Accept: the text format, as before
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"# EOF" not in response.read()


def test_a_sample_is_rendered_once_however_often_it_is_scraped(monkeypatch):
    from accelmon.exporter import runtime

    rendered = []
    real_render = runtime.render

    def counting_render(samples, openmetrics=False):
        rendered.append(openmetrics)
        return real_render(samples, openmetrics)

    monkeypatch.setattr(runtime, "render", counting_render)
    sampler = Sampler(Steady(), 60)
    exporter = Exporter([sampler])
    sampler.sample_once()
    for _ in range(5):
        exporter.exposition()
        exporter.exposition(openmetrics=True)
    # The collector's sample: once per format; the self-metrics: every scrape (they are small and change).
    collector_renders = len(rendered) - 10
    assert collector_renders == 2
    sampler.sample_once()
    exporter.exposition()
    assert len(rendered) - 11 == 3  # a new sample is rendered again


def test_the_exporter_tells_systemd_it_is_ready_only_once_it_serves(tmp_path):
    """Type=notify: READY=1 arrives on $NOTIFY_SOCKET only once /metrics answers, so `systemctl restart` (and a
    deploy's batch) waits for it; an exporter that cannot listen (a port another process holds) exits non-zero and
    never says it, so the restart fails instead of returning while the unit crash-loops."""
    notify_path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(30)
        no_collectors = ["--no-collector.nvml", "--no-collector.infiniband", "--no-collector.neuron"]
        env = {**exporter_env(None, None), "NOTIFY_SOCKET": notify_path}
        port = free_port()
        process = start_exporter([f"--web.listen-address=127.0.0.1:{port}", *no_collectors], env)
        try:
            assert notify.recv(64) == b"READY=1"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                assert response.status == 200  # serving at the moment it said so
            notify.settimeout(2)
            held = start_exporter([f"--web.listen-address=127.0.0.1:{port}", *no_collectors], env)
            assert held.wait(30) != 0
            with pytest.raises(socket.timeout):
                notify.recv(64)
        finally:
            stop(process)


def test_notify_systemd_outside_systemd_does_nothing():
    assert http.notify_systemd("READY=1", {}) is False
    assert http.notify_systemd("READY=1", {"NOTIFY_SOCKET": "relative"}) is False


def hold(port: int, source: str, count: int) -> list[socket.socket]:
    """`count` connections from the loopback address `source` that never send a byte."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) for _ in range(count)]


def closed_by_server(client: socket.socket) -> bool:
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_full_pool_closes_for_a_newcomer_the_untrusted_connection_of_the_client_holding_the_most(monkeypatch):
    """Issue 66: 32 addresses holding all 256 slots shut every scraper out, so a newcomer that finds the pool full
    closes a connection not yet trusted. It closed the oldest of any client's: a client opening connections as fast
    as it could closed the others' fresh ones before they authenticated (security review F1: a scraper opening a
    connection per scrape got 8 of 27 through). Now the client (client_group) holding the most gives way, and a
    trusted connection never does."""
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 16)
    server = http.MetricsServer(lambda openmetrics: b"", "127.0.0.1", 0, "test")
    ends: list[socket.socket] = []

    def admit(address: str) -> http._Connection | None:
        mine, theirs = socket.socketpair()
        ends.extend((mine, theirs))
        return server._admit(mine, (address, 40000))

    try:
        small = [admit("10.0.0.3") for _ in range(3)]  # the oldest
        middle = [admit("10.0.0.2") for _ in range(5)]
        most = [admit("10.0.0.1") for _ in range(8)]
        assert server.open_connections == 16
        most[0].trusted = True  # authenticated: never closed for a newcomer
        assert admit("10.0.0.4") is not None
        assert most[0] in server._connections and most[1] not in server._connections
        assert all(c in server._connections for c in small + middle)
        assert admit("10.0.0.3") is not None  # 4 of its own now; the most (7) still gives way
        assert most[2] not in server._connections and small[0] in server._connections
    finally:
        server.stop()
        server._loop.close()
        for end in ends:
            end.close()


def test_a_scraper_sharing_an_address_with_a_hog_still_gets_in(served):
    """The deploy's check scrapes a worker from its loopback, where any user of the worker may hold every slot one
    address may; the newcomer takes the place of that address's oldest connection instead of being refused."""
    port = served.server_address[1]
    hog = hold(port, "127.0.0.1", http.MAX_CONNECTIONS_PER_CLIENT)
    try:
        wait_until(lambda: served.open_connections == http.MAX_CONNECTIONS_PER_CLIENT, timeout=5, what="the hog in")
        assert b"test_value" in scrape_from("127.0.0.1", served)
        assert closed_by_server(hog[0])
    finally:
        for client in hog:
            client.close()


def test_without_passwords_a_connection_answered_once_keeps_its_place(served):
    """Security review F1: in plain HTTP (or TLS without passwords or client certificates) no connection was ever
    trusted, so silent newcomers of the same client closed a scraper's keep-alive connection between two scrapes
    (a review: 8 of 20 through). A connection answered once is now trusted as an authenticated one is."""
    port = served.server_address[1]
    hog: list[socket.socket] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as scraper:
        scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"test_value" not in reply:
            reply += scraper.recv(65536)
        try:
            hog = hold(port, "127.0.0.1", 3 * http.MAX_CONNECTIONS_PER_CLIENT)
            wait_until(lambda: all(closed_now(client) for client in hog[: -http.MAX_CONNECTIONS_PER_CLIENT]),
                       timeout=5, what="the silent connections closed for one another")  # fmt: skip
            assert not closed_now(scraper)
            scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert scraper.recv(100).startswith(b"HTTP/1.1 200 OK")
        finally:
            for client in hog:
                client.close()


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 on this host")
def test_any_address_is_ipv4_and_ipv6_so_no_user_can_listen_beside_it():
    """Issue 66 review: ':19470' (the role's default) bound 0.0.0.0 only, and any user of the worker could bind
    [::]:19470 (IPV6_V6ONLY) while the exporter ran: a scraper reaching the worker by IPv6 (a name with an AAAA
    record, which Go's dialer tries first) got the impostor's answer (a forged accelmon_build_info, with plain HTTP
    opted into; with TLS, a failed scrape). The exporter now takes both families, as node_exporter's Go listener
    does, and an impostor there first stops it from starting rather than sharing the port."""
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, ":0")
    server.start()
    port = server.server_address[1]
    try:
        impostor = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        impostor.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        with impostor, pytest.raises(OSError, match="in use"):
            impostor.bind(("::", port))
        for host in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
                assert b"test_value" in response.read()
    finally:
        server.stop()
    squatter = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    with squatter:
        squatter.bind(("::", 0))
        squatter.listen(1)
        with pytest.raises(OSError, match="in use"):
            make_server(exporter, f":{squatter.getsockname()[1]}")


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 on this host")
def test_a_password_never_wrong_is_checked_before_those_of_clients_that_failed(monkeypatch):
    """Issue 66 review: bcrypt checks ran one at a time in their order of arrival. After a restart (no password
    remembered yet) 4 addresses sending wrong passwords on 8 connections each kept 32 checks queued, and the right
    password waited 41 s for its turn (cost 12, ~1 s a check on 2 loaded cores), past Prometheus's 10 s scrape
    timeout, as long as they went on; 2.2 s now. A client (an address; IPv6's /64, IPv4's loopback 127/8) whose
    passwords failed now waits behind those of clients that never failed: here the right one is checked next, not
    17th."""
    from accelmon.exporter.webconfig import WebConfig

    gate, order = threading.Event(), []

    def check(user: str, password: str) -> bool:  # the bcrypt check, held at the gate while the queue forms
        gate.wait(10)
        order.append(password)
        return password == "right"

    web = WebConfig(users={"prometheus": b"$2b$04$" + b"x" * 53})
    monkeypatch.setattr(web, "check", check)
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, ":0", web)
    server.start()
    port = server.server_address[1]

    def ask(source: str, password: str) -> socket.socket:
        client = socket.create_connection((source, port), timeout=10, source_address=(source, 0))
        credential = base64.b64encode(f"prometheus:{password}".encode()).decode()
        client.sendall(f"GET /metrics HTTP/1.1\r\nAuthorization: Basic {credential}\r\n\r\n".encode())
        return client

    try:
        gate.set()
        for source in ("127.0.3.1", "127.0.3.2"):
            with ask(source, "wrong") as failed:
                assert failed.recv(100).startswith(b"HTTP/1.1 401")
        gate.clear()
        # The loopback's 127/8 is one client: 8 connections at most (MAX_CONNECTIONS_PER_CLIENT), 8 checks queued.
        flood = [ask(f"127.0.3.{1 + n % 2}", f"wrong{n}") for n in range(8)]
        wait_until(lambda: server.open_connections == 8, timeout=5, what="the flood's connections")
        time.sleep(0.2)  # every wrong check in the queue
        with ask("::1", "right") as scraper:  # another client: the loopback's 127/8 is one
            time.sleep(0.2)
            gate.set()
            assert scraper.recv(100).startswith(b"HTTP/1.1 200")
        assert order[3] == "right", order  # after the check held at the gate
        for client in flood:
            client.close()
    finally:
        gate.set()
        server.stop()


def test_an_accept_header_prometheus_client_cannot_parse_is_served_as_text(served, caplog):
    """prometheus_client 0.26's choose_encoder raises TypeError on `version=abc` (it compares the parsed version's
    parts with numbers): the connection was dropped unanswered and the task's exception logged at ERROR, once per
    request. Hostile input is served the text format instead."""
    with caplog.at_level("DEBUG"):
        with socket.create_connection(("127.0.0.1", served.server_address[1]), timeout=5) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=abc\r\n\r\n")
            reply = b""
            while b"test_value" not in reply:
                chunk = client.recv(65536)
                assert chunk, reply
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK")
        assert b"Content-Type: text/plain; version=" in reply
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text


def gated_passwords(monkeypatch, gate: threading.Event, checked: list[str]):
    """A web config with one user whose bcrypt check is a stand-in: it waits at `gate`, notes the password, and
    passes "right" alone."""
    from accelmon.exporter.webconfig import WebConfig

    def check(user: str, password: str) -> bool:
        gate.wait(10)
        checked.append(password)
        return password == "right"

    web = WebConfig(users={"prometheus": b"$2b$04$" + b"x" * 53})
    monkeypatch.setattr(web, "check", check)
    return web


def request(password: str) -> bytes:
    credential = base64.b64encode(f"prometheus:{password}".encode()).decode()
    return f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {credential}\r\n\r\n".encode()


def closed_now(client: socket.socket) -> bool:
    """Whether the server has closed `client` (which it never sends to) by now, without waiting."""
    return bool(select.select([client], [], [], 0)[0]) and closed_by_server(client)


def served_with_a_socket_of_roots(web, tmp_path) -> tuple[http.MetricsServer, int, socket.socket]:
    """A server started on every address with `web`, its sockets' owners read from a procfs fixture that names one
    loopback socket as uid 0's (the deploy's check), and that socket, bound but not yet connected."""
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    procfs = tmp_path / "proc"
    (procfs / "net").mkdir(parents=True)
    server = make_server(exporter, ":0", web, procfs=str(procfs))
    server.start()
    port = server.server_address[1]
    root = socket.socket()
    root.bind(("127.0.0.1", 0))  # its port known before it connects: the fixture names it as uid 0's
    own, peer = (f"{tcp_sockets.hex_address('127.0.0.1')}:{p:04X}" for p in (root.getsockname()[1], port))
    (procfs / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        f"   0: {own} {peer} 01 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
    )
    return server, port, root


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 on this host")
def test_a_loopback_flood_leaves_a_fresh_scraper_and_roots_check_their_places(monkeypatch, tmp_path):
    """Security review F1: one address's share was counted by exact address and a full pool closed the oldest
    untrusted connection of any client, so a user of the host opening connections from many 127.x.y.z (or from
    127.0.0.1, which the allow-list keeps for the deploy's check) closed a scraper's new connection before it
    authenticated: 8 of 27 scrapes through, and with allowed_clients [127.0.0.1] the deploy's check failed for its
    whole 15 s. The loopback's 127/8 is now one client with one share; and a loopback connection whose socket is
    root's (the deploy's check runs as root; told from procfs's net/tcp, here a fixture naming this test's socket)
    has slots of its own, looked up for all the newcomers waiting at once (here root's arrives with 16 of the
    flood's while a lookup is not yet due). Both wait in their password check while the flood comes, and both are
    answered."""
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 32)
    gate, checked = threading.Event(), []
    web = gated_passwords(monkeypatch, gate, checked)
    server, port, root = served_with_a_socket_of_roots(web, tmp_path)
    flood: list[socket.socket] = []
    try:
        flood += hold(port, "127.0.0.1", http.MAX_CONNECTIONS_PER_CLIENT)  # the loopback's share taken
        wait_until(lambda: server.open_connections == http.MAX_CONNECTIONS_PER_CLIENT, timeout=5, what="the hog in")
        # As if a lookup had just been paid for: root's newcomer waits for the next, with the flood's (OWNER_SHARE).
        server._owner_next = time.monotonic() + 1.0
        root.settimeout(10)
        root.connect(("127.0.0.1", port))
        root.sendall(request("right"))
        flood += hold(port, "127.0.0.1", 16)
        scraper = socket.create_connection(("::1", port), timeout=10)
        scraper.sendall(request("right"))
        # One password at the gate, the other queued behind it: both connections admitted and waiting.
        wait_until(lambda: len(server._checks) == 1, timeout=5, what="root's check and the scraper in")
        for n in range(40):  # then 40 addresses of the loopback, and 16 more from 127.0.0.1
            flood += hold(port, f"127.1.{n // 200}.{1 + n % 200}", 1)
        flood += hold(port, "127.0.0.1", 16)
        wait_until(lambda: all(closed_now(client) for client in flood[: -http.MAX_CONNECTIONS_PER_CLIENT]),
                   timeout=10, what="the flood's older connections closed for its newer ones")  # fmt: skip
        assert server.open_connections <= http.MAX_CONNECTIONS_PER_CLIENT + 2
        gate.set()
        with root, scraper:
            assert root.recv(100).startswith(b"HTTP/1.1 200"), "root's check"
            assert scraper.recv(100).startswith(b"HTTP/1.1 200"), "the scraper"
    finally:
        gate.set()
        for client in flood:
            client.close()
        root.close()
        server.stop()


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 on this host")
def test_wrong_passwords_end_their_connection_and_a_failing_client_is_checked_at_a_bounded_rate(monkeypatch):
    """Security review F3: 8 keep-alive connections sending wrong passwords from one address cost 11.6 s of CPU in
    10 s (4.9 bcrypt checks a second, one after another). A 401 now ends its connection, and a client whose
    passwords failed FREE_FAILURES times has one checked per CHECK_SECONDS (5 s here) at most, until one passes,
    while Prometheus (another client, which never failed) is checked at once. Counted in checks, not time."""
    monkeypatch.setattr(http, "CHECK_SECONDS", 5.0)
    gate, checked = threading.Event(), []
    gate.set()
    web = gated_passwords(monkeypatch, gate, checked)
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, ":0", web)
    server.start()
    port = server.server_address[1]
    stopping, replies = threading.Event(), []

    def attacker() -> None:
        while not stopping.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                    reply = b""
                    for _ in range(2):  # keep-alive: a second request, unless the first ended the connection
                        client.sendall(request("wrong"))
                        while chunk := client.recv(4096):
                            reply += chunk
                    replies.append(reply)
            except OSError:  # the second request sent to a closed connection, or the server stopped
                replies.append(b"")

    attackers = [threading.Thread(target=attacker) for _ in range(8)]
    for thread in attackers:
        thread.start()
    try:
        wait_until(lambda: len(checked) >= http.FREE_FAILURES, timeout=10, what="the free checks used")
        started = time.monotonic()
        with socket.create_connection(("::1", port), timeout=10) as prometheus:
            prometheus.sendall(request("right"))
            assert prometheus.recv(100).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < http.CHECK_SECONDS  # not behind the failing client's wait
        time.sleep(1.0)  # the attackers go on: no more check of theirs before CHECK_SECONDS have passed
        assert checked.count("wrong") == http.FREE_FAILURES, len(checked)
        answered = [reply for reply in replies if reply]
        assert answered and all(r.startswith(b"HTTP/1.1 401") and r.count(b"HTTP/1.1") == 1 for r in answered)
    finally:
        stopping.set()
        server.stop()
        for thread in attackers:
            thread.join(15)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_connection_closed_while_its_password_waits_frees_its_descriptor_and_its_check(monkeypatch):
    """Issue 66 review (a worker's user): a connection closed for a newcomer while its password waited for a bcrypt
    check kept its task and its queued check until that check ran, and a client whose passwords failed gets one a
    second: a loop of connections sending a wrong password grew the queue (and the process: 33 to 65 MB in 30 s
    over TLS, about 120 connections on this 2-core machine) without end, and root's check on the loopback waited
    behind all of it. Here, without TLS, each also kept its descriptor: 200 such connections left 200 tasks
    and descriptors, and 199 checks queued. The connection's task now ends with it: one client's share is left."""
    gate, checked = threading.Event(), []
    web = gated_passwords(monkeypatch, gate, checked)  # the gate stays closed: no check ends
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, "127.0.0.1:0", web)
    server.start()
    port = server.server_address[1]
    try:
        before = open_descriptors()
        for _ in range(200):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                client.sendall(request("wrong"))
        share = http.MAX_CONNECTIONS_PER_CLIENT
        wait_until(lambda: len(server._tasks) <= share, timeout=10, what=f"at most {share} connection tasks left")
        assert len(server._checks) <= share, len(server._checks)
        assert open_descriptors() <= before + share, (before, open_descriptors())
    finally:
        gate.set()
        server.stop()


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 on this host")
def test_roots_check_is_not_held_behind_a_loopback_client_whose_passwords_failed(monkeypatch, tmp_path):
    """Issue 66 review (a worker's user): root's loopback connection was told apart only when the loopback's share
    or the pool was taken. A user who sent 5 wrong passwords from 127.0.0.1 made the loopback's 127/8 one client
    checked once per CHECK_SECONDS, and the deploy's check (root's, the exporter just restarted: no password
    remembered) waited behind that user's queued checks: 3 of them, 15 s here, past the check's 15 s. A loopback
    newcomer of a client held back so is now looked up too, and root's password is checked at once."""
    monkeypatch.setattr(http, "CHECK_SECONDS", 5.0)
    gate, checked = threading.Event(), []
    gate.set()
    web = gated_passwords(monkeypatch, gate, checked)
    server, port, root = served_with_a_socket_of_roots(web, tmp_path)
    queued: list[socket.socket] = []
    try:
        for _ in range(http.FREE_FAILURES):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(request("wrong"))
                assert client.recv(100).startswith(b"HTTP/1.1 401")
        for _ in range(3):  # held back: one check per CHECK_SECONDS
            queued.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            queued[-1].sendall(request("wrong"))
        wait_until(lambda: len(server._checks) == 3, timeout=5, what="the user's checks queued")
        started = time.monotonic()
        root.settimeout(10)
        root.connect(("127.0.0.1", port))
        root.sendall(request("right"))
        assert root.recv(100).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < http.CHECK_SECONDS
    finally:
        for client in queued:
            client.close()
        root.close()
        server.stop()
