"""Incremental Kafka framing: a 4-byte big-endian length, then that many bytes.

Sans-io (as h11): ``FrameDecoder.feed`` takes whatever bytes arrived and returns the complete
frames they finish, keeping the rest. A frame's size is judged from its first bytes, before the
rest of it is waited for:

- the length prefix: negative, too small for a request header, or over ``max_request_bytes``
  (Kafka's socket.request.max.bytes) is refused at once;
- the API key and version, the next 4 bytes: ``limits.max_frame_bytes`` says how large a
  request of that API version may be (smaller than ``max_request_bytes`` for most: everything
  in them is decoded field by field).

A bad prefix after good frames in the same read does not lose them: ``feed`` returns them and
raises on its next call (Kafka answers the requests read before the bad one).

Until a SASL connection authenticates, its owner sets ``unauthenticated``: every frame is then
held to Kafka's ``sasl.server.max.receive.size`` (``MAX_SASL_REQUEST_BYTES``), as Kafka's
authenticator reads them. After a SaslHandshake v0 it sets ``raw``: the next frames are bare SASL
tokens, with no request header to judge (any length from 0 up to that bound).
"""

from __future__ import annotations

import struct

from kio.schema.index import api_key_map

from kafscale.protocol.errors import DecodeError, FrameTooLarge, InvalidFrameSize
from kafscale.protocol.limits import MAX_SASL_REQUEST_BYTES, RequestLimits, max_frame_bytes

LENGTH = struct.Struct(">i")
API = struct.Struct(">hh")  # api_key, api_version: the first 4 bytes of every request header

#: Smallest request: api_key (2) + api_version (2) + correlation_id (4).
MIN_REQUEST_BYTES = 8


class FrameDecoder:
    """Splits a byte stream into frames. Invariant: ``_buffer`` never holds more than one read
    plus one frame that passed both size checks."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self._buffer = bytearray()
        self._expected: int | None = None  # length of the frame being read, once known
        self._api_checked = False  # whether that length was judged against its API's limit
        self._error: DecodeError | None = None  # raised on the call after the good frames
        self.unauthenticated = False  # every frame within MAX_SASL_REQUEST_BYTES
        self.raw = False  # frames are bare SASL tokens (after a SaslHandshake v0)

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return every frame it completes, in order. Each frame is copied out
        once, and the consumed bytes are dropped from the buffer once per call. Raises
        DecodeError on a bad size -- on the next call when good frames came before it."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        position, size = 0, len(buffer)
        try:
            with memoryview(buffer) as view:
                while True:
                    if self._expected is None:
                        if size - position < LENGTH.size:
                            break
                        (length,) = LENGTH.unpack_from(buffer, position)
                        self._check_length(length)
                        position += LENGTH.size
                        self._expected, self._api_checked = length, False
                    if not self._api_checked and not self.raw:
                        if size - position < API.size:
                            break
                        self._check_api_length(self._expected, *API.unpack_from(buffer, position))
                        self._api_checked = True
                    if size - position < self._expected:
                        break
                    end = position + self._expected
                    frames.append(bytes(view[position:end]))
                    position, self._expected = end, None
        except DecodeError as exc:
            if not frames:
                raise
            self._error = exc
            buffer.clear()
            return frames
        del buffer[:position]
        return frames

    def raise_pending(self) -> None:
        """Raise the decode error held back by the last ``feed`` (it returned the good frames
        before it), so the caller can close the connection without waiting for more bytes."""
        if self._error is not None:
            raise self._error

    def _check_length(self, length: int) -> None:
        if self.unauthenticated and length > MAX_SASL_REQUEST_BYTES:
            raise FrameTooLarge(
                f"frame length {length} before authentication exceeds the maximum of "
                f"{MAX_SASL_REQUEST_BYTES} bytes (Kafka's sasl.server.max.receive.size)"
            )
        if self.raw:
            if length < 0:
                raise InvalidFrameSize(f"SASL token length {length} is negative")
            return
        if length < MIN_REQUEST_BYTES:
            raise InvalidFrameSize(
                f"frame length {length} is below the {MIN_REQUEST_BYTES}-byte request header"
            )
        if length > self.limits.max_request_bytes:
            raise FrameTooLarge(
                f"frame length {length} exceeds the maximum of "
                f"{self.limits.max_request_bytes} bytes (KAFSCALE_MAX_REQUEST_BYTES)"
            )

    def _check_api_length(self, length: int, api_key: int, api_version: int) -> None:
        limit = max_frame_bytes(self.limits, api_key, api_version)
        if length <= limit:
            return
        name = api_key_map.get(api_key, f"API key {api_key}")
        if limit == MAX_SASL_REQUEST_BYTES:
            setting = "Kafka's sasl.server.max.receive.size"
        else:
            setting = "KAFSCALE_MAX_DECODED_REQUEST_BYTES"
        raise FrameTooLarge(
            f"{name} v{api_version} request of {length} bytes exceeds the maximum of "
            f"{limit} bytes ({setting})"
        )


def encode_frame(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload
