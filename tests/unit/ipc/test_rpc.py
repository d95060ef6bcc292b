import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
import zmq
import zmq.asyncio

from kafscale.ipc import messages
from kafscale.ipc.rpc import (
    AsyncRpcClient,
    Incoming,
    PeerUnavailable,
    RpcClient,
    RpcServer,
    RpcTimeout,
    serve_until,
)

T = TypeVar("T")
PONG = messages.Pong(role="shard", index=1, pid=42, started_at=1.5)


@pytest.fixture
def address(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/server.sock"


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.term()


class Server:
    """An RpcServer on a thread: Ping -> Pong; an ErrorReply echoes bulk frames back."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.stopping = threading.Event()
        self.server = RpcServer(context, address)
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        def echo(incoming: Incoming) -> messages.Message:
            size = sum(len(frame.bytes) for frame in incoming.bulk)
            return messages.ErrorReply(message=f"{len(incoming.bulk)} frames, {size} bytes")

        try:
            serve_until(
                self.stopping,
                self.server,
                {messages.Ping: lambda _: PONG, messages.ErrorReply: echo},
                idle_ms=20,
            )
        finally:
            self.server.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


def test_messages_round_trip_by_tag() -> None:
    for message in (
        PONG,
        messages.Ping(),
        messages.Ready(role="frontend", index=0, pid=1),
        messages.BootFailed(role="flusher", index=0, pid=2, reason="S3 down"),
    ):
        assert messages.decode(messages.encode(message)) == message
    with pytest.raises(msgspec.DecodeError):
        messages.decode(b"\x93garbage")


def test_call_and_reply_with_bulk_frames(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    server = Server(context, address)
    client = RpcClient(context, address)
    try:
        assert client.call(messages.Ping(), timeout_ms=5000).message == PONG
        payload = memoryview(bytes(range(256)) * 4096)  # sent without a copy
        reply = client.call(messages.ErrorReply(message="echo"), [payload, b"xy"], timeout_ms=5000)
        assert reply.message == messages.ErrorReply(message="2 frames, 1048578 bytes")
        # A request type the server has no handler for gets an ErrorReply, not silence.
        reply = client.call(messages.Ready(role="x", index=0, pid=0), timeout_ms=5000)
        assert isinstance(reply.message, messages.ErrorReply)
        assert "unexpected Ready" in reply.message.message
    finally:
        client.close()
        server.stop()


def test_absent_peer_fails_fast(context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
    client = RpcClient(context, address)
    with pytest.raises(PeerUnavailable):
        client.call(messages.Ping(), timeout_ms=100)
    client.close()


def test_silent_peer_times_out(context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
    silent = context.socket(zmq.ROUTER)
    silent.bind(address)
    client = RpcClient(context, address)
    with pytest.raises(RpcTimeout):
        client.call(messages.Ping(), timeout_ms=200)
    client.close()
    silent.close(linger=0)


def test_a_request_to_a_peer_that_dies_fails_at_once(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    doomed = context.socket(zmq.ROUTER)
    doomed.bind(address)
    client = RpcClient(context, address)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.call(messages.Ping(), timeout_ms=60_000)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert doomed.poll(5000, zmq.POLLIN), "the request never arrived"
    doomed.recv_multipart()
    doomed.close(linger=0)  # dies holding the request
    caller.join(timeout=30)
    assert not caller.is_alive(), "the call waited for its 60 s timeout"
    assert len(outcome) == 1 and isinstance(outcome[0], PeerUnavailable), outcome
    client.close()


def test_client_reconnects_to_a_restarted_server(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    client = RpcClient(context, address)
    server = Server(context, address)
    assert client.call(messages.Ping(), timeout_ms=5000).message == PONG
    server.stop()
    server = Server(context, address)  # a respawned child binds the same path
    try:
        # A request sent before ZeroMQ has noticed the old connection is gone is lost with it;
        # the client must say so at once (not after the timeout), and the next one must land.
        outcomes: list[object] = []
        for _ in range(2):
            try:
                outcomes.append(client.call(messages.Ping(), timeout_ms=5000).message)
                break
            except PeerUnavailable as exc:
                outcomes.append(exc)
        assert outcomes[-1] == PONG, outcomes
    finally:
        client.close()
        server.stop()


def test_async_client_matches_concurrent_replies(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    server = Server(context, address)

    async def many() -> list[messages.Message]:
        async_context = zmq.asyncio.Context()
        client = AsyncRpcClient(async_context, address)
        try:
            replies = await asyncio.gather(
                *(
                    client.call(messages.ErrorReply(message="echo"), [b"x" * n], timeout=10)
                    for n in range(50)
                )
            )
            return [reply.message for reply in replies]
        finally:
            client.close()
            async_context.term()

    try:
        results = asyncio.run(many())
    finally:
        server.stop()
    assert results == [messages.ErrorReply(message=f"1 frames, {n} bytes") for n in range(50)]


def _run_async_client(address: str, work: Callable[[AsyncRpcClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async_context = zmq.asyncio.Context()
        client = AsyncRpcClient(async_context, address)
        try:
            return await work(client)
        finally:
            client.close()
            async_context.term()

    return asyncio.run(main())


def test_async_client_absent_peer_fails_fast(address: str) -> None:
    async def call(client: AsyncRpcClient) -> None:
        await client.call(messages.Ping(), timeout=0.2)

    with pytest.raises(PeerUnavailable):
        _run_async_client(address, call)


def test_async_client_silent_peer_times_out(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    silent = context.socket(zmq.ROUTER)
    silent.bind(address)

    async def call(client: AsyncRpcClient) -> None:
        await client.call(messages.Ping(), timeout=0.3)

    try:
        with pytest.raises(RpcTimeout):
            _run_async_client(address, call)
    finally:
        silent.close(linger=0)


def test_async_client_request_to_a_peer_that_dies_fails_at_once(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    doomed = context.socket(zmq.ROUTER)
    doomed.bind(address)

    async def call(client: AsyncRpcClient) -> BaseException | None:
        pending = asyncio.ensure_future(client.call(messages.Ping(), timeout=60))
        for _ in range(500):  # the request reaches the peer, which dies holding it
            if doomed.poll(0, zmq.POLLIN):
                doomed.recv_multipart()
                doomed.close(linger=0)
                break
            await asyncio.sleep(0.01)
        done, _ = await asyncio.wait([pending], timeout=30)
        assert done, "the call waited for its 60 s timeout"
        return pending.exception()

    outcome = _run_async_client(address, call)
    assert isinstance(outcome, PeerUnavailable), outcome


def test_async_client_reconnects_and_drops_late_replies(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    """A reply that comes after its call gave up is dropped; the calls after it still match
    their own replies, across a restarted server."""
    slow = context.socket(zmq.ROUTER)
    slow.bind(address)

    async def calls(client: AsyncRpcClient) -> list[object]:
        with pytest.raises(RpcTimeout):
            await client.call(messages.Ping(), timeout=0.2)
        identity, request_id, _ = slow.recv_multipart()
        slow.send_multipart([identity, request_id, messages.encode(messages.Ping())])
        slow.close(linger=0)
        server = Server(context, address)
        try:
            outcomes: list[object] = []
            for _ in range(3):
                try:
                    outcomes.append((await client.call(messages.Ping(), timeout=5)).message)
                    break
                except PeerUnavailable as exc:
                    outcomes.append(exc)
            return outcomes
        finally:
            server.stop()

    outcomes = _run_async_client(address, calls)
    assert outcomes[-1] == PONG, outcomes


class LatePeer:
    """A ROUTER that binds only when ``take`` is called, then takes ``count`` requests
    (answering each with its own message) and returns their messages in the order they arrived.
    Polls without blocking: the client's sends run on the same event loop."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.context, self.address = context, address
        self.socket: zmq.Socket[bytes] | None = None

    async def take(self, count: int) -> list[str]:
        self.socket = peer = self.context.socket(zmq.ROUTER)
        peer.bind(self.address)
        arrived: list[str] = []
        for _ in range(3000):
            while len(arrived) < count and peer.poll(0, zmq.POLLIN):
                identity, request_id, body = peer.recv_multipart()
                message = messages.decode(body)
                assert isinstance(message, messages.ErrorReply)
                arrived.append(message.message)
                peer.send_multipart([identity, request_id, body])
            if len(arrived) == count:
                break
            await asyncio.sleep(0.005)
        return arrived

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)


def test_async_client_calls_reach_a_returning_peer_in_call_order(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    """Calls made while the peer is away (a shard respawning) reach it, once it is back, in the
    order they were made: a connection's produce requests must reach a partition's shard in
    order. They are made 7 ms apart, 84 ms in all: sends each retrying on its own back-off (at
    most 50 ms) would retry at points that wrap around that period, so whatever the moment the
    peer comes back, some later call would get there before an earlier one."""
    count = 12
    peer = LatePeer(context, address)

    async def calls(client: AsyncRpcClient) -> tuple[list[str], list[messages.Message]]:
        made = []
        for n in range(count):
            message = messages.ErrorReply(message=f"request {n}")
            made.append(asyncio.ensure_future(client.call(message, timeout=30)))
            await asyncio.sleep(0.007)
        await asyncio.sleep(0.3)  # every call is waiting for the peer, backing off
        arrived = await peer.take(count)
        replies = await asyncio.gather(*made)
        return arrived, [reply.message for reply in replies]

    try:
        arrived, replies = _run_async_client(address, calls)
    finally:
        peer.close()
    expected = [f"request {n}" for n in range(count)]
    assert arrived == expected
    assert replies == [messages.ErrorReply(message=m) for m in expected]


def test_async_client_a_call_that_gives_up_waiting_leaves_the_line(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    """A call that times out (or is cancelled) while waiting for the peer fails alone; the calls
    behind it keep their order and go once the peer is back."""
    peer = LatePeer(context, address)

    async def call(client: AsyncRpcClient, text: str, timeout: float) -> messages.Message:
        return (await client.call(messages.ErrorReply(message=text), timeout=timeout)).message

    async def calls(client: AsyncRpcClient) -> tuple[list[str], list[object]]:
        first = asyncio.ensure_future(call(client, "first", 30))
        await asyncio.sleep(0.01)
        impatient = asyncio.ensure_future(call(client, "impatient", 0.1))
        cancelled = asyncio.ensure_future(call(client, "cancelled", 30))
        last = asyncio.ensure_future(call(client, "last", 30))
        await asyncio.sleep(0.2)
        cancelled.cancel()
        arrived = await peer.take(2)
        outcomes = await asyncio.gather(first, impatient, cancelled, last, return_exceptions=True)
        return arrived, [type(o).__name__ if isinstance(o, BaseException) else o for o in outcomes]

    try:
        arrived, outcomes = _run_async_client(address, calls)
    finally:
        peer.close()
    assert arrived == ["first", "last"]
    assert outcomes == [
        messages.ErrorReply(message="first"),
        "PeerUnavailable",
        "CancelledError",
        messages.ErrorReply(message="last"),
    ]


def test_async_client_a_dead_peer_fails_only_what_was_sent_to_it(
    context: zmq.Context[zmq.Socket[bytes]], address: str
) -> None:
    """A peer that dies fails at once the call it was holding; calls made after it died, still
    waiting for a peer, are not failed by the news: they reach its successor and get its
    replies. (Failing one that then reached the successor reported a produce request lost that
    the restarted shard had appended.)"""
    peer = LatePeer(context, address)

    async def call(client: AsyncRpcClient, text: str) -> messages.Message:
        return (await client.call(messages.ErrorReply(message=text), timeout=30)).message

    async def calls(client: AsyncRpcClient) -> tuple[list[str], list[object]]:
        doomed = context.socket(zmq.ROUTER)
        doomed.bind(address)
        held = asyncio.ensure_future(call(client, "held"))
        for _ in range(500):
            if doomed.poll(0, zmq.POLLIN):
                break
            await asyncio.sleep(0.01)
        doomed.close(linger=0)  # dies holding the request
        time.sleep(0.1)  # ZeroMQ notices; the event loop does not run, so nothing is told yet
        later = [asyncio.ensure_future(call(client, f"later {n}")) for n in range(3)]
        await asyncio.sleep(0.3)  # now it is: the death is news to every call above
        arrived = await peer.take(3)
        outcomes = await asyncio.gather(held, *later, return_exceptions=True)
        return arrived, [type(o).__name__ if isinstance(o, BaseException) else o for o in outcomes]

    try:
        arrived, outcomes = _run_async_client(address, calls)
    finally:
        peer.close()
    assert arrived == ["later 0", "later 1", "later 2"]
    assert outcomes == [
        "PeerUnavailable",
        *(messages.ErrorReply(message=f"later {n}") for n in range(3)),
    ]
