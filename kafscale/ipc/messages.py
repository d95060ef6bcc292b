"""Every message the broker's processes exchange, as typed msgspec structs.

Wire layout (ZeroMQ multipart messages; see ``kafscale.ipc.rpc``)::

    request  (DEALER -> ROUTER):  [request_id: 8 bytes BE] [header: msgpack Message] [bulk]...
    reply    (ROUTER -> DEALER):  [request_id: 8 bytes BE] [header: msgpack Message] [bulk]...
    notice   (PUSH  -> PULL):     [header: msgpack Message]

The header is one of the structs below, tagged by class name so a receiver decodes it without
knowing in advance which it is. Bulk bytes (record batches) never go inside a header: they travel
as further frames, sent zero-copy, or stay in shared memory and are named by a ``BufferRef``.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, tag=True, frozen=True):
    """Base of all IPC messages; the class name is the tag on the wire."""


# -- supervision ------------------------------------------------------------------------------


class Ready(Message, frozen=True):
    """A child finished booting (backends reached, sockets bound) and serves requests."""

    role: str
    index: int
    pid: int


class BootFailed(Message, frozen=True):
    """A child cannot boot; the supervisor stops the broker and prints ``reason``."""

    role: str
    index: int
    pid: int
    reason: str


class Ping(Message, frozen=True):
    """Liveness probe; every child answers with ``Pong``."""


class Pong(Message, frozen=True):
    role: str
    index: int
    pid: int
    started_at: float


# -- generic replies --------------------------------------------------------------------------


class ErrorReply(Message, frozen=True):
    """The request could not be served; ``message`` says why."""

    message: str


AnyMessage = Ready | BootFailed | Ping | Pong | ErrorReply

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMessage)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> Message:
    """Decode a header frame; raises ``msgspec.DecodeError`` on anything else."""
    message: Message = _decoder.decode(data)
    return message
