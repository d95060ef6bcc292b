"""A Connection's back-pressure and idle close, over a real socket pair and a real event loop.

The API table holds one test API (SaslAuthenticate's key, whose ``auth_bytes`` make requests of
any size) whose handler the test holds and releases, and whose responses have a chosen size.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from kio.index import load_request_schema

from kafscale import config as configuration
from kafscale.frontend.connection import READ_CHUNK, Connection
from kafscale.frontend.context import Api, Broker, Encoded, RequestContext
from kafscale.frontend.limits import IdleExpiry
from kafscale.protocol import codec
from tests.unit.protocol.test_codec import request_frame

SASL_AUTHENTICATE = 36
FETCH = 1


@dataclass
class HeldApi:
    """Requests wait for ``gate`` (set = answer at once); responses are ``response_bytes`` long."""

    response_bytes: int = 16
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0
    answered: int = 0

    async def handle(self, ctx: RequestContext, request: Any) -> Encoded:
        self.started += 1
        await self.gate.wait()
        self.answered += 1
        header = struct.pack(">ii", self.response_bytes - 4, ctx.header.correlation_id)
        return Encoded([header + bytes(self.response_bytes - len(header))])


def frame(correlation_id: int, size: int) -> bytes:
    """A SaslAuthenticate v0 request frame (length prefix included) of about ``size`` bytes."""
    schema = load_request_schema(SASL_AUTHENTICATE, 0)
    body = request_frame(codec.build(schema, auth_bytes=bytes(size)), correlation_id)
    return struct.pack(">i", len(body)) + body


def fetch_frame(correlation_id: int) -> bytes:
    schema = load_request_schema(FETCH, 12)
    request = codec.build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1024 * 1024,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(),
        forgotten_topics_data=(),
        rack_id="",
    )
    body = request_frame(request, correlation_id)
    return struct.pack(">i", len(body)) + body


@dataclass
class Pair:
    connection: Connection
    client: socket.socket
    api: HeldApi
    served: asyncio.Task[None]

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.client, data)

    async def read_frame(self) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            need = 4 - len(data) if len(data) < 4 else 4 + struct.unpack(">i", data[:4])[0]
            chunk = await loop.sock_recv(self.client, need - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data


@asynccontextmanager
async def connected(
    api: HeldApi, idle: IdleExpiry[Connection] | None = None, **env: str
) -> AsyncIterator[Pair]:
    config = configuration.load({f"KAFSCALE_{k.upper()}": v for k, v in env.items()})
    apis = {
        SASL_AUTHENTICATE: Api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 0, api.handle),
        FETCH: Api(FETCH, "Fetch", 12, 12, api.handle),
    }
    broker = Broker(config, view=None, apis=apis, coordinator=None, shards=None)  # type: ignore[arg-type]
    server_side, client = socket.socketpair()
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=server_side)
    connection = Connection(broker, reader, writer, idle)
    served = asyncio.create_task(connection.serve())
    try:
        yield Pair(connection, client, api, served)
    finally:
        api.gate.set()
        connection.close()
        client.close()
        await asyncio.wait_for(served, 10)


async def settle(condition: Callable[[], bool] | None = None) -> None:
    """Let the loop run until nothing is runnable any more (or ``condition`` holds): the reader
    has taken everything the socket gives it. Bounded by turns, not by time."""
    for _ in range(2000):
        if condition is not None and condition():
            return
        await asyncio.sleep(0)
    assert condition is None, "condition never held"


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_pipelined_requests_past_the_count_limit_wait_in_tcp() -> None:
    async def test() -> None:
        api = HeldApi()
        async with connected(api, connection_max_in_flight_requests="4") as pair:
            await pair.send(b"".join(frame(i, 10) for i in range(50)))
            await settle(lambda: api.started == 4)
            await settle()
            assert (api.started, pair.connection.in_flight_requests) == (4, 4)
            api.gate.set()
            ids = [struct.unpack(">ii", (await pair.read_frame())[:8])[1] for _ in range(50)]
            assert ids == list(range(50))  # all answered, in request order
            assert api.answered == 50

    run(test)


def test_pipelined_bytes_past_the_byte_limit_wait_in_tcp() -> None:
    async def test() -> None:
        api = HeldApi()
        limit = 64 * 1024
        request = frame(0, 20_000)
        async with connected(api, connection_max_in_flight_bytes=str(limit)) as pair:
            sender = asyncio.create_task(pair.send(b"".join(frame(i, 20_000) for i in range(200))))
            await settle(lambda: api.started == 4)
            await settle()
            # Started while below the limit: 0, 20, 40 and 60 KB held; then none.
            assert api.started == 4
            held = pair.connection.held_bytes
            assert held <= limit + 2 * len(request) + READ_CHUNK
            assert not sender.done()  # the rest of the 4 MB waits in the client's socket
            api.gate.set()
            for _ in range(200):
                await pair.read_frame()
            await sender
            assert api.answered == 200
            await settle(lambda: pair.connection.held_bytes == 0)

    run(test)


def test_a_request_larger_than_the_byte_limit_is_served_alone() -> None:
    async def test() -> None:
        api = HeldApi()
        api.gate.set()
        async with connected(api, connection_max_in_flight_bytes="1KiB") as pair:
            await pair.send(frame(1, 50_000) + frame(2, 50_000))
            first, second = await pair.read_frame(), await pair.read_frame()
            assert struct.unpack(">i", first[4:8])[0] == 1
            assert struct.unpack(">i", second[4:8])[0] == 2

    run(test)


def test_a_client_that_never_reads_holds_one_response_per_request_in_progress() -> None:
    async def test() -> None:
        api = HeldApi(response_bytes=1024 * 1024)
        api.gate.set()
        async with connected(
            api, connection_max_in_flight_requests="8", connection_max_in_flight_bytes="64KiB"
        ) as pair:
            sender = asyncio.create_task(pair.send(b"".join(frame(i, 10) for i in range(500))))
            await settle(lambda: api.answered >= 1)
            await settle()
            # The first response fills the socket; reading stopped before more than the
            # requests already started could answer: memory is their responses, not 500 MB.
            assert api.answered <= 8
            write_buffer = pair.connection.writer.transport.get_write_buffer_size()
            assert write_buffer <= api.response_bytes  # one response at a time
            assert pair.connection.held_bytes <= 8 * (api.response_bytes + 100)
            sender.cancel()

    run(test)


def test_a_response_waiting_for_the_client_stops_reading() -> None:
    async def test() -> None:
        api = HeldApi(response_bytes=1024 * 1024)
        api.gate.set()
        async with connected(api, connection_max_in_flight_bytes="64KiB") as pair:
            await pair.send(frame(0, 10))
            await settle(lambda: api.answered == 1)
            await settle()
            # The client reads nothing; its next requests are not even read (the default
            # count limit, 64, would let them all start).
            await pair.send(b"".join(frame(i, 10) for i in range(1, 100)))
            await settle()
            assert api.started == 1
            assert pair.connection.held_bytes >= api.response_bytes

    run(test)


def test_close_idle_frees_a_connection_whose_client_does_not_read() -> None:
    async def test() -> None:
        api = HeldApi(response_bytes=4 * 1024 * 1024)
        api.gate.set()
        idle: IdleExpiry[Connection] = IdleExpiry(60.0)
        async with connected(api, idle) as pair:
            await pair.send(frame(1, 10))
            await settle(lambda: api.answered == 1)
            await settle()
            assert not pair.served.done()  # the writer waits for the client to read
            # Once the socket buffers are full, the client takes nothing more.
            await settle(lambda: not pair.connection.write_progressed())
            assert not idle.is_busy(pair.connection)  # nothing in progress: it may expire
            assert idle.expired(idle.next_expiry() or 0.0) == [pair.connection]
            pair.connection.close_idle()
            await asyncio.wait_for(pair.served, 5)
            assert pair.connection.held_bytes == 0

    run(test)


def test_a_parked_request_keeps_the_connection_busy() -> None:
    async def test() -> None:
        api = HeldApi()
        idle: IdleExpiry[Connection] = IdleExpiry(60.0)
        async with connected(api, idle) as pair:
            await pair.send(frame(1, 10))
            await settle(lambda: api.started == 1)
            assert idle.is_busy(pair.connection)
            assert idle.expired(1e12) == []
            api.gate.set()
            await pair.read_frame()
            await settle(lambda: not idle.is_busy(pair.connection))
            assert idle.next_expiry() is not None

    run(test)


def test_pipelined_fetches_are_served_one_at_a_time() -> None:
    """A Fetch response can be large: a client pipelining fetches it does not read pins one."""

    async def test() -> None:
        api = HeldApi()
        async with connected(api) as pair:
            await pair.send(b"".join(fetch_frame(i) for i in range(10)) + frame(10, 10))
            await settle(lambda: api.started == 1)
            await settle()
            assert api.started == 1  # the next Fetch, and what follows it, wait
            api.gate.set()
            ids = [struct.unpack(">ii", (await pair.read_frame())[:8])[1] for _ in range(11)]
            assert ids == list(range(11))
            assert api.answered == 11

    run(test)


def test_good_requests_before_a_bad_length_are_answered_then_the_connection_closes() -> None:
    """The client sends nothing after the bad length prefix: the close must not wait for it."""

    async def test() -> None:
        api = HeldApi()
        api.gate.set()
        async with connected(api) as pair:
            await pair.send(frame(1, 10) + frame(2, 10) + struct.pack(">i", -5))
            ids = [struct.unpack(">ii", (await pair.read_frame())[:8])[1] for _ in range(2)]
            assert ids == [1, 2]
            loop = asyncio.get_running_loop()
            assert await loop.sock_recv(pair.client, 1) == b""  # closed by the broker
            await asyncio.wait_for(pair.served, 10)

    run(test)
