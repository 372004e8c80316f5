"""A real S3 API for tests: moto's server on 127.0.0.1, and a proxy in front of
it that fails a seeded share of read requests (error status, dropped
connection, or a body cut short), to prove that retries lose nothing."""

from __future__ import annotations

import http.client
import logging
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def start_moto() -> Any:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return server


class FaultyProxy(ThreadingHTTPServer):
    """Forwards HTTP to `upstream`; fails `rate` of GET/HEAD requests, seeded."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int], rate: float, seed: int = 0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.rate = upstream, rate
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.requests = 0
        self.faults = {"error": 0, "drop": 0, "short": 0}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def draw(self, method: str) -> str | None:
        with self.lock:
            self.requests += 1
            if method not in ("GET", "HEAD") or self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(["error", "drop", "short"] if method == "GET" else ["error"])
            self.faults[kind] += 1
            return kind

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultyProxy

    def log_message(self, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self.server.draw(self.command)
        if fault == "drop":  # no response at all: the client sees the connection close
            self.close_connection = True
            return
        if fault == "error":
            msg = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
            self.send_response(500)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(msg)
            return
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in (
                "transfer-encoding",
                "connection",
                "content-length",
                "date",
                "server",
            ):
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "short" and len(data) > 1:  # half the body, then hang up
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward
