"""Request/reply over ZeroMQ between the broker's processes.

A server binds a ROUTER socket; clients connect DEALER sockets, so one client can have many
requests in flight and replies are matched by request id, not by order. Frames (see
``kafscale.ipc.messages`` for the layout) after the header are bulk bytes, sent without copying.
Peers come and go (a restarted shard re-binds the same ipc:// path and ZeroMQ reconnects on its
own); a request to an absent peer fails fast with ``PeerUnavailable`` instead of queueing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kafscale.ipc import messages
from kafscale.ipc.messages import Message

REQUEST_ID = struct.Struct(">Q")
Bulk = Sequence[bytes | memoryview | zmq.Frame]


class RpcError(Exception):
    """A request failed in transport (not a Kafka-level error)."""


class PeerUnavailable(RpcError):
    """No peer is connected to take the request."""


class RpcTimeout(RpcError):
    """The peer did not reply in time."""


@dataclass(slots=True)
class Incoming:
    """A request received by a server: reply with ``RpcServer.reply``."""

    identity: bytes
    request_id: bytes
    message: Message
    bulk: list[zmq.Frame] = field(default_factory=list)


@dataclass(slots=True)
class Reply:
    message: Message
    bulk: list[zmq.Frame] = field(default_factory=list)


def _configure(socket: zmq.Socket[Any]) -> None:
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RECONNECT_IVL, 50)
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)


def _parse_incoming(frames: list[zmq.Frame]) -> Incoming | None:
    if len(frames) < 3:
        return None
    try:
        message = messages.decode(frames[2].buffer)
    except msgspec.DecodeError:
        return None
    return Incoming(frames[0].bytes, frames[1].bytes, message, frames[3:])


class RpcServer:
    """A ROUTER socket serving requests; synchronous, for the shard/flusher/coordinator loops."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.socket: zmq.Socket[bytes] = context.socket(zmq.ROUTER)
        _configure(self.socket)
        self.socket.bind(address)

    def recv(self, timeout_ms: int) -> Incoming | None:
        """The next well-formed request within ``timeout_ms``, or None. Malformed ones are
        dropped (only our own processes connect here)."""
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return _parse_incoming(self.socket.recv_multipart(copy=False))

    def reply(self, incoming: Incoming, message: Message, bulk: Bulk = ()) -> None:
        self.socket.send_multipart(
            [incoming.identity, incoming.request_id, messages.encode(message), *bulk], copy=False
        )

    def close(self) -> None:
        self.socket.close(linger=0)


class AsyncRpcServer:
    """A ROUTER socket serving requests inside an asyncio loop (the frontend)."""

    def __init__(self, context: zmq.asyncio.Context, address: str) -> None:
        self.socket = context.socket(zmq.ROUTER)
        _configure(self.socket)
        self.socket.bind(address)

    async def recv(self) -> Incoming:
        while True:
            frames = await self.socket.recv_multipart(copy=False)
            incoming = _parse_incoming(frames)
            if incoming is not None:
                return incoming

    async def reply(self, incoming: Incoming, message: Message, bulk: Bulk = ()) -> None:
        await self.socket.send_multipart(
            [incoming.identity, incoming.request_id, messages.encode(message), *bulk], copy=False
        )

    def close(self) -> None:
        self.socket.close(linger=0)


class RpcClient:
    """A DEALER socket for synchronous calls (the supervisor's pings). Not thread-safe."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.address = address
        self.socket: zmq.Socket[bytes] = context.socket(zmq.DEALER)
        _configure(self.socket)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.connect(address)
        self._ids = itertools.count(1)
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)

    def call(self, message: Message, bulk: Bulk = (), timeout_ms: int = 1000) -> Reply:
        request_id = REQUEST_ID.pack(next(self._ids))
        # IMMEDIATE: nothing queues for a peer that is not connected; a fresh or reconnecting
        # socket gets the timeout to (re)establish the connection before we give up.
        if not self.socket.poll(timeout_ms, zmq.POLLOUT):
            raise PeerUnavailable(f"nothing listens on {self.address}")
        self._drain_disconnects()  # old news: they happened before this request was sent
        self.socket.send_multipart([request_id, messages.encode(message), *bulk], copy=False)
        deadline = time.monotonic() + timeout_ms / 1000
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            ready = dict(self._poller.poll(left_ms))
            if self.socket in ready:
                frames = self.socket.recv_multipart(copy=False)
                if len(frames) >= 2 and frames[0].bytes == request_id:
                    return Reply(messages.decode(frames[1].buffer), frames[2:])
                # a late reply to an earlier, timed-out request: drop it and keep waiting
            elif self._monitor in ready:
                # A request sent as the peer died (before ZeroMQ noticed) is lost with the
                # connection: say so now rather than at the timeout.
                self._drain_disconnects()
                raise PeerUnavailable(f"{self.address} went away")
        raise RpcTimeout(f"no reply from {self.address} within {timeout_ms} ms")

    def _drain_disconnects(self) -> None:
        while self._monitor.poll(0, zmq.POLLIN):
            self._monitor.recv_multipart()

    def close(self) -> None:
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        self.socket.close(linger=0)


class AsyncRpcClient:
    """A DEALER socket with many requests in flight, matched to replies by request id."""

    def __init__(self, context: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self.socket = context.socket(zmq.DEALER)
        _configure(self.socket)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.connect(address)
        self._ids = itertools.count(1)
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    async def call(self, message: Message, bulk: Bulk = (), timeout: float = 5.0) -> Reply:
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read_replies())
            self._watcher = loop.create_task(self._watch_disconnects())
        request_id = REQUEST_ID.pack(next(self._ids))
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            ready = await self.socket.poll(int(timeout * 1000), zmq.POLLOUT)  # type: ignore[call-arg]
            if not ready:
                raise PeerUnavailable(f"nothing listens on {self.address}")
            await self.socket.send_multipart(
                [request_id, messages.encode(message), *bulk], copy=False
            )
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise RpcTimeout(f"no reply from {self.address} within {timeout} s") from None
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, message: Message) -> None:
        """Send a one-way notice (no reply expected); dropped if the peer is not connected."""
        with contextlib.suppress(zmq.Again):
            await self.socket.send_multipart(
                [REQUEST_ID.pack(0), messages.encode(message)], flags=zmq.NOBLOCK
            )

    async def _watch_disconnects(self) -> None:
        """A peer that goes away (a crashed process) will never answer what it was asked: fail
        those requests at once instead of at their timeouts (a parked fetch or JoinGroup may
        have minutes left). Its successor gets the retries."""
        while True:
            await self._monitor.recv_multipart()
            for future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(PeerUnavailable(f"{self.address} went away"))

    async def _read_replies(self) -> None:
        while True:
            frames = await self.socket.recv_multipart(copy=False)
            if len(frames) < 2:
                continue
            future = self._pending.get(frames[0].bytes)
            if future is None or future.done():
                continue
            try:
                future.set_result(Reply(messages.decode(frames[1].buffer), frames[2:]))
            except msgspec.DecodeError as exc:
                future.set_exception(RpcError(f"undecodable reply from {self.address}: {exc}"))

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcError(f"client to {self.address} closed"))
        self.socket.close(linger=0)


Handler = Callable[[Incoming], Message | None]  # None: answered later (or a notice)


def serve_until(
    stopping: threading.Event,
    server: RpcServer,
    handlers: dict[type, Handler],
    on_idle: Callable[[], None] | None = None,
    idle_ms: int = 200,
) -> None:
    """Answer requests with ``handlers`` (by message type) until ``stopping`` is set, calling
    ``on_idle`` at least every ``idle_ms``. An unknown request type gets an ``ErrorReply``; a
    handler that returns None answers later itself (``server.reply``) or not at all."""
    while not stopping.is_set():
        incoming = server.recv(idle_ms)
        if incoming is not None:
            handler = handlers.get(type(incoming.message))
            if handler is None:
                name = type(incoming.message).__name__
                server.reply(incoming, messages.ErrorReply(message=f"unexpected {name}"))
            else:
                reply = handler(incoming)
                if reply is not None:
                    server.reply(incoming, reply)
        if on_idle is not None:
            on_idle()
