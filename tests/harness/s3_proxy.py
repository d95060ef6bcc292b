"""A recording pass-through in front of the S3 server: what a client really asked the bucket.

Requests are forwarded byte for byte (headers included, so SigV4 signatures still verify: the
signed Host is the proxy's, and MinIO checks the Host it receives), and each one is recorded as
(method, path, Range header). Tests point a reader at ``endpoint_url`` to prove which objects it
downloaded, and which byte ranges of them, from the wire rather than from the reader's word.

With ``delay`` it also stands in for a distant S3: each request waits ``delay(method)`` seconds
before it is forwarded (the benchmarks add 50-100 ms to every PUT, as real S3 takes).
"""

from __future__ import annotations

import http.client
import http.server
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from tests.harness.procs import LOOPBACK

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass(frozen=True)
class S3Request:
    method: str
    path: str  # /bucket/key, unquoted, without the query
    query: str
    range: str | None

    @property
    def key(self) -> str:
        """The object key (path-style addressing: /bucket/key)."""
        return self.path.split("/", 2)[2] if self.path.count("/") >= 2 else ""


class RecordingS3Proxy:
    def __init__(self, upstream: str, delay: Callable[[str], float] | None = None) -> None:
        target = urllib.parse.urlsplit(upstream)
        self.upstream_host = target.hostname or LOOPBACK
        self.upstream_port = target.port or 80
        self.requests: list[S3Request] = []
        self.record = True  # False: forward only (a long benchmark would grow the list)
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                split = urllib.parse.urlsplit(self.path)
                if delay is not None:
                    time.sleep(delay(self.command))
                with proxy._lock:
                    if proxy.record:
                        proxy.requests.append(
                            S3Request(
                                self.command,
                                urllib.parse.unquote(split.path),
                                split.query,
                                self.headers.get("Range"),
                            )
                        )
                upstream = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=60
                )
                try:
                    upstream.putrequest(
                        self.command, self.path, skip_host=True, skip_accept_encoding=True
                    )
                    for name, value in self.headers.items():
                        if name.lower() not in HOP_BY_HOP:
                            upstream.putheader(name, value)
                    upstream.endheaders(body)
                    response = upstream.getresponse()
                    payload = response.read()
                    self.send_response_only(response.status, response.reason)
                    for name, value in response.getheaders():
                        if name.lower() not in HOP_BY_HOP | {"content-length"}:
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                finally:
                    upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def take(self) -> list[S3Request]:
        """The requests recorded since the last call."""
        with self._lock:
            taken, self.requests = self.requests, []
        return taken

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def main(argv: list[str] | None = None) -> None:
    """Run a proxy as a process of its own (the benchmarks keep its CPU and GIL out of the
    process that drives the clients): prints its endpoint URL, then serves until killed.

        python -m tests.harness.s3_proxy http://127.0.0.1:9000 --put-ms 50-100 --other-ms 10
    """
    import argparse
    import random
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("--put-ms", default="0", help="PUT/POST delay, 'MIN-MAX' ms")
    parser.add_argument("--other-ms", type=float, default=0.0, help="delay of other requests")
    args = parser.parse_args(argv)
    low, _, high = args.put_ms.partition("-")
    put_min, put_max = float(low) / 1000, float(high or low) / 1000

    def delay(method: str) -> float:
        if method in ("PUT", "POST"):
            return random.uniform(put_min, put_max)
        return float(args.other_ms) / 1000

    proxy = RecordingS3Proxy(args.upstream, delay=delay)
    proxy.record = False
    print(proxy.endpoint_url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    proxy.close()


if __name__ == "__main__":
    main()
