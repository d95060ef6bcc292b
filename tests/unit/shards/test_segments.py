"""A partition's entry list: chunks and segments, compaction replacing runs of chunks, reloads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.metadata.records import SegmentRecord
from kafscale.shards.segments import CommittedSegments

WAL = "ns/!wal/0/00000000000000ab/{:010d}.wal"


def chunk(base: int, last: int, max_ts: int, seq: int = 0) -> SegmentRecord:
    return SegmentRecord(base, last, 10, 0, last - base + 1, max_ts, 0, WAL.format(seq), 32)


def segment_over(entries: list[SegmentRecord]) -> SegmentRecord:
    """The segment a compaction of ``entries`` (consecutive) commits."""
    first, last = entries[0], entries[-1]
    top = max(e.max_timestamp for e in entries)
    return SegmentRecord(first.base_offset, last.last_offset, 99, 16, 0, top, first.created_ms)


def test_compaction_replaces_the_chunks_it_covers() -> None:
    chunks = [chunk(0, 4, 50, 0), chunk(5, 9, 40, 1), chunk(10, 14, 70, 2), chunk(15, 19, 60, 3)]
    found = CommittedSegments(chunks)
    segment = segment_over(chunks[1:3])
    assert found.compacted(segment) == chunks[1:3]
    assert list(found) == [chunks[0], segment, chunks[3]]
    assert found.find(7) == segment and found.find(14) == segment and found.find(15) == chunks[3]
    assert found.first_reaching(60) == segment and found.max_timestamp() == segment
    assert found.following(chunks[0], 5) == [segment, chunks[3]]
    assert found.compacted(segment) == []  # told twice: nothing more to do
    assert list(found) == [chunks[0], segment, chunks[3]]


def test_a_chunk_committed_again_after_its_compaction_is_ignored() -> None:
    chunks = [chunk(0, 4, 1), chunk(5, 9, 2), chunk(10, 14, 3)]
    found = CommittedSegments(chunks)
    segment = segment_over(chunks)
    found.compacted(segment)
    found.add(chunks[2])  # a retried commit's answer, after the compaction
    found.add(chunks[1])
    assert list(found) == [segment]
    later = chunk(15, 19, 4)
    found.add(later)
    assert list(found) == [segment, later]


def test_a_compaction_that_does_not_match_the_list_changes_nothing() -> None:
    chunks = [chunk(10, 14, 1), chunk(15, 19, 2)]
    found = CommittedSegments(chunks)
    straddling = SegmentRecord(12, 19, 99, 16, 8, 2, 0)  # not at an entry boundary
    assert found.compacted(straddling) == []
    assert found.compacted(SegmentRecord(10, 17, 99, 16, 8, 2, 0)) == []
    retired = SegmentRecord(0, 9, 99, 16, 10, 2, 0)  # before the log start: retention's
    assert found.compacted(retired) == []
    assert list(found) == chunks


def test_a_compaction_heard_before_its_chunks_commits_is_kept() -> None:
    found = CommittedSegments([chunk(0, 4, 1)])
    ahead = SegmentRecord(5, 14, 99, 16, 10, 9, 0)
    assert found.compacted(ahead) == []
    assert list(found) == [chunk(0, 4, 1), ahead]
    found.add(chunk(5, 9, 2))  # the chunks' commit answers come later: already covered
    assert list(found) == [chunk(0, 4, 1), ahead]


def test_a_reload_takes_the_store_up_to_the_high_watermark_and_keeps_later_entries() -> None:
    stale = [chunk(0, 4, 1, 0), chunk(5, 9, 2, 1), chunk(10, 14, 3, 2)]
    found = CommittedSegments(stale)
    found.add(chunk(15, 19, 4, 3))  # committed while the reload read the store
    segment = segment_over(stale[:2])
    # the store lists the compacted segment, and an entry the shard has not seen committed
    found.reloaded([stale[2], segment, chunk(20, 24, 5, 4)], high_watermark=20)
    assert list(found) == [segment, stale[2], chunk(15, 19, 4, 3)]
    assert found.find(3) == segment and found.max_timestamp() == chunk(15, 19, 4, 3)


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 1000)), min_size=1, max_size=30),
    st.data(),
)
def test_lookups_stay_right_across_compactions(
    sizes: list[tuple[int, int]], data: st.DataObject
) -> None:
    entries, base = [], 0
    for seq, (count, max_ts) in enumerate(sizes):
        entries.append(chunk(base, base + count - 1, max_ts, seq))
        base += count
    found = CommittedSegments(entries)
    for _ in range(data.draw(st.integers(0, 4))):
        current = list(found)
        i = data.draw(st.integers(0, len(current) - 1))
        j = data.draw(st.integers(i + 1, len(current)))
        segment = segment_over(current[i:j])
        assert found.compacted(segment) == (current[i:j] if current[i:j] != [segment] else [])
        current[i:j] = [segment]
        assert list(found) == current
    current = list(found)
    for offset in range(base):
        holder = found.find(offset)
        assert holder is not None and holder.base_offset <= offset <= holder.last_offset
    assert found.find(base) is None
    for timestamp in range(0, 1002, 37):
        expected = next((e for e in current if e.max_timestamp >= timestamp), None)
        assert found.first_reaching(timestamp) == expected
