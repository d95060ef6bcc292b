"""Answers to Produce v0-v2, which Kafka 4 removed (KIP-896) but still advertises from v0.

kio's message types start at Produce v3, so these versions are parsed and answered by hand: each
partition gets UNSUPPORTED_VERSION, nothing is written. acks=0 gets no answer, as always.

    request  v0-v2: acks int16, timeout int32,
                    [topic string, [partition int32, message_set bytes(int32 length)]]
    response v0:    [topic string, [partition int32, error_code int16, base_offset int64]]
             v1:    v0 + throttle_time_ms int32 (after the topics)
             v2:    v1 + log_append_time int64 per partition
"""

from __future__ import annotations

import struct

from kafscale.protocol.errors import ErrorCode, MalformedRequest
from kafscale.protocol.framing import LENGTH

_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise MalformedRequest("Produce v0-v2 request ends early")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def int16(self) -> int:
        return int(_INT16.unpack(self.take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self.take(4))[0])

    def string(self) -> bytes:
        return self.take(self.int16())


def refuse(frame: bytes) -> bytes | None:
    """The response frame refusing every partition of a Produce v0-v2 request, or None for
    acks=0. Raises MalformedRequest when the request does not parse."""
    _, version, correlation_id = _HEADER.unpack_from(frame)
    reader = _Reader(frame, _HEADER.size)
    client_id_length = reader.int16()
    if client_id_length > 0:
        reader.take(client_id_length)
    acks = reader.int16()
    reader.int32()  # timeout
    topics = []
    for _ in range(reader.int32()):
        name = reader.string()
        partitions = []
        for _ in range(reader.int32()):
            partitions.append(reader.int32())
            reader.take(reader.int32())  # the message set, never looked at
        topics.append((name, partitions))
    if acks == 0:
        return None
    out = bytearray(LENGTH.size)
    out += _INT32.pack(correlation_id) + _INT32.pack(len(topics))
    for name, partitions in topics:
        out += _INT16.pack(len(name)) + name + _INT32.pack(len(partitions))
        for partition in partitions:
            out += struct.pack(">ihq", partition, ErrorCode.unsupported_version, -1)
            if version >= 2:
                out += struct.pack(">q", -1)  # log_append_time
    if version >= 1:
        out += _INT32.pack(0)  # throttle_time_ms
    LENGTH.pack_into(out, 0, len(out) - LENGTH.size)
    return bytes(out)
