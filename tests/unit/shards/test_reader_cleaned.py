"""The shard's read path over segments the log cleaner rewrote: offsets with gaps (before the
first batch, between batches, after the last) and segments left with no batch at all. A fetch at
an offset whose batch is gone is answered from the next batch there is, in this entry or the
ones after it, cold (ranged reads) and cached alike; nothing past the high watermark is shown."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards import reads
from kafscale.shards.cache import entry_key
from kafscale.shards.reads import SegmentRef
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from tests.unit.shards.test_reader import T0, TOPIC, Rig
from tests.unit.shards.test_reader_chunks import with_metadata


def batch(base: int, count: int) -> bytes:
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
        (f"k{base + i}".encode(), f"v{base + i}".encode(), [], T0 + base + i) for i in range(count)
    ]
    return records.build_batch(rows, base_offset=base)


class CleanedLog:
    """Offsets 0..59 in three segments: 0..19 cleaned (batches 3..4 and 10..12 left), 20..39
    cleaned empty, 40..59 never cleaned (four batches of 5)."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.namespace = rig.config.s3_namespace
        first = self.put([batch(3, 2), batch(10, 3)], (0, 19), generation=1)
        empty = self.put([], (20, 39), generation=1)
        last = self.put([batch(base, 5) for base in range(40, 60, 5)], None, generation=0)
        self.entries = [first, empty, last]
        rig.partition = rig.new_partition(CommittedSegments(self.entries), hw=60)

    def put(
        self, batches: list[bytes], covers: tuple[int, int] | None, generation: int
    ) -> SegmentRecord:
        flags = segments.FLAG_CLEANED if covers is not None else 0
        kfs, index = segments.build_segment(batches, flags, T0, index_interval=1, covers=covers)
        parsed = segments.parse_segment(kfs)
        base, last = parsed.base_offset, parsed.last_offset
        for key, blob in (
            (segments.segment_key(self.namespace, TOPIC, 0, base, generation), kfs),
            (segments.index_key(self.namespace, TOPIC, 0, base, generation), index),
        ):
            self.rig.store.put_if_absent(key, blob)
        stamps = [records.read_header(b).max_timestamp for b in batches]
        return SegmentRecord(
            base, last, len(kfs), len(index), parsed.record_count, max(stamps, default=-1), T0,
            generation=generation,
        )  # fmt: skip

    def fetch(self, offset: int, max_bytes: int = 1 << 20) -> tuple[Any, list[int]]:
        self.rig.fetch(offset, max_bytes=max_bytes)
        self.rig.wait_for(lambda: bool(self.rig.replies.sent))
        [(result, values)] = self.rig.answers()
        return result, [offset for offset, _ in values]


@pytest.fixture
def log(tmp_path: Any) -> Iterator[CleanedLog]:
    rig = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="0")
    made = CleanedLog(rig)
    yield made
    rig.close()


def test_a_fetch_in_a_gap_gets_the_next_batch_of_the_segment(log: CleanedLog) -> None:
    result, offsets = log.fetch(0)
    assert result.error_code == ErrorCode.none and result.high_watermark == 60
    assert offsets[:5] == [3, 4, 10, 11, 12]
    _, offsets = log.fetch(5)
    assert offsets[:3] == [10, 11, 12]
    _, offsets = log.fetch(11)  # inside a batch that is there: the whole batch, as ever
    assert offsets[:3] == [10, 11, 12]


def test_a_fetch_past_a_segments_last_batch_goes_on_to_the_next_entry_with_one(
    log: CleanedLog,
) -> None:
    # 13..19 cleaned away, 20..39 an empty segment: the answer starts at 40.
    for offset in (13, 19, 20, 39):
        result, offsets = log.fetch(offset, max_bytes=1)
        assert result.error_code == ErrorCode.none, offset
        assert offsets == [40, 41, 42, 43, 44], offset


def test_a_cached_cleaned_segment_is_passed_without_reading_again(log: CleanedLog) -> None:
    rig = log.rig
    first, empty, _ = log.entries
    for entry in (first, empty):  # as read-ahead leaves them: whole, in L1
        ref = SegmentRef.of(log.namespace, TOPIC, 0, entry)
        rig.reader.cache.store(entry_key(rig.partition, entry), reads.read_segment(rig.store, ref))
    assert rig.reader.cache.passed(entry_key(rig.partition, first), 13)
    assert not rig.reader.cache.passed(entry_key(rig.partition, first), 12)
    assert rig.reader.cache.passed(entry_key(rig.partition, empty), 20)
    before = len(rig.store.keys)
    result, offsets = log.fetch(15, max_bytes=1)
    assert result.error_code == ErrorCode.none
    assert offsets == [40, 41, 42, 43, 44]
    read = rig.store.keys[before:]
    assert read and all(".g1." not in key for key in read)  # only the uncleaned segment


def test_nothing_past_the_high_watermark_is_shown(tmp_path: Any) -> None:
    rig = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="0")
    log = CleanedLog(rig)
    # Only the two cleaned segments are committed: a fetch past the last batch has nothing yet.
    rig.partition = rig.new_partition(CommittedSegments(log.entries[:2]), hw=40)
    try:
        rig.fetch(13, wait_ms=0)
        rig.wait_for(lambda: bool(rig.replies.sent))
        [(result, values)] = rig.answers()
        assert result.error_code == ErrorCode.none and result.high_watermark == 40
        assert values == []
    finally:
        rig.close()


def test_ranged_reads_of_a_cleaned_segment(log: CleanedLog) -> None:
    first, empty, _ = log.entries
    ref = SegmentRef.of(log.namespace, TOPIC, 0, first)
    assert ref.key.endswith(".g1.kfs")
    index = reads.read_index(log.rig.store, ref)
    for offset, expected in ((0, 3), (4, 3), (6, 10), (12, 10)):
        chunk = reads.read_range(log.rig.store, ref, index, offset, 1)
        assert chunk is not None
        assert records.read_header(chunk.batches_from(offset, 1)).base_offset == expected
    assert reads.read_range(log.rig.store, ref, index, 13, 1) is None
    assert reads.read_range(log.rig.store, ref, None, 19, 1) is None
    empty_ref = SegmentRef.of(log.namespace, TOPIC, 0, empty)
    assert reads.read_range(log.rig.store, empty_ref, None, 20, 1) is None
    whole = reads.read_segment(log.rig.store, empty_ref)
    assert whole.complete and whole.starts == () and not whole.holds(20)


def test_a_cleaned_away_segment_found_gone_reloads_the_entries(
    log: CleanedLog, tmp_path: Any
) -> None:
    # The shard missed the SegmentsCleaned notice: its list still names the segment the
    # cleaner replaced, whose objects the grace has since deleted.
    rig = log.rig
    _, _, last = log.entries
    cleaned = log.put([batch(12, 1)], (0, 39), generation=2)
    with_metadata(rig, tmp_path, [cleaned, last])
    rig.store.delete(segments.segment_key(log.namespace, TOPIC, 0, 0, 1))
    rig.store.delete(segments.index_key(log.namespace, TOPIC, 0, 0, 1))
    result, offsets = log.fetch(3)
    assert result.error_code == ErrorCode.none
    assert offsets == [12]
    assert list(rig.partition.segments) == [cleaned, last]


def test_an_entry_gone_below_a_log_start_moved_meanwhile_is_out_of_range(
    log: CleanedLog, tmp_path: Any
) -> None:
    rig = log.rig
    with_metadata(rig, tmp_path, [log.entries[2]])
    rig.store.delete(segments.segment_key(log.namespace, TOPIC, 0, 0, 1))
    rig.store.delete(segments.index_key(log.namespace, TOPIC, 0, 0, 1))
    rig.fetch(3)  # planned at log start 0; its read finds the segment gone
    rig.partition.log_start_offset = 40  # retention deleted 0..39 meanwhile
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, values)] = rig.answers()
    assert result.error_code == ErrorCode.offset_out_of_range and values == []
