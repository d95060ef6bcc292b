"""A raw Kafka wire client for tests that send what no real client would."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kio.serial import entity_reader

from tests.unit.protocol.test_codec import request_frame


class Wire:
    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: Any, correlation_id: int = 1) -> None:
        frame = request_frame(request, correlation_id)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def read_frame(self) -> bytes:
        (length,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(length)

    def read_response(self, schema: Any) -> tuple[int, Any]:
        frame = self.read_frame()
        header, header_size = entity_reader(schema.__header_schema__)(frame, 0)
        body, body_size = entity_reader(schema)(frame, header_size)
        assert header_size + body_size == len(frame)
        return int(header.correlation_id), body

    def is_closed_by_peer(self) -> bool:
        """True once the broker has closed the connection (EOF or reset)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionError("closed by the broker")
            chunks += chunk
        return bytes(chunks)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
