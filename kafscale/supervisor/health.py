"""/metrics, /healthz, /readyz, POST /flush and POST /drain on ``KAFSCALE_METRICS_PORT``, served
by the supervisor.

- ``/healthz``: 200 while the supervisor runs (process alive).
- ``/readyz``: 200 when every child is up and answered its last ping, and both backends answered
  their last check; otherwise 503 with a JSON body listing what is not ready: which child or
  backend, never an exception's text (that goes to the log: it may name endpoints, buckets, keys).
- ``/metrics``: every process's samples, aggregated (prometheus-client multiprocess mode).
- ``POST /flush``: seal and commit every buffer now (``kafscale.supervisor.admin``). The only
  state-changing request: it needs ``Authorization: Bearer <KAFSCALE_ADMIN_TOKEN>`` (compared in
  constant time); without a configured token it is disabled (403). Anything else is 404/501.

Optionally (docs/security.md): HTTPS from ``KAFSCALE_METRICS_TLS_CERT_FILE``/``_KEY_FILE``
(reloaded when they change, as the Kafka listeners' certificates; the handshake runs in the
request's thread, so a slow client never holds up accepting), and HTTP basic authentication
(``KAFSCALE_METRICS_USERNAME``/``_PASSWORD``, compared in constant time) for ``/metrics``, and
for ``/healthz`` and ``/readyz`` too with ``KAFSCALE_METRICS_AUTH_HEALTH`` (else they stay open
for the kubelet). A refused request gets 401 with ``WWW-Authenticate: Basic``.

A ``HealthChecker`` thread pings the children over their ZeroMQ sockets and checks the backends
every few seconds; the HTTP threads only read its last verdict, so probes never block on S3/etcd.
Each ping's outcome is also noted on the child (``policy.note_ping``): the arbiter kills a child
that stopped answering (``KAFSCALE_CHILD_HANG_TIMEOUT_MS``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from kafscale import metrics
from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import RpcClient, RpcError
from kafscale.security import tls
from kafscale.supervisor import admin, policy
from kafscale.supervisor.arbiter import Child

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 2.0
BACKEND_CHECK_INTERVAL_S = 5.0


@dataclass
class Verdict:
    ready: bool = False
    problems: list[str] = field(default_factory=lambda: ["starting"])


class HealthChecker:
    """Pings children and checks backends on its own thread; ``verdict`` is the latest result."""

    def __init__(
        self, runtime_dir: str, children: list[Child], backend_checks: dict[str, Callable[[], None]]
    ) -> None:
        self.runtime_dir = runtime_dir
        self.children = children
        self.backend_checks = backend_checks
        self.verdict = Verdict()
        self._backend_problems: dict[str, str] = {}
        self._backends_checked_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        clients: dict[str, RpcClient] = {}
        try:
            while not self._stop.is_set():
                self.verdict = self._check(context, clients)
                self._stop.wait(CHECK_INTERVAL_S)
        finally:
            for client in clients.values():
                client.close()
            context.term()

    def _check(
        self, context: zmq.Context[zmq.Socket[bytes]], clients: dict[str, RpcClient]
    ) -> Verdict:
        problems: list[str] = []
        ready_children = 0
        for child in list(self.children):
            if not (child.alive and child.ready):
                problems.append(f"{child.name} is not running")
                continue
            client = clients.get(child.name)
            if client is None:
                client = RpcClient(
                    context, endpoints.address(self.runtime_dir, child.role, child.index)
                )
                clients[child.name] = client
            pid, sent_at = child.pid, time.monotonic()
            try:
                reply = client.call(messages.Ping(), timeout_ms=1000)
            except RpcError as exc:
                policy.note_ping(child, pid, answered=False, sent_at=sent_at)
                log.warning("child does not answer", extra={"child": child.name, "error": str(exc)})
                problems.append(f"{child.name} does not answer")
                continue
            answered = isinstance(reply.message, messages.Pong) and reply.message.pid == pid
            policy.note_ping(child, pid, answered, sent_at)
            if answered:
                ready_children += 1
        metrics.CHILDREN_READY.set(ready_children)
        if time.monotonic() - self._backends_checked_at >= BACKEND_CHECK_INTERVAL_S:
            self._check_backends()
        problems.extend(self._backend_problems.values())
        return Verdict(ready=not problems, problems=problems)

    def _check_backends(self) -> None:
        for name, check in self.backend_checks.items():
            try:
                check()
            except Exception as exc:
                if name not in self._backend_problems:
                    log.error("backend check failed", extra={"backend": name, "error": str(exc)})
                self._backend_problems[name] = f"{name} backend is not reachable"
                metrics.BACKEND_UP.labels(name).set(0)
            else:
                if self._backend_problems.pop(name, None):
                    log.info("backend reachable again", extra={"backend": name})
                metrics.BACKEND_UP.labels(name).set(1)
        self._backends_checked_at = time.monotonic()


@dataclass(frozen=True)
class Access:
    """Who may read the metrics port: basic credentials (empty user: anyone), and whether the
    health endpoints need them too."""

    username: str = ""
    password: str = ""
    health_too: bool = False

    def allows(self, header: str | None) -> bool:
        if not self.username:
            return True
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            pair = base64.b64decode(given.strip(), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return False
        expected = hashlib.sha256(f"{self.username}:{self.password}".encode()).digest()
        return hmac.compare_digest(hashlib.sha256(pair.encode()).digest(), expected)


RELOAD_CHECK_SECONDS = 60.0
HANDSHAKE_TIMEOUT_SECONDS = 10.0


class _TlsServer(http.server.ThreadingHTTPServer):
    """HTTPS: each accepted socket is wrapped with the current context in the request's own
    thread (``finish_request``), its handshake bounded by a timeout; the files are looked at
    for a change at most once per ``RELOAD_CHECK_SECONDS``."""

    tls: tls.ReloadingContext
    checked_at = 0.0

    def finish_request(self, request: Any, client_address: Any) -> None:
        assert isinstance(request, socket.socket)
        now = time.monotonic()
        if now - self.checked_at >= RELOAD_CHECK_SECONDS:
            self.checked_at = now
            self.tls.check()
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            wrapped = self.tls.listening.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("metrics port TLS handshake failed", extra={"error": str(exc)})
            return
        super().finish_request(wrapped, client_address)


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        checker: HealthChecker,
        admin_token: str = "",
        drain: Callable[[], int | None] | None = None,
        access: Access | None = None,
        tls_files: tls.TlsFiles | None = None,
    ) -> None:
        """Raises OSError when the port cannot be bound or the TLS files do not load."""
        handler = _handler_class(checker, admin_token, drain, access or Access())
        if tls_files is not None:
            context = tls.ReloadingContext("metrics", tls_files)
            server = _TlsServer((host, port), handler)
            server.tls, server.checked_at = context, time.monotonic()
            self.httpd: http.server.ThreadingHTTPServer = server
        else:
            self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def authorized(header: str | None, admin_token: str) -> bool:
    """Whether an ``Authorization`` header carries the admin token. Both sides are hashed first,
    so the comparison takes the same time whatever the length or the first differing byte."""
    scheme, _, given = (header or "").partition(" ")
    if not admin_token or scheme.lower() != "bearer":
        return False
    expected = hashlib.sha256(admin_token.encode()).digest()
    return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), expected)


def _handler_class(
    checker: HealthChecker,
    admin_token: str,
    drain: Callable[[], int | None] | None,
    access: Access,
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 30  # a client that stops sending holds one thread this long at most

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            guarded = path == "/metrics" or (access.health_too and path in ("/healthz", "/readyz"))
            if guarded and not access.allows(self.headers.get("Authorization")):
                body = json.dumps({"error": f"GET {path} needs basic authentication"})
                self._send(401, body.encode() + b"\n", "application/json", basic=True)
                return
            if path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/readyz":
                verdict = checker.verdict
                body = json.dumps({"ready": verdict.ready, "problems": verdict.problems})
                self._send(200 if verdict.ready else 503, body.encode() + b"\n", "application/json")
            elif path == "/metrics":
                registry = CollectorRegistry()
                multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/flush", "/drain") or (path == "/drain" and drain is None):
                self._send(404, b"not found\n", "text/plain")
                return
            if not admin_token:
                self._refuse(
                    403, f"POST {path} is disabled: the broker has no KAFSCALE_ADMIN_TOKEN"
                )
                return
            if not authorized(self.headers.get("Authorization"), admin_token):
                self._refuse(401, f"POST {path} needs Authorization: Bearer <admin token>")
                return
            if path == "/drain":
                assert drain is not None
                log.info("drain requested", extra={"peer": self.client_address[0]})
                left = drain()
                body = json.dumps({"drained": left == 0, "partitions_left": left})
                self._send(200 if left == 0 else 503, body.encode() + b"\n", "application/json")
                return
            log.info("flush requested", extra={"peer": self.client_address[0]})
            outcome = admin.flush_all(checker.runtime_dir, checker.children)
            body = json.dumps(
                {
                    "flushed": not outcome.problems,
                    "partitions": outcome.partitions,
                    "problems": outcome.problems,
                }
            )
            self._send(
                200 if not outcome.problems else 503, body.encode() + b"\n", "application/json"
            )

        def _refuse(self, status: int, reason: str) -> None:
            log.warning(
                "refused an admin request",
                extra={"peer": self.client_address[0], "path": self.path, "status": status},
            )
            body = json.dumps({"error": reason}).encode() + b"\n"
            self._send(status, body, "application/json", bearer=status == 401)

        def _send(
            self,
            status: int,
            body: bytes,
            content_type: str,
            *,
            bearer: bool = False,
            basic: bool = False,
        ) -> None:
            self.send_response(status)
            if bearer:
                self.send_header("WWW-Authenticate", 'Bearer realm="kafscale"')
            if basic:
                self.send_header("WWW-Authenticate", 'Basic realm="kafscale"')
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the log

    return Handler
