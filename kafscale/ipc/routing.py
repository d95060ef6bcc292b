"""Which shard owns a partition: a stable hash of (topic id, partition), shared by every process.

Stable across restarts and processes (CRC32C of the topic id's bytes and the partition number,
never Python's salted ``hash``), so the frontend and the shards agree without asking each other.
"""

from __future__ import annotations

import struct
import uuid

import crc32c


def shard_for(topic_id: str, partition: int, shards: int) -> int:
    key = uuid.UUID(topic_id).bytes + struct.pack(">i", partition)
    return int(crc32c.crc32c(key)) % shards
