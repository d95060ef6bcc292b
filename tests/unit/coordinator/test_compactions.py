"""Compaction commits (``CompactionCommitter``) on the embedded store, and their pure check."""

from __future__ import annotations

import uuid

from kafscale.coordinator.commit_plan import Limits, compaction_refusal
from kafscale.coordinator.compactions import CompactionCommitter
from kafscale.ipc.messages import CommitCompaction, DeleteTopics, SegmentCommitted
from kafscale.metadata import records
from kafscale.metadata.records import SegmentRecord
from tests.unit.coordinator.test_object_commits import (
    KEYS,
    Setup,
    commit_request,
    object_key,
    setup,
)

__all__ = ["setup"]  # the fixture


def spec_segment(base: int, last: int) -> SegmentRecord:
    return SegmentRecord(base, last, 4096, 28, last - base + 1, 7, 8)


def compaction(
    setup: Setup, base: int, last: int, segment: SegmentRecord | None = None
) -> CommitCompaction:
    return CommitCompaction(
        topic="t",
        topic_id=setup.topic_ids["t"],
        partition=0,
        first_base=base,
        last_offset=last,
        segment=segment or spec_segment(base, last),
    )


def entries(setup: Setup) -> list[tuple[int, int, bool]]:
    found = setup.store.store.get_prefix(KEYS.segments("t", 0))
    decoded = [records.decode_segment(kv.value) for kv in found]
    return [(s.base_offset, s.last_offset, s.is_chunk) for s in decoded]


def chunks_committed(setup: Setup, count: int, objects: int = 1) -> None:
    """``count`` one-offset chunks of partition 0, spread over ``objects`` objects."""
    committer = setup.make(Limits(max_ops=100_000, max_bytes=1 << 30))
    per = count // objects
    for seq in range(objects):
        spans = [("t", 0, base, base) for base in range(seq * per, (seq + 1) * per)]
        results = committer.commit_object(commit_request(setup, seq, spans)).results
        assert all(r.committed for r in results)


def committer(setup: Setup) -> CompactionCommitter:
    partitions = setup.make(Limits(max_ops=128, max_bytes=1 << 20))
    return CompactionCommitter(setup.store, "ns", partitions.high_watermark, setup.refs)


def test_1000_chunks_become_one_segment_in_one_transaction(setup: Setup) -> None:
    chunks_committed(setup, 1000, objects=4)
    compactions = committer(setup)
    setup.store.transactions = []
    result = compactions.commit(compaction(setup, 0, 999))
    assert result == SegmentCommitted(committed=True, high_watermark=1000)
    assert setup.store.transactions == [(2, 2)]  # two compares; a put and one range delete
    assert entries(setup) == [(0, 999, False)]
    assert all(setup.refs.counts[object_key(seq)] == 0 for seq in range(4))


def test_a_middle_run_is_replaced_and_the_rest_kept(setup: Setup) -> None:
    chunks_committed(setup, 10)
    assert committer(setup).commit(compaction(setup, 3, 6)).committed
    assert entries(setup) == [
        (0, 0, True),
        (1, 1, True),
        (2, 2, True),
        (3, 6, False),
        (7, 7, True),
        (8, 8, True),
        (9, 9, True),
    ]
    assert setup.refs.counts[object_key(0)] == 6
    # a single chunk: no range delete
    setup.store.transactions = []
    assert committer(setup).commit(compaction(setup, 8, 8)).committed
    assert setup.store.transactions == [(2, 1)]


def test_refusals(setup: Setup) -> None:
    chunks_committed(setup, 10)
    compactions = committer(setup)
    setup.store.transactions = []
    cases = {
        (2, 20): "end at 9",  # past the last entry
        (10, 12): "no entry starts at 10",
    }
    for (base, last), error in cases.items():
        result = compactions.commit(compaction(setup, base, last))
        assert (result.committed, result.high_watermark) == (False, 10)
        assert error in (result.error or ""), result.error
    assert compactions.commit(compaction(setup, 0, 4)).committed
    again = compactions.commit(compaction(setup, 0, 4))  # a retry after a lost answer
    assert not again.committed and "is a segment" in (again.error or "")
    assert setup.store.transactions == [(2, 2)]
    setup.admin.delete(DeleteTopics(names=["t"]))
    gone = compactions.commit(compaction(setup, 5, 9))
    assert (gone.committed, gone.high_watermark) == (False, -1)


# -- the pure check ---------------------------------------------------------------------------


def chunk(base: int, last: int) -> SegmentRecord:
    return SegmentRecord(base, last, 10, 0, last - base + 1, 7, 8, "ns/!wal/...", 32)


def request(base: int, last: int, segment: SegmentRecord | None = None) -> CommitCompaction:
    return CommitCompaction(
        "t", str(uuid.uuid4()), 0, base, last, segment or spec_segment(base, last)
    )


def test_compaction_refusal() -> None:
    run = [chunk(0, 4), chunk(5, 5), chunk(6, 9)]
    assert compaction_refusal(request(0, 9), run) is None
    assert "not 0..9" in (compaction_refusal(request(0, 9, spec_segment(0, 8)), run) or "")
    assert "not 0..9" in (compaction_refusal(request(0, 9, chunk(0, 9)), run) or "")
    assert "no entry starts at 0" in (compaction_refusal(request(0, 9), []) or "")
    assert "no entry starts at 0" in (compaction_refusal(request(0, 9), run[1:]) or "")
    gap = [chunk(0, 4), chunk(6, 9)]
    assert "gap or an overlap at 6" in (compaction_refusal(request(0, 9), gap) or "")
    assert "end at 9, not 8" in (compaction_refusal(request(0, 8), run) or "")
    mixed = [chunk(0, 4), spec_segment(5, 9)]
    assert "is a segment" in (compaction_refusal(request(0, 9), mixed) or "")
