"""Building one cycle's write-ahead object from sealed shared-memory buffers, and uploading it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kafscale.flusher import objects
from kafscale.flusher.objects import EntryUnreadable, KeyTaken
from kafscale.ipc.shm import PartitionBuffer, segment_name, sweep_segments
from kafscale.ipc.write_path import WalEntry
from kafscale.protocol.compression import Codec
from kafscale.protocol.records import build_batch, read_header
from kafscale.storage import wal
from kafscale.storage.local import LocalObjectStore

TOPIC_ID = "6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c"
SEALED_MS = 1_700_000_000_000
KEY = wal.object_key("ns", 1, "0123456789abcdef", 7)


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = uuid.uuid4().hex[:12]
    yield rid
    sweep_segments(rid)


def batches(base_offset: int, counts: list[int], codec: int = Codec.NONE) -> list[bytes]:
    out = []
    for count in counts:
        rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
        rows = [(None, b"v" * 50, [], SEALED_MS + i) for i in range(count)]
        out.append(build_batch(rows, base_offset=base_offset, codec=codec))
        base_offset += count
    return out


class Buffers:
    """Sealed partition buffers a shard would hand to a cycle."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.owned: list[PartitionBuffer] = []

    def entry(
        self, topic: str, partition: int, base: int, data: list[bytes], **kw: int
    ) -> WalEntry:
        buffer = PartitionBuffer.create(
            segment_name(self.run_id, 0, len(self.owned)), 1 << 16, base
        )
        self.owned.append(buffer)
        for batch in data:
            buffer.append(batch)
        buffer.seal(sealed_ms=SEALED_MS, codec=Codec.SNAPPY)
        records = sum(read_header(b).records_count for b in data)
        fields = {
            "buffer": buffer.name,
            "generation": buffer.generation,
            "size": sum(map(len, data)),
            "topic": topic,
            "topic_id": TOPIC_ID,
            "partition": partition,
            "base_offset": base,
            "last_offset": base + records - 1,
            "records": records,
            "max_timestamp": SEALED_MS + 9,
            "created_ms": SEALED_MS + partition,
            "codec": int(Codec.SNAPPY),
            "producers": {},
        }
        fields.update(kw)
        return WalEntry(**fields)  # type: ignore[arg-type]

    def close(self) -> None:
        for buffer in self.owned:
            buffer.destroy()


@pytest.fixture
def buffers(run_id: str) -> Iterator[Buffers]:
    made = Buffers(run_id)
    yield made
    made.close()


def test_an_object_holds_every_entry_sorted_compressed_and_each_record_points_at_its_chunk(
    buffers: Buffers,
) -> None:
    entries = [
        buffers.entry("b", 0, 0, batches(0, [3, 2])),
        buffers.entry("a", 1, 10, batches(10, [4])),
        buffers.entry("a", 0, 5, batches(5, [1], codec=Codec.LZ4)),  # already compressed
    ]
    built = objects.build(KEY, SEALED_MS + 100, entries)
    assert built.failures == {}
    assert [c.index for c in built.chunks] == [2, 1, 0]  # (topic, partition, base) order
    parsed = wal.parse_object(built.data)  # verifies every CRC and the framing
    assert parsed.header.created_ms == SEALED_MS + 100
    for chunk, placed, view in zip(built.chunks, parsed.entries, parsed.chunks, strict=True):
        record = chunk.record
        assert (placed.topic, placed.partition, placed.base_offset) == (
            chunk.entry.topic,
            chunk.entry.partition,
            record.base_offset,
        )
        assert record.object == KEY and record.index_size == 0 and record.is_chunk
        assert (record.position, record.size) == (placed.position, placed.size)
        assert record.created_ms == chunk.entry.created_ms and record.codec == Codec.SNAPPY
        assert (record.last_offset, record.records) == (
            chunk.entry.last_offset,
            chunk.entry.records,
        )
        assert bytes(chunk.data) == bytes(view) == built.data[record.position :][: record.size]
    codecs = [read_header(b).codec for b in objects.split_batches(built.chunks[2].data)]
    assert codecs == [Codec.SNAPPY, Codec.SNAPPY]  # arrived uncompressed
    assert read_header(built.chunks[0].data).codec == Codec.LZ4  # kept as it came


def test_building_is_deterministic(buffers: Buffers) -> None:
    entries = [buffers.entry("t", 0, 0, batches(0, [2])), buffers.entry("t", 1, 0, batches(0, [1]))]
    assert objects.build(KEY, 5, entries).data == objects.build(KEY, 5, entries).data


def test_a_reused_buffer_fails_its_entry_not_the_object(buffers: Buffers) -> None:
    stale = buffers.entry("t", 0, 0, batches(0, [2]))
    kept = buffers.entry("t", 1, 0, batches(0, [3]))
    buffers.owned[0].reset(2)  # the shard moved on: a new generation
    built = objects.build(KEY, 0, [stale, kept])
    assert list(built.failures) == [0] and "reused" in built.failures[0]
    assert [c.index for c in built.chunks] == [1]
    assert wal.parse_object(built.data).entries[0].partition == 1


def test_a_buffer_that_is_gone_fails_its_entry(buffers: Buffers) -> None:
    gone = buffers.entry("t", 0, 0, batches(0, [2]))
    gone = msgspec.structs.replace(gone, buffer=segment_name(buffers.run_id, 9, 9))
    built = objects.build(KEY, 0, [gone])
    assert list(built.failures) == [0] and "cannot be attached" in built.failures[0]
    assert built.chunks == [] and built.data == b""


def test_an_entry_that_disagrees_with_its_batches_is_left_out(buffers: Buffers) -> None:
    wrong = buffers.entry("t", 0, 0, batches(0, [2]), records=7)
    right = buffers.entry("t", 1, 0, batches(0, [2]))
    built = objects.build(KEY, 0, [wrong, right])
    assert list(built.failures) == [0]
    assert [c.index for c in built.chunks] == [1]


def test_an_entry_whose_bytes_do_not_frame_is_unreadable() -> None:
    data = batches(0, [2])[0]
    with pytest.raises(EntryUnreadable):
        objects.split_batches(data[:-1])
    with pytest.raises(EntryUnreadable):
        objects.split_batches(data + b"\0" * 10)
    assert [bytes(b) for b in objects.split_batches(data * 2)] == [data, data]


def test_upload_puts_once_and_takes_our_own_bytes_as_success(
    buffers: Buffers, tmp_path: Path
) -> None:
    store = LocalObjectStore(str(tmp_path))
    built = objects.build(KEY, 0, [buffers.entry("t", 0, 0, batches(0, [2]))])
    objects.upload(store, built)
    objects.upload(store, built)  # a retry after a lost answer
    assert store.get(KEY) == built.data
    other = objects.build(KEY, 1, [buffers.entry("t", 0, 0, batches(0, [2]))])
    with pytest.raises(KeyTaken):
        objects.upload(store, other)
    assert store.get(KEY) == built.data
