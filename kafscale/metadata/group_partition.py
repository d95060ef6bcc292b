"""Which ``__consumer_offsets`` partition a consumer group belongs to: Kafka's own formula, so
every broker (and every Kafka tool) agrees on it.

Kafka's ``GroupCoordinator.partitionFor``: ``Utils.abs(groupId.hashCode) % partitions``, where
``hashCode`` is Java's ``String.hashCode`` (over UTF-16 code units, 32-bit wrapping arithmetic)
and ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0 (``Math.abs`` would leave it negative). The
owner of that partition coordinates the group (docs/design/scale-out.md, section 7). Shared by
the frontend (FindCoordinator) and the coordinator (which groups it serves); pure, no I/O.
"""

from __future__ import annotations

INT_MIN = -(2**31)


def java_string_hashcode(text: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as a
    signed 32-bit int."""
    data = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for index in range(0, len(data), 2):
        value = (value * 31 + (data[index] << 8 | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def kafka_abs(value: int) -> int:
    """Kafka's ``Utils.abs``: ``Integer.MIN_VALUE`` becomes 0, not itself."""
    return 0 if value == INT_MIN else abs(value)


def group_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of ``group_id`` when the topic has ``partitions``."""
    if partitions <= 0:
        raise ValueError(f"__consumer_offsets has no partitions ({partitions})")
    return kafka_abs(java_string_hashcode(group_id)) % partitions
