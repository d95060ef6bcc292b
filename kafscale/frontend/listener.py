"""The Kafka listener: accepts client connections within the connection limits, runs a
``Connection`` for each, and closes the idle ones.

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
from kafscale.frontend.connection import Connection
from kafscale.frontend.context import Broker
from kafscale.frontend.limits import (
    Admission,
    ConnectionQuotas,
    IdleExpiry,
    LogLimiter,
    address_key,
)

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024
LOG_INTERVAL_SECONDS = 10.0
ACCEPT_RETRY_SECONDS = 1.0
SWEEP_SECONDS = 1.0
FILES_RESERVED = 256  # descriptors beyond client sockets: ZeroMQ, metadata store, logs
RESOURCE_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


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
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._slot_freed = asyncio.Event()
        self._paused = 0  # accept loops waiting for a slot
        self._log_limiter = LogLimiter(LOG_INTERVAL_SECONDS)

    async def start(self) -> None:
        """Bind and start accepting; raises OSError if the address cannot be bound."""
        config = self.broker.config
        _raise_file_limit(config.max_connections + FILES_RESERVED)
        self._sockets = await _bind(config.broker_host, config.broker_port)
        for listening in self._sockets:
            self._tasks.append(asyncio.create_task(self._accept_loop(listening)))
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

    async def _accept_loop(self, listening: socket.socket) -> None:
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
                await self._admit(sock, address_key(host))
            except Exception:  # a bug here must not stop the listener for good
                log.exception("accepting a connection failed", extra={"peer": host})
                sock.close()

    async def _admit(self, sock: socket.socket, address: str) -> None:
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
        task = asyncio.create_task(self._serve(sock, address))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, sock: socket.socket, address: str) -> None:
        try:
            try:
                reader, writer = await asyncio.open_connection(sock=sock)
            except OSError:
                sock.close()
                return
            connection = Connection(self.broker, reader, writer, self.idle)
            self.connections.add(connection)
            try:
                await connection.serve()
            finally:
                self.connections.discard(connection)
        finally:
            self.quotas.release(address)
            self._slot_freed.set()

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
        while True:
            await asyncio.sleep(interval)
            try:
                self._sweep_once(time.monotonic())
            except Exception:  # a bug here must not end idle expiry for good
                log.exception("connection sweep failed")

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
