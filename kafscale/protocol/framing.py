"""Incremental Kafka framing: a 4-byte big-endian length, then that many bytes.

Sans-io (as h11): ``FrameDecoder.feed`` takes whatever bytes arrived and returns the complete
frames they finish, keeping the rest. A length prefix that is negative, too small for a request
header, or over ``max_frame_bytes`` raises at once, before any of the frame is buffered, so an
oversize or hostile length can never make us allocate.
"""

from __future__ import annotations

import struct

from kafscale.protocol.errors import FrameTooLarge, InvalidFrameSize

LENGTH = struct.Struct(">i")

#: Smallest request: api_key (2) + api_version (2) + correlation_id (4).
MIN_REQUEST_BYTES = 8


class FrameDecoder:
    """Splits a byte stream into frames. Invariant: ``_buffer`` never holds more than one
    length prefix plus ``max_frame_bytes`` of frame bytes beyond what ``feed`` returns."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._expected: int | None = None  # length of the frame being read, once known

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame it completes, in order. Each frame is copied out
        once, and the consumed bytes are dropped from the buffer once per call."""
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        position, size = 0, len(buffer)
        with memoryview(buffer) as view:
            while True:
                if self._expected is None:
                    if size - position < LENGTH.size:
                        break
                    (length,) = LENGTH.unpack_from(buffer, position)
                    self._check_length(length)
                    position += LENGTH.size
                    self._expected = length
                if size - position < self._expected:
                    break
                end = position + self._expected
                frames.append(bytes(view[position:end]))
                position, self._expected = end, None
        del buffer[:position]
        return frames

    def _check_length(self, length: int) -> None:
        if length < MIN_REQUEST_BYTES:
            raise InvalidFrameSize(
                f"frame length {length} is below the {MIN_REQUEST_BYTES}-byte request header"
            )
        if length > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame length {length} exceeds the maximum of "
                f"{self.max_frame_bytes} bytes (KAFSCALE_MAX_REQUEST_BYTES)"
            )


def encode_frame(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload
