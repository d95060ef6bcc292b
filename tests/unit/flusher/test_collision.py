"""A segment key that already holds other bytes: the metadata record decides, never a timestamp
alone. A committed object is never deleted or rewritten."""

from __future__ import annotations

import pytest

from kafscale.flusher import collision
from kafscale.flusher.collision import Verdict
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol.records import build_batch
from kafscale.storage import segment as segments

TOPIC_CREATED_MS = 1_700_000_000_000
TOPIC_ID = "6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c"


def segment(values: list[bytes], sealed_ms: int, base_offset: int = 0) -> tuple[bytes, bytes]:
    batches = [
        build_batch([(None, value, (), TOPIC_CREATED_MS + i)], base_offset=base_offset + i)
        for i, value in enumerate(values)
    ]
    return segments.build_segment(batches, flags=0, created_ms=sealed_ms)


def record_of(kfs: bytes, index: bytes) -> SegmentRecord:
    parsed = segments.parse_segment(kfs)
    return SegmentRecord(
        base_offset=parsed.base_offset,
        last_offset=parsed.last_offset,
        size=len(kfs),
        index_size=len(index),
        records=parsed.record_count,
        max_timestamp=0,
        created_ms=parsed.created_ms,
    )


OURS, OURS_INDEX = segment([b"a", b"b"], sealed_ms=TOPIC_CREATED_MS + 5000)


# --- the pure judgement --------------------------------------------------------------------------


def test_identical_bytes_are_ours_committed_or_not() -> None:
    for committed in (None, record_of(OURS, OURS_INDEX)):
        assert (
            collision.judge_segment(OURS, OURS, committed, TOPIC_CREATED_MS).verdict is Verdict.OURS
        )


def test_the_same_records_sealed_at_another_time_are_ours() -> None:
    resealed, _ = segment([b"a", b"b"], sealed_ms=TOPIC_CREATED_MS + 9000)
    assert resealed != OURS
    for committed in (None, record_of(resealed, OURS_INDEX)):
        judged = collision.judge_segment(resealed, OURS, committed, TOPIC_CREATED_MS)
        assert judged.verdict is Verdict.OURS, judged


def test_a_committed_segment_with_other_records_is_a_conflict_even_if_sealed_earlier() -> None:
    # What the old timestamp rule got wrong: an older seal time does not make it a leftover.
    theirs, their_index = segment([b"x", b"y"], sealed_ms=TOPIC_CREATED_MS - 1)
    judged = collision.judge_segment(theirs, OURS, record_of(theirs, their_index), TOPIC_CREATED_MS)
    assert judged.verdict is Verdict.CONFLICT
    assert "committed" in judged.reason


def test_an_uncommitted_segment_of_this_topic_is_left_alone() -> None:
    # Another writer's upload whose commit may still be on its way.
    theirs, _ = segment([b"x", b"y"], sealed_ms=TOPIC_CREATED_MS + 1000)
    judged = collision.judge_segment(theirs, OURS, None, TOPIC_CREATED_MS)
    assert judged.verdict is Verdict.CONFLICT
    assert "no record references" in judged.reason


def test_an_unreferenced_segment_sealed_before_the_topic_was_created_is_replaced() -> None:
    leftover, _ = segment([b"x"], sealed_ms=TOPIC_CREATED_MS - 1)
    judged = collision.judge_segment(leftover, OURS, None, TOPIC_CREATED_MS)
    assert judged.verdict is Verdict.REPLACE
    assert "deleted topic" in judged.reason


def test_without_the_topics_creation_time_nothing_is_replaced() -> None:
    leftover, _ = segment([b"x"], sealed_ms=TOPIC_CREATED_MS - 1)
    assert collision.judge_segment(leftover, OURS, None, 0).verdict is Verdict.CONFLICT


@pytest.mark.parametrize("committed", [False, True])
def test_an_object_that_does_not_parse_is_never_replaced(committed: bool) -> None:
    record = record_of(OURS, OURS_INDEX) if committed else None
    broken = OURS[:-1] + b"?"
    assert (
        collision.judge_segment(broken, OURS, record, TOPIC_CREATED_MS).verdict is Verdict.CONFLICT
    )


def test_a_committed_index_is_never_replaced() -> None:
    assert collision.may_replace_index(None)
    assert not collision.may_replace_index(record_of(OURS, OURS_INDEX))
