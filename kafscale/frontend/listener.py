"""The Kafka listeners: accept client connections within the connection limits, run a
``Connection`` for each, and close the idle ones.

Every listener of ``KAFSCALE_LISTENERS`` (``Config.kafka_listeners``) is bound; the connection
limits are the broker's, across them all. A connection knows the listener it came in on
(``Session.listener``), so Metadata describes the brokers at that listener's endpoints. On SSL and
SASL_SSL listeners the TLS handshake runs right after accept, within ``TLS_HANDSHAKE_SECONDS``; a
handshake that fails is counted (``kafscale_tls_handshake_failures_total``) and logged (one line
per address per ``LOG_INTERVAL_SECONDS``). The certificate files are checked for a change every
``KAFSCALE_SSL_RELOAD_INTERVAL_MS`` and, when they load, served to the handshakes that follow
(``kafscale.security.tls.ReloadingContext``).

Accepting follows Kafka's acceptor (``SocketServer`` and ``ConnectionQuotas``):

- At ``KAFSCALE_MAX_CONNECTIONS`` open connections the listener stops accepting. New clients wait
  in the kernel's listen backlog: their TCP handshake completes, and their first request is
  answered once a connection closes (or they time out and retry). ``kafscale_accept_paused`` is 1
  meanwhile; each pause is counted and logged (at most one line per ``LOG_INTERVAL_SECONDS``).
- A connection from an address that already has ``KAFSCALE_MAX_CONNECTIONS_PER_IP`` (or its
  override) is closed right after accept, counted, and logged: one line per address per
  ``LOG_INTERVAL_SECONDS``, with the number of refusals held back (a flood does not flood the log).
- An accept that fails for want of file descriptors or memory pauses accepting for
  ``ACCEPT_RETRY_SECONDS`` (as asyncio's own server does). The process's soft file limit is
  raised toward ``KAFSCALE_MAX_CONNECTIONS`` at start (as the JVM raises it to the hard limit).

Every ``SWEEP_SECONDS`` (more often for a short idle timeout) a sweep closes the connections idle
for ``KAFSCALE_CONNECTIONS_MAX_IDLE_MS`` (``limits.IdleExpiry``) and samples the bytes all
connections hold into ``kafscale_connection_held_bytes``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time

from kafscale import metrics
from kafscale.frontend.authn import new_session
from kafscale.frontend.connection import Connection
from kafscale.frontend.context import Broker
from kafscale.frontend.limits import (
    Admission,
    ConnectionQuotas,
    IdleExpiry,
    LogLimiter,
    address_key,
)
from kafscale.security import listeners, tls

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024
LOG_INTERVAL_SECONDS = 10.0
ACCEPT_RETRY_SECONDS = 1.0
SWEEP_SECONDS = 1.0
FILES_RESERVED = 256  # descriptors beyond client sockets: ZeroMQ, metadata store, logs
RESOURCE_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
TLS_HANDSHAKE_SECONDS = 30.0


class Listener:
    def __init__(self, broker: Broker) -> None:
        config = broker.config
        self.broker = broker
        self.quotas = ConnectionQuotas(
            config.max_connections,
            config.max_connections_per_ip,
            dict(config.max_connections_per_ip_overrides),
        )
        idle_ms = config.connections_max_idle_ms
        self.idle: IdleExpiry[Connection] = IdleExpiry(None if idle_ms < 0 else idle_ms / 1000)
        self.connections: set[Connection] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self.endpoints = config.kafka_listeners
        self.tls: tls.ReloadingContext | None = None
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._slot_freed = asyncio.Event()
        self._paused = 0  # accept loops waiting for a slot
        self._log_limiter = LogLimiter(LOG_INTERVAL_SECONDS)

    async def start(self) -> None:
        """Load the TLS files (if a listener needs them), bind every listener and start
        accepting; raises OSError saying which listener or file failed."""
        config = self.broker.config
        _raise_file_limit(config.max_connections + FILES_RESERVED)
        if any(endpoint.protocol.tls for endpoint in self.endpoints):
            files = tls.TlsFiles(
                config.ssl_cert_file,
                config.ssl_key_file,
                config.ssl_ca_file,
                config.ssl_client_auth,
                config.ssl_key_password or None,
            )
            try:
                self.tls = tls.ReloadingContext("kafka", files)
            except OSError as exc:  # ssl.SSLError included
                raise OSError(
                    f"cannot load the TLS files {', '.join(files.paths())} "
                    f"(KAFSCALE_SSL_CERT_FILE, KAFSCALE_SSL_KEY_FILE, KAFSCALE_SSL_CA_FILE): {exc}"
                ) from None
        bound: list[tuple[socket.socket, listeners.Listener]] = []
        try:
            for endpoint in self.endpoints:
                try:
                    sockets = await _bind(endpoint.host, endpoint.port)
                except OSError as exc:
                    raise OSError(
                        f"cannot listen on {endpoint.name}://{endpoint.host}:{endpoint.port}: "
                        f"{exc.strerror or exc}"
                    ) from None
                bound.extend((sock, endpoint) for sock in sockets)
        except OSError:
            for sock, _ in bound:
                sock.close()
            raise
        for listening, endpoint in bound:
            self._sockets.append(listening)
            self._tasks.append(asyncio.create_task(self._accept_loop(listening, endpoint)))
        self._tasks.append(asyncio.create_task(self._sweep()))

    def stop_accepting(self) -> None:
        for task in self._tasks:
            task.cancel()
        for listening in self._sockets:
            listening.close()
        metrics.ACCEPT_PAUSED.set(0)

    async def drain(self, timeout: float) -> None:
        """Stop reading every connection, answer what was read, for at most ``timeout``."""
        for connection in list(self.connections):
            connection.close()
        if self._serving:
            _, busy = await asyncio.wait(list(self._serving), timeout=timeout)
            if busy:
                log.warning("connections still busy at shutdown", extra={"count": len(busy)})

    async def _accept_loop(self, listening: socket.socket, endpoint: listeners.Listener) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_slot()
            try:
                sock, address = await loop.sock_accept(listening)
            except OSError as exc:
                await self._accept_failed(exc)
                continue
            host = address[0] if isinstance(address, tuple) else str(address)
            try:
                await self._admit(sock, address_key(host), endpoint)
            except Exception:  # a bug here must not stop the listener for good
                log.exception("accepting a connection failed", extra={"peer": host})
                sock.close()

    async def _admit(self, sock: socket.socket, address: str, endpoint: listeners.Listener) -> None:
        while (verdict := self.quotas.admit(address)) is Admission.OVER_MAX_CONNECTIONS:
            # Another listening socket took the last slot meanwhile: hold this one until a
            # slot frees, as Kafka's acceptor does.
            await self._wait_for_slot()
        if verdict is Admission.OVER_MAX_CONNECTIONS_PER_IP:
            sock.close()
            metrics.CONNECTIONS_REFUSED.labels(verdict.value).inc()
            held_back = self._log_limiter.allow(address, time.monotonic())
            if held_back is not None:
                log.warning(
                    "refused a connection: its address already has the configured maximum of "
                    "connections (KAFSCALE_MAX_CONNECTIONS_PER_IP)",
                    extra={
                        "peer": address,
                        "max_connections_per_ip": self.quotas.limit_for(address),
                        "refusals_not_logged": held_back,
                    },
                )
            return
        task = asyncio.create_task(self._serve(sock, address, endpoint))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, sock: socket.socket, address: str, endpoint: listeners.Listener) -> None:
        try:
            opened = await self._open(sock, address, endpoint)
            if opened is None:
                return
            reader, writer = opened
            session = new_session(self.broker, endpoint, writer.get_extra_info("peercert"))
            connection = Connection(self.broker, reader, writer, self.idle, session)
            self.connections.add(connection)
            try:
                await connection.serve()
            finally:
                self.connections.discard(connection)
        finally:
            self.quotas.release(address)
            self._slot_freed.set()

    async def _open(
        self, sock: socket.socket, address: str, endpoint: listeners.Listener
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Streams over an accepted socket, after the TLS handshake on a TLS listener; None if
        the client went away or the handshake failed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        context = self.tls.listening if endpoint.protocol.tls and self.tls is not None else None
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                sock,
                ssl=context,
                ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS if context is not None else None,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            sock.close()
            if context is not None:
                self._handshake_failed(endpoint, address, exc)
            return None
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def _handshake_failed(self, endpoint: listeners.Listener, address: str, exc: Exception) -> None:
        metrics.TLS_HANDSHAKE_FAILURES.labels(endpoint.name).inc()
        held_back = self._log_limiter.allow(f"tls {address}", time.monotonic())
        if held_back is not None:
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            log.warning(
                "TLS handshake failed",
                extra={
                    "listener": endpoint.name,
                    "peer": address,
                    "reason": reason,
                    "failures_not_logged": held_back,
                },
            )

    async def _wait_for_slot(self) -> None:
        if self.quotas.has_slot():
            return
        metrics.ACCEPT_PAUSES.inc()
        held_back = self._log_limiter.allow("max_connections", time.monotonic())
        if held_back is not None:
            log.warning(
                "not accepting connections until one closes: the broker has the configured "
                "maximum (KAFSCALE_MAX_CONNECTIONS)",
                extra={
                    "max_connections": self.quotas.max_connections,
                    "pauses_not_logged": held_back,
                },
            )
        self._paused += 1
        metrics.ACCEPT_PAUSED.set(1)
        try:
            while not self.quotas.has_slot():
                self._slot_freed.clear()
                await self._slot_freed.wait()
        finally:
            self._paused -= 1
            if not self._paused:
                metrics.ACCEPT_PAUSED.set(0)

    async def _accept_failed(self, exc: OSError) -> None:
        if exc.errno not in RESOURCE_ERRORS:
            # The client went away between SYN and accept (ECONNABORTED, ...): nothing to do.
            log.debug("accept failed", extra={"error": str(exc)})
            return
        held_back = self._log_limiter.allow("accept", time.monotonic())
        if held_back is not None:
            log.warning(
                "cannot accept connections; retrying in %.0f s",
                ACCEPT_RETRY_SECONDS,
                extra={
                    "error": exc.strerror or str(exc),
                    "connections": self.quotas.total,
                    "failures_not_logged": held_back,
                },
            )
        await asyncio.sleep(ACCEPT_RETRY_SECONDS)

    async def _sweep(self) -> None:
        interval = SWEEP_SECONDS
        if self.idle.max_idle is not None:
            interval = min(interval, self.idle.max_idle / 4)
        reload_every = self.broker.config.ssl_reload_interval_ms / 1000
        next_reload = time.monotonic() + reload_every
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            try:
                self._sweep_once(now)
                if self.tls is not None and now >= next_reload:
                    next_reload = now + reload_every
                    self._reload_tls(self.tls)
            except Exception:  # a bug here must not end idle expiry for good
                log.exception("connection sweep failed")

    def _reload_tls(self, context: tls.ReloadingContext) -> None:
        failures = context.failures
        if context.check():
            metrics.TLS_RELOADS.labels("loaded").inc()
        elif context.failures > failures:
            metrics.TLS_RELOADS.labels("failed").inc()

    def _sweep_once(self, now: float) -> None:
        for connection in self.idle.expired(now):
            if connection.write_progressed():
                self.idle.opened(connection, now)
            else:
                connection.close_idle()
        metrics.CONNECTION_HELD_BYTES.set(sum(c.held_bytes for c in self.connections))


async def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to (all interfaces if empty), set
    up as ``asyncio.start_server`` sets them up."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # One socket per family, as asyncio does: the IPv4 socket takes IPv4 clients.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _raise_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open file limit is below KAFSCALE_MAX_CONNECTIONS: accepting will fail before "
            "the connection limit is reached",
            extra={"open_file_limit": soft, "wanted": wanted},
        )
