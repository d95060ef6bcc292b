"""What one request may cost the frontend: the limits, and the frame size each API may have.

The frontend is one asyncio event loop: while it decodes, handles or answers one request, every
other client waits. Three settings bound one request (Kafka has only the first):

- ``max_request_bytes`` (``KAFSCALE_MAX_REQUEST_BYTES``, Kafka's socket.request.max.bytes): any
  frame. What a Produce request's record batches may fill.
- ``max_decoded_request_bytes``: the part of a request kio decodes field by field, a Python
  object per field: up to ~25 bytes of memory per byte received (an array of 2-byte topic names)
  and ~0.3 s of CPU per MiB. A request without opaque payloads is that part whole, so its frame
  is refused above it as soon as its API key and version arrive (``max_frame_bytes``); the
  others (Produce, JoinGroup, SyncGroup) are held to it by ``bounds.check_request``.
- ``max_request_elements``: array elements (topics, partitions, groups, keys, ...) of one
  request, all arrays together, and its tagged fields (each a step of the structure check).
  Handling and answering cost per element, not per byte: each becomes an entry of the
  response (7-15 us to build and encode on a loaded 2-core machine, kio's writer being pure
  Python), so a 1 MiB Metadata v1 request of 2-byte topic names (524,000 topics) held the loop
  3.6-8 s; 30,000 elements hold it ~0.25 s at worst, and a Fetch of 30,000 partitions (about
  1 MiB) still fits.

Measured worst cases per API: docs/operations.md, "Request decoding"; ``bench/request_decoding.py``
repeats them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Protocol

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema
from kio.serial._introspect import EntityField, EntityTupleField, classify_field

PRODUCE = 0
FIRST_KIO_PRODUCE_VERSION = 3  # v0-2 are refused, parsed by hand (legacy_produce)
SASL_APIS = (17, 36)  # SaslHandshake, SaslAuthenticate
#: Kafka's sasl.server.max.receive.size default.
MAX_SASL_REQUEST_BYTES = 512 * 1024
#: Field types decoded as one bytes object each, whatever their size: not field by field.
OPAQUE_TYPES = ("bytes", "records")


class RequestLimits(Protocol):
    """The settings that bound one request (``kafscale.config.Config`` has them all)."""

    @property
    def max_request_bytes(self) -> int: ...

    @property
    def max_decoded_request_bytes(self) -> int: ...

    @property
    def max_request_elements(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int
    max_decoded_request_bytes: int
    max_request_elements: int


#: No limit but what the frame's own size implies (tests, tools).
UNLIMITED = Limits(2**31 - 1, 2**31 - 1, 2**31 - 1)


def max_frame_bytes(limits: RequestLimits, api_key: int, api_version: int) -> int:
    """The largest frame accepted for a request of this API version, judged from its first
    8 bytes (length, API key and version). SASL requests: Kafka's 512 KiB."""
    decoded = min(limits.max_decoded_request_bytes, limits.max_request_bytes)
    if api_key in SASL_APIS:
        return min(decoded, MAX_SASL_REQUEST_BYTES)
    if carries_opaque(api_key, api_version):
        return limits.max_request_bytes
    return decoded


@functools.cache
def carries_opaque(api_key: int, api_version: int) -> bool:
    """Whether requests of this API version have a bytes or records field (at any depth)."""
    if api_key == PRODUCE and api_version < FIRST_KIO_PRODUCE_VERSION:
        return False  # refused whatever it holds
    try:
        schema = load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        return False  # refused once read
    return _has_opaque(schema)


def _has_opaque(cls: type[Any]) -> bool:
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if isinstance(kind, (EntityField, EntityTupleField)):
            if _has_opaque(kind.type_):
                return True
        elif field.metadata.get("kafka_type") in OPAQUE_TYPES:
            return True
    return False
