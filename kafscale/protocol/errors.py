"""The decode-error family and Kafka's error codes.

Malformed input raises a ``DecodeError`` subclass; the connection handler is the one place that
catches it. Kafka error codes are data, never raised: ``ErrorCode`` (kio's IntEnum, generated from
Kafka's own list, with a ``retriable`` flag) is returned inside responses.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "DecodeError",
    "ErrorCode",
    "FrameTooLarge",
    "InvalidFrameSize",
    "MalformedRequest",
    "RequestTooLarge",
    "UnknownApi",
]


class DecodeError(Exception):
    """Bytes from a client that cannot be decoded; the connection cannot continue."""


class InvalidFrameSize(DecodeError):
    """A frame length prefix that is negative or too small to hold a request header."""


class FrameTooLarge(DecodeError):
    """A frame length over its maximum (Kafka's socket.request.max.bytes; smaller for requests
    decoded field by field: ``kafscale.protocol.limits``), refused before the frame is read."""


class MalformedRequest(DecodeError):
    """A request header or body that does not parse under its declared API and version."""


class RequestTooLarge(DecodeError):
    """A request that parses but would cost more to decode and answer than the limits allow
    (too many array elements, too many bytes besides opaque payloads)."""


class UnknownApi(DecodeError):
    """An API key Kafka does not define: no response format exists to answer it in."""
