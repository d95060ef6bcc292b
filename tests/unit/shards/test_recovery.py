"""Adopting uploaded but uncommitted segments (``kafscale.shards.recovery``) when what was
uploaded is bad: a segment that does not verify is removed and the partition loads; a segment
that verifies but holds a batch whose records do not decode (no broker validated it) is adopted,
since its bytes are whole and every read path contains such a batch; nothing raises."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import crc32c

from kafscale.ipc import messages, write_path
from kafscale.protocol import records
from kafscale.protocol.compression import Codec
from kafscale.shards.producers import ProducerStates
from kafscale.shards.recovery import adopt_uncommitted
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from tests.unit.protocol import poison

NS, TOPIC, TOPIC_ID = "ns", "events", "00000000-0000-0000-0000-000000000007"
T0 = 1_700_000_000_000


@dataclass
class Reply:
    message: messages.Message


@dataclass
class Coordinator:
    """Stands in for the coordinator: commits every segment it is asked to."""

    committed: list[write_path.CommitSegment] = field(default_factory=list)

    def call(self, request: write_path.CommitSegment, timeout_ms: int = 0) -> Reply:
        self.committed.append(request)
        return Reply(write_path.SegmentCommitted(True, request.segment.last_offset + 1))


def _at(blob: bytes, base_offset: int) -> bytes:
    placed = bytearray(blob)
    records.patch_base_offset(placed, 0, base_offset)
    return bytes(placed)


def _upload(store: LocalObjectStore, base: int, kfs: bytes) -> str:
    key = segments.segment_key(NS, TOPIC, 0, base)
    store.put_if_absent(key, kfs)
    return key


def _adopt(store: LocalObjectStore, coordinator: Any, high_watermark: int = 0) -> int:
    return adopt_uncommitted(
        store, coordinator, NS, TOPIC, TOPIC_ID, 0, high_watermark, ProducerStates()
    )


def test_a_segment_holding_a_poison_batch_is_adopted(tmp_path: Any) -> None:
    store = LocalObjectStore(str(tmp_path))
    good = records.build_batch([(None, b"ok", (), T0)])
    lie = poison.batch(poison.record(0) + poison.record(1), count=2, codec=Codec.SNAPPY)
    kfs, _ = segments.build_segment([good, _at(lie, 1)], 0, T0)
    _upload(store, 0, kfs)
    coordinator = Coordinator()
    assert _adopt(store, coordinator) == 3
    [commit] = coordinator.committed
    assert (commit.segment.base_offset, commit.segment.last_offset) == (0, 2)


def test_segments_that_do_not_verify_are_removed_and_the_partition_loads(tmp_path: Any) -> None:
    store = LocalObjectStore(str(tmp_path))
    good = records.build_batch([(None, b"ok", (), T0)])
    kfs, _ = segments.build_segment([good], 0, T0)
    damaged = bytearray(kfs)
    damaged[segments.HEADER_SIZE + 70] ^= 0xFF  # a record byte: the batch CRC fails
    backwards = bytearray(kfs)  # a batch length pointing backwards, its CRC "right"
    struct.pack_into(">i", backwards, segments.HEADER_SIZE + 8, -100)
    struct.pack_into(">I", backwards, segments.HEADER_SIZE + 17, crc32c.crc32c(b""))
    for blob in (bytes(damaged), kfs[:-5], bytes(backwards), b"KAFS"):
        key = _upload(store, 0, blob)
        coordinator = Coordinator()
        assert _adopt(store, coordinator) == 0
        assert coordinator.committed == []
        assert not store.list(segments.segment_prefix(NS, TOPIC, 0)), key  # removed
