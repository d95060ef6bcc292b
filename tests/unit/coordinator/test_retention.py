"""Which segments retention deletes (the pure part of ``kafscale.coordinator.retention``)."""

from __future__ import annotations

from kafscale.coordinator.retention import expired
from kafscale.metadata.records import SegmentRecord

NOW = 1_000_000


def seg(base: int, size: int, max_ts: int) -> SegmentRecord:
    return SegmentRecord(base, base + 9, size, 16, 10, max_ts, 0)


SEGMENTS = [seg(0, 100, NOW - 5000), seg(10, 100, NOW - 3000), seg(20, 100, NOW - 1000)]


def test_time_deletes_the_oldest_segments_whose_newest_record_is_too_old() -> None:
    assert expired(SEGMENTS, 2000, -1, NOW) == SEGMENTS[:2]
    assert expired(SEGMENTS, 10_000, -1, NOW) == []
    assert expired(SEGMENTS, 0, -1, NOW) == SEGMENTS  # everything may go, as in Kafka


def test_time_stops_at_the_first_segment_to_keep() -> None:
    out_of_order = [seg(0, 100, NOW), seg(10, 100, NOW - 9000)]
    assert expired(out_of_order, 2000, -1, NOW) == []


def test_size_keeps_the_partition_at_or_above_its_limit() -> None:
    assert expired(SEGMENTS, -1, 200, NOW) == SEGMENTS[:1]
    assert expired(SEGMENTS, -1, 150, NOW) == SEGMENTS[:1]
    assert expired(SEGMENTS, -1, 100, NOW) == SEGMENTS[:2]
    assert expired(SEGMENTS, -1, 300, NOW) == []


def test_no_limits_delete_nothing_and_either_limit_suffices() -> None:
    assert expired(SEGMENTS, -1, -1, NOW) == []
    assert expired(SEGMENTS, 4000, 250, NOW) == SEGMENTS[:1]
