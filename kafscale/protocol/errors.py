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
    "UnknownApi",
]


class DecodeError(Exception):
    """Bytes from a client that cannot be decoded; the connection cannot continue."""


class InvalidFrameSize(DecodeError):
    """A frame length prefix that is negative or too small to hold a request header."""


class FrameTooLarge(DecodeError):
    """A frame length over the configured maximum (Kafka's socket.request.max.bytes)."""


class MalformedRequest(DecodeError):
    """A request header or body that does not parse under its declared API and version."""


class UnknownApi(DecodeError):
    """An API key Kafka does not define: no response format exists to answer it in."""
