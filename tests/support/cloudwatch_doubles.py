"""Test doubles on loopback for the CloudWatch publisher: moto's CloudWatch server behind a recording proxy (which
can throttle), an IMDSv2 that answers like EC2's, and a socket that accepts connections and never answers."""

from __future__ import annotations

import gzip
import io
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.request import Request, urlopen

from botocore.parsers import RpcV2CBORParser


def decode_body(content_type: str, body: bytes) -> dict[str, Any]:
    """A PutMetricData request body as data, in the protocol boto3 chose (CBOR today; JSON or query before)."""
    if "cbor" in content_type:
        return RpcV2CBORParser().parse_data_item(io.BytesIO(body))  # type: ignore[no-any-return]
    if "json" in content_type:
        return json.loads(body)  # type: ignore[no-any-return]
    from urllib.parse import parse_qs

    fields = parse_qs(body.decode())
    count = len({key.split(".")[2] for key in fields if key.startswith("MetricData.member.")})
    return {"MetricData": [None] * count}


def _cbor_text(text: str) -> bytes:
    data = text.encode()
    assert len(data) < 24
    return bytes([0x60 + len(data)]) + data


# CloudWatch's answer to too many requests, {"__type": "Throttling"} in CBOR or JSON, with the header by which
# query-compatible services name the error.
THROTTLING_CBOR = bytes([0xA1]) + _cbor_text("__type") + _cbor_text("Throttling")
THROTTLING_JSON = b'{"__type":"Throttling","message":"Rate exceeded"}'


class QuietHandler(BaseHTTPRequestHandler):
    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    """An HTTP server on a free loopback port, serving from a thread until closed."""

    def __init__(self, handler: type[QuietHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Recorded:
    requests: list[tuple[int, int]] = field(default_factory=list)  # (uncompressed bytes, datums) of each
    throttled: int = 0


class RecordingProxy(LoopbackServer):
    """Forwards to `upstream`, recording every PutMetricData request; answers Throttling to the first `throttle`."""

    def __init__(self, upstream: str, throttle: int = 0) -> None:
        self.upstream = upstream
        self.throttle = throttle
        self.recorded = Recorded()
        proxy = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.path
                operation = " ".join([target, self.headers.get("X-Amz-Target", "")])
                if "PutMetricData" in operation or b"PutMetricData" in body:
                    if proxy.recorded.throttled < proxy.throttle:
                        proxy.recorded.throttled += 1
                        # Answered in the protocol the request came in (boto3 picks it per version).
                        cbor = "cbor" in self.headers.get("Content-Type", "")
                        answer = THROTTLING_CBOR if cbor else THROTTLING_JSON
                        headers = {
                            "Content-Type": "application/cbor" if cbor else "application/x-amz-json-1.0",
                            "x-amzn-query-error": "Throttling;Sender",
                            **({"smithy-protocol": "rpc-v2-cbor"} if cbor else {}),
                        }
                        self.answer(400, answer, headers)
                        return
                    # boto3 gzips large PutMetricData bodies; the 1 MB limit is held to the uncompressed size.
                    # Forwarded uncompressed: moto 5.1 (the last for Python 3.9) fails to read gzipped bodies.
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    data = decode_body(self.headers.get("Content-Type", ""), body)
                    proxy.recorded.requests.append((len(body), len(data.get("MetricData", []))))
                dropped = ("host", "content-length", "content-encoding")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                request = Request(proxy.upstream + target, data=body, headers=headers, method="POST")
                try:
                    with urlopen(request, timeout=30) as response:
                        status, answer, answer_headers = response.status, response.read(), response.headers
                except Exception as error:  # noqa: BLE001 (an HTTP error from moto is its answer)
                    status = getattr(error, "code", 502)
                    answer = error.read() if hasattr(error, "read") else b""
                    answer_headers = getattr(error, "headers", {})
                hop = ("content-length", "transfer-encoding", "connection", "server", "date")
                self.answer(status, answer, {k: v for k, v in answer_headers.items() if k.lower() not in hop})

        super().__init__(Handler)


class FakeImds(LoopbackServer):
    """EC2's instance metadata service, version 2 only: a token from PUT, required on every read."""

    TOKEN = "AQAEAFake-token=="

    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata
        self.unauthorised = 0
        imds = self

        class Handler(QuietHandler):
            def do_PUT(self) -> None:
                if self.path != "/latest/api/token" or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
                    self.answer(400, b"")
                else:
                    self.answer(200, imds.TOKEN.encode())

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != imds.TOKEN:
                    imds.unauthorised += 1
                    self.answer(401, b"")
                    return
                value = imds.metadata.get(self.path.removeprefix("/latest/meta-data/"))
                self.answer(200, value.encode()) if value is not None else self.answer(404, b"Not Found")

        super().__init__(Handler)


class SilentSocket:
    """Listens and never accepts: a connection completes (the kernel's backlog) and then nothing ever answers."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def close(self) -> None:
        self.socket.close()
