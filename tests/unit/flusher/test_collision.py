"""A segment key that already holds other bytes: the metadata record decides, never a timestamp
alone. A committed object is never deleted or rewritten."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from kafscale import config as configuration
from kafscale.flusher import collision
from kafscale.flusher.collision import Verdict
from kafscale.flusher.process import Collision, Flusher
from kafscale.ipc import messages
from kafscale.metadata import records
from kafscale.metadata.records import Keys, SegmentRecord, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol.records import build_batch
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.supervisor.child import ChildContext

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


# --- the flusher's uploads, on the embedded backends ---------------------------------------------


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path)})
        self.ctx = ChildContext(
            config=config,
            role="flusher",
            index=0,
            runtime_dir=str(tmp_path),
            run_id="test",
            zmq_context=zmq.Context(),
        )
        self.objects = LocalObjectStore(str(tmp_path / "segments"))
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.keys = Keys(config.s3_namespace)
        self.flusher = Flusher(self.ctx, self.objects, self.store)
        self.store.put(
            self.keys.topic("t"),
            records.encode(
                TopicRecord(name="t", topic_id=TOPIC_ID, partitions=1, created_ms=TOPIC_CREATED_MS)
            ),
        )
        self.kfs_key = segments.segment_key(config.s3_namespace, "t", 0, 0)
        self.index_key = segments.index_key(config.s3_namespace, "t", 0, 0)

    def job(self, sealed_ms: int) -> messages.FlushSegment:
        return messages.FlushSegment(
            buffer="unused",
            generation=0,
            size=0,
            topic="t",
            topic_id=TOPIC_ID,
            partition=0,
            base_offset=0,
            last_offset=1,
            records=2,
            max_timestamp=0,
            created_ms=sealed_ms,
            codec=0,
            producers={},
            topic_created_ms=TOPIC_CREATED_MS,
        )

    def commit(self, kfs: bytes, index: bytes) -> None:
        self.store.put(self.keys.segment("t", 0, 0), records.encode(record_of(kfs, index)))

    def close(self) -> None:
        self.flusher.close()
        self.store.close()
        self.ctx.zmq_context.term()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    made = Setup(tmp_path)
    yield made
    made.close()


def test_a_committed_segment_sealed_earlier_is_never_rewritten(setup: Setup) -> None:
    theirs, their_index = segment([b"x", b"y"], sealed_ms=TOPIC_CREATED_MS + 1000)
    assert setup.objects.put_if_absent(setup.kfs_key, theirs)
    assert setup.objects.put_if_absent(setup.index_key, their_index)
    setup.commit(theirs, their_index)
    with pytest.raises(Collision, match="committed segment with other records"):
        setup.flusher._put_segment(setup.job(TOPIC_CREATED_MS + 5000), setup.kfs_key, OURS)
    job = setup.job(TOPIC_CREATED_MS + 5000)
    assert setup.flusher._settle_index(job, setup.index_key, OURS_INDEX) == len(their_index)
    assert setup.objects.get(setup.kfs_key) == theirs
    assert setup.objects.get(setup.index_key) == their_index


def test_a_committed_segment_of_the_same_records_is_success_as_it_is(setup: Setup) -> None:
    earlier, earlier_index = segment([b"a", b"b"], sealed_ms=TOPIC_CREATED_MS + 4000)
    assert setup.objects.put_if_absent(setup.kfs_key, earlier)
    setup.commit(earlier, earlier_index)
    created = setup.flusher._put_segment(setup.job(TOPIC_CREATED_MS + 5000), setup.kfs_key, OURS)
    assert created == TOPIC_CREATED_MS + 4000  # the record we commit describes what is stored
    assert setup.objects.get(setup.kfs_key) == earlier


def test_a_deleted_topics_leftover_is_replaced(setup: Setup) -> None:
    leftover, leftover_index = segment([b"old"], sealed_ms=TOPIC_CREATED_MS - 60_000)
    assert setup.objects.put_if_absent(setup.kfs_key, leftover)
    assert setup.objects.put_if_absent(setup.index_key, leftover_index)
    job = setup.job(TOPIC_CREATED_MS + 5000)
    assert setup.flusher._put_segment(job, setup.kfs_key, OURS) == TOPIC_CREATED_MS + 5000
    assert setup.flusher._settle_index(job, setup.index_key, OURS_INDEX) == len(OURS_INDEX)
    assert setup.objects.get(setup.kfs_key) == OURS
    assert setup.objects.get(setup.index_key) == OURS_INDEX


def test_a_leftover_of_a_topic_that_was_re_created_is_not_ours_to_judge(setup: Setup) -> None:
    leftover, _ = segment([b"old"], sealed_ms=TOPIC_CREATED_MS - 60_000)
    assert setup.objects.put_if_absent(setup.kfs_key, leftover)
    job = msgspec.structs.replace(setup.job(TOPIC_CREATED_MS + 5000), topic_id="another-id")
    with pytest.raises(Collision):
        setup.flusher._put_segment(job, setup.kfs_key, OURS)
    assert setup.objects.get(setup.kfs_key) == leftover


def test_a_flush_that_fails_unexpectedly_is_still_answered(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    # The job's buffer is not in shared memory (FileNotFoundError from shm_open): the worker must
    # still answer, or the shard waits out its flush timeout and the flusher's shutdown hangs.
    job = msgspec.structs.replace(setup.job(TOPIC_CREATED_MS + 5000), buffer="kafscale-test-gone")
    reply = setup.flusher.flush(job)
    assert not reply.committed and not reply.storage_error
    assert reply.error.startswith("FileNotFoundError")
    assert any(r.getMessage() == "flush failed" and r.exc_info for r in caplog.records)
    assert not setup.objects.list("")  # nothing uploaded
