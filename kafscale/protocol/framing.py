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
        """Add ``data``; return every frame it completes, in order."""
        self._buffer += data
        frames: list[bytes] = []
        while True:
            if self._expected is None:
                if len(self._buffer) < LENGTH.size:
                    return frames
                (length,) = LENGTH.unpack_from(self._buffer)
                self._check_length(length)
                del self._buffer[: LENGTH.size]
                self._expected = length
            if len(self._buffer) < self._expected:
                return frames
            frames.append(bytes(self._buffer[: self._expected]))
            del self._buffer[: self._expected]
            self._expected = None

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
