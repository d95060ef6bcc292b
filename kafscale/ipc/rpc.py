"""Request/reply over ZeroMQ between the broker's processes.

A server binds a ROUTER socket; clients connect DEALER sockets, so one client can have many
requests in flight and replies are matched by request id, not by order. Frames (see
``kafscale.ipc.messages`` for the layout) after the header are bulk bytes, sent without copying.
Peers come and go (a restarted shard re-binds the same ipc:// path and ZeroMQ reconnects on its
own); a request to an absent peer fails fast with ``PeerUnavailable`` instead of queueing.
Errors name the peer (``shard-0``), not its socket's path: their text may reach a Kafka client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kafscale.ipc import messages
from kafscale.ipc.messages import Message

REQUEST_ID = struct.Struct(">Q")
POLLIN = int(zmq.POLLIN)  # a plain int: ZMQ_EVENTS & zmq.POLLIN would go through enum.Flag
Bulk = Sequence[bytes | memoryview | zmq.Frame]


class RpcError(Exception):
    """A request failed in transport (not a Kafka-level error)."""


def peer_name(address: str) -> str:
    """``ipc:///run/dir/shard-0.sock`` -> ``shard-0``: the runtime directory is the broker's own."""
    if address.startswith("ipc://"):
        return os.path.basename(address).removesuffix(".sock")
    return address


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
        self.peer = peer_name(address)
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
            raise PeerUnavailable(f"nothing listens on {self.peer}")
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
                raise PeerUnavailable(f"{self.peer} went away")
        raise RpcTimeout(f"no reply from {self.peer} within {timeout_ms} ms")

    def _drain_disconnects(self) -> None:
        while self._monitor.poll(0, zmq.POLLIN):
            self._monitor.recv_multipart()

    def close(self) -> None:
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        self.socket.close(linger=0)


def _int_option(socket: zmq.Socket[bytes], option: int) -> int:
    value = socket.getsockopt(option)
    assert isinstance(value, int)
    return value


class AsyncRpcClient:
    """A DEALER socket with many requests in flight, matched to replies by request id.

    It is a plain (synchronous) ZeroMQ socket driven by the event loop: sends are non-blocking,
    and replies are read when the loop sees the socket's ZMQ_FD readable. pyzmq's asyncio
    sockets make a future, a done-callback and often a timer for every send and every receive,
    which cost a produce request more than all the rest of its handling; here a call costs one
    future and one timer. ZMQ_FD only signals that the socket's events *may* have changed
    (edge-triggered, and any send or receive can consume the signal), so replies are drained
    whenever it fires and after every send, until ZMQ_EVENTS has no POLLIN.

    Requests leave in call order, also while the peer is away: a call made while earlier ones
    wait for the peer to (re)connect waits behind them (``_send``). The frontend's produce
    requests rely on it: a connection's batches must reach a partition's shard in the order the
    client sent them, as Kafka appends them, a restarted shard included.
    """

    def __init__(self, context: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self.peer = peer_name(address)
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(context.underlying)
        self.socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        _configure(self.socket)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        self.socket.connect(address)
        self._ids = itertools.count(1)
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        # Sends waiting for the peer, in call order (the first one's turn is set), and the
        # request ids of their calls: no peer has seen those yet.
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._unsent: set[bytes] = set()
        self._monitor: zmq.Socket[bytes] = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(_int_option(self.socket, zmq.FD), self._drain)
            loop.add_reader(_int_option(self._monitor, zmq.FD), self._on_monitor)
            # Arm both: a pipe is signalled only after a reader found it empty.
            self._on_monitor()
        return loop

    async def call(self, message: Message, bulk: Bulk = (), timeout: float = 5.0) -> Reply:
        loop = self._attach()
        request_id = REQUEST_ID.pack(next(self._ids))
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[request_id] = future
        timer = loop.call_later(timeout, self._expire, request_id, timeout)
        try:
            await self._send([request_id, messages.encode(message), *bulk], timeout)
            return await future
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: a timeout that fired while the send still waited

    async def _send(self, frames: list[Any], timeout: float) -> None:
        """Send without blocking the loop, in call order. IMMEDIATE: with no peer connected
        (yet, or any more) nothing is queued, so a fresh or reconnecting socket gets `timeout` to
        (re)establish the connection before the call fails.

        While a send waits for the peer, every later one waits behind it, first come first
        served, and only the first in line polls. Each polling on its own back-off, they reached
        a peer that came back in whatever order their sleeps happened to end: a restarted shard
        got a connection's produce batches out of order and answered OUT_OF_ORDER_SEQUENCE_NUMBER
        for the later ones. A Java producer that gets that answer for the batch after the last
        one it had acknowledged takes it for lost data: it bumps its epoch and sends every
        batch it has not had acknowledged again, as new batches, so those the shard had stored
        (committed, their acknowledgements lost with the old shard) were stored twice."""
        if not self._waiting:
            try:
                self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            else:
                self._drain()  # the send may have consumed the FD's signal of a reply waiting
                return
        deadline = time.monotonic() + timeout
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        self._unsent.add(frames[0])
        if self._waiting[0] is turn:
            turn.set_result(None)
        try:
            try:
                await asyncio.wait_for(asyncio.shield(turn), timeout)
            except TimeoutError:
                raise PeerUnavailable(f"nothing listens on {self.peer}") from None
            pause = 0.001
            while True:
                try:
                    self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
                    break
                except zmq.Again:
                    if time.monotonic() + pause > deadline:
                        raise PeerUnavailable(f"nothing listens on {self.peer}") from None
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 0.05)
        finally:  # sent, given up or cancelled: the next in line goes
            self._unsent.discard(frames[0])
            self._waiting.remove(turn)
            if self._waiting and not self._waiting[0].done():
                self._waiting[0].set_result(None)
        self._drain()

    def _drain(self) -> None:
        while _int_option(self.socket, zmq.EVENTS) & POLLIN:
            frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            if len(frames) < 2:
                continue
            future = self._pending.get(frames[0].bytes)
            if future is None or future.done():
                continue  # a late reply to a request that timed out or was cancelled
            try:
                future.set_result(Reply(messages.decode(frames[1].buffer), frames[2:]))
            except msgspec.DecodeError as exc:
                future.set_exception(RpcError(f"undecodable reply from {self.peer}: {exc}"))

    def _expire(self, request_id: bytes, timeout: float) -> None:
        if request_id in self._unsent:
            return  # its send gives up by itself: a call failed here could still be sent
        future = self._pending.get(request_id)
        if future is not None and not future.done():
            future.set_exception(RpcTimeout(f"no reply from {self.peer} within {timeout} s"))

    def _on_monitor(self) -> None:
        """A peer that goes away (a crashed process) will never answer what it was asked: fail
        those requests at once instead of at their timeouts (a parked fetch or JoinGroup may
        have minutes left). Its successor gets the retries.

        Only what it was asked and did not answer: the replies it sent before it went are
        taken first, and a call still waiting to be sent (made after the peer went) is not
        failed: it goes to the successor. Failing those reported a produce request lost that
        the successor appended and answered (the producer then held a batch stored but not
        acknowledged, which a later epoch bump sends again)."""
        disconnected = False
        while _int_option(self._monitor, zmq.EVENTS) & POLLIN:
            self._monitor.recv_multipart(flags=zmq.NOBLOCK)
            disconnected = True
        self._drain()
        if disconnected:
            for request_id, future in list(self._pending.items()):
                if request_id not in self._unsent and not future.done():
                    future.set_exception(PeerUnavailable(f"{self.peer} went away"))

    async def notify(self, message: Message) -> None:
        """Send a one-way notice (no reply expected); dropped if the peer is not connected."""
        self._attach()
        with contextlib.suppress(zmq.Again):
            self.socket.send_multipart([REQUEST_ID.pack(0), messages.encode(message)], zmq.NOBLOCK)
        self._drain()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(_int_option(self.socket, zmq.FD))
            self._loop.remove_reader(_int_option(self._monitor, zmq.FD))
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcError(f"client to {self.peer} closed"))
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
