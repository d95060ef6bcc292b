"""SASL on a real Connection over a socket pair, with the real dispatch table (docs/design/
security.md, section 4): the one place ``Connection`` asks the authentication state machine.

A SASL_PLAINTEXT session with SCRAM-SHA-512 and PLAIN; credentials in a static view; the client
side is scramp's SCRAM client and hand-made PLAIN tokens. Covered: the full SCRAM exchange then
Metadata served; the whole exchange pipelined in one write (the SASL steps run one at a time, so
nothing races); a request before authentication closes the connection unanswered; a failed
exchange is answered, then the connection closes; a v0 handshake takes bare tokens, answered
bare; a frame over 512 KiB before authentication closes the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from kio.index import load_request_schema
from scramp import ScramClient

from kafscale.frontend.authn import new_session
from kafscale.frontend.connection import Connection
from kafscale.frontend.context import Broker
from kafscale.metadata.records import ScramRecord
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from kafscale.security.listeners import Listener, SecurityProtocol
from kafscale.security.mechanisms import from_password
from tests.unit.frontend.test_requests import StaticView, decode_response, make_broker
from tests.unit.protocol.test_codec import request_frame

USER, PASSWORD = "alice", "alice-password"
CLUSTER_ID = "abcdefghijklmnopqrstuv"  # make_broker's
SASL = Listener("SASL", SecurityProtocol.SASL_PLAINTEXT, "", 9094, "localhost", 9094)


def sasl_broker() -> Broker:
    broker = make_broker(KAFSCALE_SASL_ENABLED_MECHANISMS="SCRAM-SHA-512,PLAIN")
    credential = from_password("SCRAM-SHA-512", PASSWORD)
    record = ScramRecord(
        credential.salt, credential.stored_key, credential.server_key, credential.iterations
    )
    snapshot = broker.view.snapshot
    view = StaticView(dataclasses.replace(snapshot, credentials={(USER, "SCRAM-SHA-512"): record}))
    return dataclasses.replace(broker, view=view)


def framed(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    body = request_frame(
        codec.build(load_request_schema(api_key, version), **fields), correlation_id
    )
    return struct.pack(">i", len(body)) + body


def handshake(correlation_id: int, mechanism: str, version: int = 1) -> bytes:
    return framed(17, version, correlation_id, mechanism=mechanism)


def authenticate(correlation_id: int, token: bytes) -> bytes:
    return framed(36, 2, correlation_id, auth_bytes=token)


def metadata(correlation_id: int) -> bytes:
    return framed(
        3,
        12,
        correlation_id,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


@dataclasses.dataclass
class Client:
    sock: socket.socket
    connection: Connection

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def read(self) -> bytes | None:
        """The next length-prefixed frame, or None once the broker closed the connection."""
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            need = 4 if len(data) < 4 else 4 + struct.unpack(">i", data[:4])[0]
            chunk = await loop.sock_recv(self.sock, need - len(data))
            if not chunk:
                assert not data, "closed in the middle of a frame"
                return None
            data += chunk
        return data

    async def response(self, api_key: int, version: int) -> Any:
        frame = await self.read()
        assert frame is not None, "the broker closed the connection"
        return decode_response(frame, api_key, version)[1]


@asynccontextmanager
async def connected() -> AsyncIterator[Client]:
    broker = sasl_broker()
    server_side, client = socket.socketpair()
    client.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=server_side)
    connection = Connection(broker, reader, writer, session=new_session(broker, SASL, None))
    served = asyncio.create_task(connection.serve())
    try:
        yield Client(client, connection)
    finally:
        connection.close()
        client.close()
        await asyncio.wait_for(served, 10)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_a_scram_exchange_then_metadata_is_served() -> None:
    async def test() -> None:
        async with connected() as client:
            await client.send(handshake(1, "SCRAM-SHA-512"))
            answer = await client.response(17, 1)
            assert answer.error_code == ErrorCode.none
            assert set(answer.mechanisms) == {"SCRAM-SHA-512", "PLAIN"}
            scram = ScramClient(["SCRAM-SHA-512"], USER, PASSWORD)
            await client.send(authenticate(2, scram.get_client_first().encode()))
            first = await client.response(36, 2)
            assert first.error_code == ErrorCode.none
            scram.set_server_first(first.auth_bytes.decode())
            await client.send(authenticate(3, scram.get_client_final().encode()))
            final = await client.response(36, 2)
            assert final.error_code == ErrorCode.none
            scram.set_server_final(final.auth_bytes.decode())  # the server proved itself too
            assert client.connection.session.principal == f"User:{USER}"
            await client.send(metadata(4))
            assert (await client.response(3, 12)).cluster_id == CLUSTER_ID

    run(test)


def test_a_pipelined_exchange_is_answered_in_order() -> None:
    async def test() -> None:
        async with connected() as client:
            token = b"\0" + USER.encode() + b"\0" + PASSWORD.encode()
            await client.send(handshake(1, "PLAIN") + authenticate(2, token) + metadata(3))
            assert (await client.response(17, 1)).error_code == ErrorCode.none
            assert (await client.response(36, 2)).error_code == ErrorCode.none
            assert (await client.response(3, 12)).cluster_id == CLUSTER_ID

    run(test)


def test_a_request_before_authentication_closes_the_connection_unanswered() -> None:
    async def test() -> None:
        async with connected() as client:
            await client.send(metadata(1))
            assert await client.read() is None

    run(test)


def test_a_failed_exchange_is_answered_then_the_connection_closes() -> None:
    async def test() -> None:
        async with connected() as client:
            wrong = b"\0" + USER.encode() + b"\0wrong"
            await client.send(handshake(1, "PLAIN") + authenticate(2, wrong) + metadata(3))
            assert (await client.response(17, 1)).error_code == ErrorCode.none
            refused = await client.response(36, 2)
            assert refused.error_code == ErrorCode.sasl_authentication_failed
            assert "PLAIN" in refused.error_message and "wrong" not in refused.error_message
            assert await client.read() is None  # the Metadata after it is never answered

    run(test)


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed() -> None:
    async def test() -> None:
        async with connected() as client:
            await client.send(handshake(1, "GSSAPI"))
            answer = await client.response(17, 1)
            assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
            assert set(answer.mechanisms) == {"SCRAM-SHA-512", "PLAIN"}
            assert await client.read() is None

    run(test)


def test_a_v0_handshake_takes_bare_tokens() -> None:
    async def test() -> None:
        async with connected() as client:
            await client.send(handshake(1, "SCRAM-SHA-512", version=0))
            assert (await client.response(17, 0)).error_code == ErrorCode.none
            scram = ScramClient(["SCRAM-SHA-512"], USER, PASSWORD)
            first = scram.get_client_first().encode()
            await client.send(struct.pack(">i", len(first)) + first)
            reply = await client.read()
            assert reply is not None
            scram.set_server_first(reply[4:].decode())
            final = scram.get_client_final().encode()
            await client.send(struct.pack(">i", len(final)) + final)
            reply = await client.read()
            assert reply is not None
            scram.set_server_final(reply[4:].decode())
            await client.send(metadata(2))
            assert (await client.response(3, 12)).cluster_id == CLUSTER_ID

    run(test)


def test_a_large_frame_before_authentication_closes_the_connection() -> None:
    async def test() -> None:
        async with connected() as client:
            await client.send(struct.pack(">i", 512 * 1024 + 1) + b"\0\x24\0\x02")
            assert await client.read() is None

    run(test)
