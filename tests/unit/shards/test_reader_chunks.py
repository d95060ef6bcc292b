"""The shard's read path over chunks of write-ahead objects: fetched with ranged GETs, cached
apart from segments, moved in the cache when compacted, and looked up again in the metadata
store when a chunk's object is gone (compacted and collected since the list was loaded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale.metadata.records import Keys, SegmentRecord, encode
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.cache import chunk_of, entry_key
from kafscale.shards.reader import ReadPath
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from tests.unit.shards.test_reader import T0, TOPIC, Rig

WAL = "default/!wal/0/00000000000000ab/0000000001.wal"


def batch(base: int, count: int) -> bytes:
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
        (None, f"v{base + i}".encode(), [], T0 + base + i) for i in range(count)
    ]
    return records.build_batch(rows, base_offset=base)


class Log:
    """Three chunks of 10 records (2 batches each) in one object, committed."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.namespace = rig.config.s3_namespace
        self.batches = [batch(base, 5) for base in range(0, 30, 5)]
        position, body, self.chunks = 64, b"", []
        for i in range(3):
            data = self.batches[2 * i] + self.batches[2 * i + 1]
            base = 10 * i
            self.chunks.append(
                SegmentRecord(
                    base, base + 9, len(data), 0, 10, T0 + base + 9, T0, WAL, position + len(body)
                )
            )
            body += data
        rig.store.put_if_absent(WAL, b"h" * position + body + b"f" * 16)
        rig.partition = rig.new_partition(CommittedSegments(self.chunks), hw=30)

    def compact(self, first: int, stop: int) -> SegmentRecord:
        """Write the spec segment of chunks [first, stop) as the compactor does."""
        kfs, index = segments.build_segment(self.batches[2 * first : 2 * stop], 0, T0)
        base, last = self.chunks[first].base_offset, self.chunks[stop - 1].last_offset
        for key, blob in (
            (segments.segment_key(self.namespace, TOPIC, 0, base), kfs),
            (segments.index_key(self.namespace, TOPIC, 0, base), index),
        ):
            self.rig.store.put_if_absent(key, blob)
        return SegmentRecord(base, last, len(kfs), len(index), last - base + 1, T0 + last, T0)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="0")  # every GET is the test's
    yield made
    made.close()


def with_metadata(rig: Rig, tmp_path: Path, entries: list[SegmentRecord]) -> SqliteMetadataStore:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    keys = Keys(rig.config.s3_namespace)
    for entry in entries:
        store.put(keys.segment(TOPIC, 0, entry.base_offset), encode(entry))
    rig.reader.close()
    replies: Any = rig.replies  # stands in for the shard's RpcServer
    rig.reader = ReadPath(
        rig.config, rig.store, replies, lambda *_: rig.partition, "0", rig.clock, store
    )
    return store


def fetched(rig: Rig, offset: int, max_bytes: int = 1) -> tuple[int, list[tuple[int, bytes]]]:
    rig.fetch(offset, max_bytes=max_bytes)
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, got)] = rig.answers()
    return result.error_code, got


def test_a_chunk_is_fetched_with_one_ranged_get_then_from_the_cache(rig: Rig) -> None:
    log = Log(rig)
    assert fetched(rig, 13) == (0, [(o, f"v{o}".encode()) for o in range(10, 15)])
    assert rig.store.gets == 1 and rig.store.bytes == log.chunks[1].size  # the chunk, no index
    assert fetched(rig, 10) == (0, [(o, f"v{o}".encode()) for o in range(10, 15)])
    assert rig.store.gets == 1


def test_a_committed_chunk_is_cached_apart_from_the_segment_replacing_it(rig: Rig) -> None:
    log = Log(rig)
    first = log.chunks[0]
    rig.reader.flushed(
        rig.partition, chunk_of(log.batches[0] + log.batches[1], complete=True), first
    )
    segment = log.compact(0, 2)
    assert rig.reader.cache.cached(entry_key(rig.partition, first), 0) is not None
    assert rig.reader.cache.cached(entry_key(rig.partition, segment), 0) is None
    rig.reader.compacted(rig.partition, segment)
    assert list(rig.partition.segments) == [segment, log.chunks[2]]
    # the chunk's cached batches serve the segment now: no GET
    assert fetched(rig, 7) == (0, [(o, f"v{o}".encode()) for o in range(5, 10)])
    assert rig.store.gets == 0
    # offsets of the second replaced chunk were not cached: a ranged read of the segment
    assert fetched(rig, 12) == (0, [(o, f"v{o}".encode()) for o in range(10, 15)])
    assert rig.store.gets >= 1


def test_a_chunk_found_gone_is_looked_up_again_and_read_from_its_segment(
    rig: Rig, tmp_path: Path
) -> None:
    log = Log(rig)
    segment = log.compact(0, 3)
    store = with_metadata(rig, tmp_path, [segment])
    rig.store.inner.delete(WAL)  # compacted and collected after the shard loaded its list
    assert fetched(rig, 21) == (0, [(o, f"v{o}".encode()) for o in range(20, 25)])
    assert list(rig.partition.segments) == [segment]
    answers = rig.list_offsets(T0 + 14)
    assert (answers[0].error_code, answers[0].offset) == (0, 14)
    store.close()


def test_a_timestamp_lookup_in_a_chunk_found_gone_is_looked_up_again(
    rig: Rig, tmp_path: Path
) -> None:
    log = Log(rig)
    segment = log.compact(1, 3)
    store = with_metadata(rig, tmp_path, [log.chunks[0], segment])
    rig.store.inner.delete(WAL)
    [answer] = rig.list_offsets(T0 + 17)
    assert (answer.error_code, answer.offset, answer.timestamp) == (0, 17, T0 + 17)
    assert list(rig.partition.segments) == [log.chunks[0], segment]
    store.close()


def test_a_chunk_that_stays_gone_fails_the_fetch_once_looked_up(rig: Rig, tmp_path: Path) -> None:
    log = Log(rig)
    store = with_metadata(rig, tmp_path, log.chunks)  # the store still lists the chunks
    rig.store.inner.delete(WAL)
    code, got = fetched(rig, 3)
    assert code == ErrorCode.kafka_storage_error and got == []
    [answer] = rig.list_offsets(T0 + 3)
    assert answer.error_code == ErrorCode.kafka_storage_error
    store.close()


def test_without_a_metadata_store_a_chunk_gone_is_a_storage_error(rig: Rig) -> None:
    Log(rig)
    rig.store.inner.delete(WAL)
    code, _ = fetched(rig, 3)
    assert code == ErrorCode.kafka_storage_error


def test_read_ahead_brings_the_following_chunks_whole(tmp_path: Path) -> None:
    rig = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="2")
    try:
        log = Log(rig)
        assert fetched(rig, 0)[0] == 0
        rig.wait_for(
            lambda: all(
                rig.reader.cache.holds_whole(entry_key(rig.partition, c)) for c in log.chunks[1:]
            )
        )
        gets = rig.store.gets
        assert fetched(rig, 25) == (0, [(o, f"v{o}".encode()) for o in range(25, 30)])
        assert rig.store.gets == gets
    finally:
        rig.close()


def test_read_ahead_skips_a_segment_whose_compacted_chunks_are_cached(tmp_path: Path) -> None:
    rig = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="2")
    try:
        log = Log(rig)
        for i, chunk in enumerate(log.chunks):  # the shard committed them: all cached
            data = log.batches[2 * i] + log.batches[2 * i + 1]
            rig.reader.flushed(rig.partition, chunk_of(data, complete=True), chunk)
        first = log.compact(0, 1)
        rest = log.compact(1, 3)
        rig.reader.compacted(rig.partition, first)
        rig.reader.compacted(rig.partition, rest)
        assert list(rig.partition.segments) == [first, rest]
        # serving the first segment reads ahead into the second, which its chunks cover
        assert fetched(rig, 0) == (0, [(o, f"v{o}".encode()) for o in range(5)])
        assert fetched(rig, 20, max_bytes=1 << 20) == (
            0,
            [(o, f"v{o}".encode()) for o in range(20, 30)],
        )
        assert rig.store.gets == 0
    finally:
        rig.close()
