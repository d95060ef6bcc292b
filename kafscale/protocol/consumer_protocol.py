"""The consumer's embedded protocol: the bytes a classic consumer puts in JoinGroup's protocol
metadata (``ConsumerProtocolSubscription``) and the leader in SyncGroup's assignments
(``ConsumerProtocolAssignment``), as Kafka's ``ConsumerProtocol`` reads and writes them: an int16
version, then the fields of that version (kio's schemas, v0-v3). A version above 3 is read as 3,
its extra fields ignored, as Kafka's generated readers do. Pure.

The broker reads them to know what a classic group's members subscribe to (OffsetDelete refuses
their topics while the group is active) and, for KIP-848's online migration, what each member
owns and was assigned.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_assignment.v1 import data as assignment_v1
from kio.schema.consumer_protocol_assignment.v2 import data as assignment_v2
from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i32

from kafscale.protocol.errors import DecodeError

PROTOCOL_TYPE = "consumer"  # JoinGroup's protocol type of Kafka's consumers

_SUBSCRIPTIONS: tuple[type[Any], ...] = (
    subscription_v0.ConsumerProtocolSubscription,
    subscription_v1.ConsumerProtocolSubscription,
    subscription_v2.ConsumerProtocolSubscription,
    subscription_v3.ConsumerProtocolSubscription,
)
_ASSIGNMENTS: tuple[type[Any], ...] = (
    assignment_v0.ConsumerProtocolAssignment,
    assignment_v1.ConsumerProtocolAssignment,
    assignment_v2.ConsumerProtocolAssignment,
    assignment_v3.ConsumerProtocolAssignment,
)
_VERSION = struct.Struct(">h")

Partitions = dict[str, tuple[int, ...]]  # topic name -> partitions


class UndecodableProtocol(DecodeError):
    """Embedded consumer-protocol bytes that are not a subscription or an assignment."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned: Partitions = field(default_factory=dict)  # v1+
    generation: int = -1  # v2+
    rack: str | None = None  # v3+


@dataclass(frozen=True)
class Assignment:
    partitions: Partitions
    user_data: bytes | None = None


def _read(schemas: tuple[type[Any], ...], data: bytes) -> tuple[int, Any]:
    try:
        (version,) = _VERSION.unpack_from(data, 0)
    except struct.error:
        raise UndecodableProtocol("no version") from None
    if version < 0:
        raise UndecodableProtocol(f"version {version}")
    schema = schemas[min(version, len(schemas) - 1)]
    try:
        value, _ = entity_reader(schema)(memoryview(data), _VERSION.size)
    except (SerialError, ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise UndecodableProtocol(f"v{version}: {exc}") from None
    return version, value


def _partitions(entries: Any) -> Partitions:
    merged: dict[str, list[int]] = {}
    for entry in entries:
        merged.setdefault(str(entry.topic), []).extend(int(p) for p in entry.partitions)
    return {topic: tuple(partitions) for topic, partitions in merged.items()}


def decode_subscription(data: bytes) -> Subscription:
    version, value = _read(_SUBSCRIPTIONS, data)
    return Subscription(
        tuple(value.topics),
        value.user_data,
        _partitions(value.owned_partitions) if version >= 1 else {},
        int(value.generation_id) if version >= 2 else -1,
        value.rack_id if version >= 3 else None,
    )


def decode_assignment(data: bytes) -> Assignment:
    """An empty SyncGroup assignment (a member the leader gave nothing) is no partitions."""
    if not data:
        return Assignment({})
    _, value = _read(_ASSIGNMENTS, data)
    return Assignment(_partitions(value.assigned_partitions), value.user_data)


def encode_assignment(partitions: Partitions, version: int = 0) -> bytes:
    """``partitions`` as a ConsumerProtocolAssignment of ``version`` (0-3: the fields are the
    same; a consumer reads any version up to the one it speaks)."""
    schema = _ASSIGNMENTS[version]
    module = (assignment_v0, assignment_v1, assignment_v2, assignment_v3)[version]
    value = schema(
        assigned_partitions=tuple(
            module.TopicPartition(topic=topic, partitions=tuple(i32(p) for p in sorted(parts)))
            for topic, parts in sorted(partitions.items())
        ),
        user_data=None,
    )
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(version))
    entity_writer(schema)(buffer, value)
    return buffer.getvalue()
