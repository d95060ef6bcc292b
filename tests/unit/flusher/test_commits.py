"""The CommitObject of a built object, and the coordinator's answer mapped back to each entry."""

from __future__ import annotations

import pytest

from kafscale.flusher import commits
from kafscale.flusher.objects import BuiltObject, Chunk
from kafscale.ipc import messages, write_path
from kafscale.ipc.write_path import ChunkCommitted, WalEntry
from kafscale.metadata.records import SegmentRecord

KEY = "ns/!wal/3/0123456789abcdef/0000000000.wal"
PRODUCERS = {7: (0, 4, [(0, 4, 0, 0)])}


def entry(partition: int, base: int) -> WalEntry:
    return WalEntry(
        buffer="b",
        generation=1,
        size=10,
        topic="t",
        topic_id="6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c",
        partition=partition,
        base_offset=base,
        last_offset=base + 4,
        records=5,
        max_timestamp=9,
        created_ms=1,
        codec=2,
        producers=PRODUCERS,
    )


ENTRIES = [entry(1, 10), entry(0, 0), entry(2, 20)]  # index 2 was left out of the object


def built() -> BuiltObject:
    chunks = []
    for index in (1, 0):  # object order
        e = ENTRIES[index]
        record = SegmentRecord(e.base_offset, e.last_offset, 50, 0, 5, 9, 1, KEY, 100 * index, 2)
        chunks.append(Chunk(index, e, record, memoryview(b"x" * 50)))
    return BuiltObject(KEY, 77, b"o" * 400, chunks, {2: "buffer reused"})


def test_the_request_names_each_chunk_and_the_wal_record() -> None:
    request = commits.commit_request(built(), broker_id=3)
    assert request.wal.key == KEY and request.wal.size == 400 and request.wal.created_ms == 77
    assert request.wal.broker_id == 3
    assert request.wal.entries == [("t", 0, 0), ("t", 1, 10)]
    assert [(c.partition, c.chunk.base_offset, c.producers) for c in request.chunks] == [
        (0, 0, PRODUCERS),
        (1, 10, PRODUCERS),
    ]


def test_each_entry_hears_its_own_outcome_in_cycle_order() -> None:
    reply = write_path.ObjectCommitResult(
        results=[
            ChunkCommitted("t", 0, 0, committed=True, high_watermark=5),
            ChunkCommitted("t", 1, 10, committed=False, high_watermark=3, error="not at hw"),
        ]
    )
    object_ = built()
    results = commits.entry_results(ENTRIES, object_, reply)
    assert [(r.partition, r.base_offset) for r in results] == [(1, 10), (0, 0), (2, 20)]
    refused, committed, left_out = results
    assert committed.committed and committed.high_watermark == 5
    assert committed.segment == object_.chunks[0].record
    assert not refused.committed and refused.error == "not at hw" and refused.segment is None
    assert not refused.storage_error and refused.high_watermark == 3
    assert not left_out.committed and not left_out.storage_error
    assert left_out.error is not None and "buffer reused" in left_out.error


def test_a_chunk_committed_by_an_earlier_attempt_names_no_entry() -> None:
    # The log lists the chunk of the earlier attempt's object: the shard must read the
    # partition's entries back, not list this object's chunk, and the compactor not take it.
    reply = write_path.ObjectCommitResult(
        results=[
            ChunkCommitted("t", 0, 0, committed=True, high_watermark=5, earlier=True),
            ChunkCommitted("t", 1, 10, committed=True, high_watermark=15),
        ]
    )
    object_ = built()
    fresh, earlier, _ = commits.entry_results(ENTRIES, object_, reply)
    assert earlier.committed and earlier.high_watermark == 5 and earlier.segment is None
    assert fresh.committed and fresh.segment == object_.chunks[1].record


def test_a_deleted_topic_is_said_so() -> None:
    reply = write_path.ObjectCommitResult(
        results=[
            ChunkCommitted("t", 0, 0, committed=False, high_watermark=-1, topic_gone=True),
            ChunkCommitted("t", 1, 10, committed=False, high_watermark=-1, topic_gone=True),
        ]
    )
    results = commits.entry_results(ENTRIES, built(), reply)
    assert [r.topic_gone for r in results] == [True, True, False]


@pytest.mark.parametrize(
    "reply",
    [
        messages.ErrorReply(message="etcd is down"),
        write_path.ObjectCommitResult(results=[]),  # the wrong number of answers
        messages.Pong(role="x", index=0, pid=1, started_at=0.0),
    ],
)
def test_no_usable_answer_fails_every_chunk_as_a_storage_error(reply: messages.Message) -> None:
    results = commits.entry_results(ENTRIES, built(), reply)
    assert [r.committed for r in results] == [False, False, False]
    assert [r.storage_error for r in results] == [True, True, False]


def test_an_object_without_chunks_asks_nothing() -> None:
    empty = BuiltObject(KEY, 0, b"", [], {0: "a", 1: "b", 2: "c"})
    results = commits.entry_results(ENTRIES, empty, None)
    assert [r.committed for r in results] == [False] * 3


def test_an_entry_neither_built_nor_left_out_is_a_bug() -> None:
    broken = BuiltObject(KEY, 0, b"", [], {0: "a"})
    with pytest.raises(ValueError):
        commits.entry_results(ENTRIES, broken, None)
