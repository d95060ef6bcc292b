"""Compaction commits (``CompactionCommitter``) on the embedded store, and their pure check."""

from __future__ import annotations

import uuid

from kafscale.coordinator.commit_plan import Limits, compaction_refusal
from kafscale.coordinator.compactions import CompactionCommitter
from kafscale.ipc.messages import DeleteTopics
from kafscale.ipc.write_path import CommitCompaction, CommitMerge, SegmentCommitted
from kafscale.metadata import records
from kafscale.metadata.records import SegmentRecord, WalRecord
from kafscale.storage import wal
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
    return CompactionCommitter(setup.store, "ns", partitions.high_watermark, setup.leaders)


def test_1000_chunks_become_one_segment_in_one_transaction(setup: Setup) -> None:
    chunks_committed(setup, 1000, objects=4)
    compactions = committer(setup)
    setup.store.transactions = []
    result = compactions.commit(compaction(setup, 0, 999))
    assert result == SegmentCommitted(committed=True, high_watermark=1000)
    # three compares (topic, first chunk, leader key); a put and one range delete
    assert setup.store.transactions == [(3, 2)]
    assert entries(setup) == [(0, 999, False)]
    assert all(setup.references()[object_key(seq)] == 0 for seq in range(4))


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
    assert setup.references()[object_key(0)] == 6
    # a single chunk: no range delete
    setup.store.transactions = []
    assert committer(setup).commit(compaction(setup, 8, 8)).committed
    assert setup.store.transactions == [(3, 1)]  # topic, first chunk, leader key


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
    assert setup.store.transactions == [(3, 2)]
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
    assert compaction_refusal(request(0, 9, chunk(0, 9)), run) is None  # a merged chunk
    assert "not 0..9" in (compaction_refusal(request(0, 9, chunk(0, 8)), run) or "")
    assert "no entry starts at 0" in (compaction_refusal(request(0, 9), []) or "")
    assert "no entry starts at 0" in (compaction_refusal(request(0, 9), run[1:]) or "")
    gap = [chunk(0, 4), chunk(6, 9)]
    assert "gap or an overlap at 6" in (compaction_refusal(request(0, 9), gap) or "")
    assert "end at 9, not 8" in (compaction_refusal(request(0, 8), run) or "")
    mixed = [chunk(0, 4), spec_segment(5, 9)]
    assert "is a segment" in (compaction_refusal(request(0, 9), mixed) or "")


# -- the merge level ----------------------------------------------------------------------------

MERGED = object_key(1000)


def merged_chunk(base: int, last: int, position: int = 32) -> SegmentRecord:
    return SegmentRecord(
        base, last, 10 * (last - base + 1), 0, last - base + 1, 7, 8, MERGED, position
    )


def merge_run(setup: Setup, partition: int, base: int, last: int) -> CommitCompaction:
    return CommitCompaction(
        "t", setup.topic_ids["t"], partition, base, last, merged_chunk(base, last, 32 + partition)
    )


def merge_request(runs: list[CommitCompaction]) -> CommitMerge:
    entries = [(run.topic, run.partition, run.first_base) for run in runs]
    return CommitMerge(WalRecord(MERGED, 1 << 20, 5, 1, entries, merged=True), runs)


def partition_entries(setup: Setup, partition: int) -> list[tuple[int, int, str]]:
    found = setup.store.store.get_prefix(KEYS.segments("t", partition))
    decoded = [records.decode_segment(kv.value) for kv in found]
    return [(s.base_offset, s.last_offset, s.object) for s in decoded]


def test_runs_of_many_partitions_merge_into_one_object(setup: Setup) -> None:
    """Every partition's first 5 chunks (of 10, over two objects) become one chunk of the merged
    object; its WalRecord goes first, alone; the runs fill transactions within the limits."""
    partitions = setup.make(Limits(max_ops=100_000, max_bytes=1 << 30))
    for seq in range(2):
        spans = [("t", p, base, base) for p in range(100) for base in range(seq * 5, seq * 5 + 5)]
        assert all(
            r.committed for r in partitions.commit_object(commit_request(setup, seq, spans)).results
        )
    compactions = CompactionCommitter(
        setup.store,
        "ns",
        partitions.high_watermark,
        setup.leaders,
        limits=Limits(max_ops=40, max_bytes=1 << 20),
    )
    setup.store.transactions = []
    runs = [merge_run(setup, p, 0, 4) for p in range(100)]
    result = compactions.commit_merge(merge_request(runs))
    assert result.results == [SegmentCommitted(True, 10)] * 100
    # the WalRecord alone, then 19 runs per transaction: 1 topic + 19 first-chunk and 19
    # leader-key compares, 38 ops (a put and a range delete each)
    assert setup.store.transactions == [(1, 1)] + [(39, 38)] * 5 + [(11, 10)]
    assert partition_entries(setup, 7) == [(0, 4, MERGED)] + [
        (b, b, object_key(1)) for b in range(5, 10)
    ]
    assert setup.references()[MERGED] == 100
    assert setup.references()[object_key(0)] == 0 and setup.references()[object_key(1)] == 500
    stored = setup.store.store.get(KEYS.wal_object(wal.object_name(MERGED)))
    assert stored is not None and records.decode_wal(stored.value).merged

    # A retry (the answer was lost) finds the record and the runs in place: nothing changes.
    again = compactions.commit_merge(merge_request(runs[:3]))
    assert all(r.committed for r in again.results)
    assert setup.references()[MERGED] == 100

    # Sealing later: the merged chunk and the chunks after it become one spec segment.
    sealed = compactions.commit(
        CommitCompaction("t", setup.topic_ids["t"], 7, 0, 9, spec_segment(0, 9))
    )
    assert sealed.committed
    assert partition_entries(setup, 7) == [(0, 9, "")]
    assert setup.references()[MERGED] == 99 and setup.references()[object_key(1)] == 495


def test_a_refused_run_leaves_the_others_committed(setup: Setup) -> None:
    partitions = setup.make(Limits(max_ops=100_000, max_bytes=1 << 30))
    spans = [("t", p, base, base) for p in range(4) for base in range(5)]
    assert all(
        r.committed for r in partitions.commit_object(commit_request(setup, 0, spans)).results
    )
    compactions = committer(setup)
    runs = [merge_run(setup, p, 0, 4) for p in range(4)]
    runs[1] = merge_run(setup, 1, 0, 7)  # past the partition's entries
    runs[2] = CommitCompaction(
        "t", setup.topic_ids["t"], 2, 0, 4, SegmentRecord(0, 4, 50, 0, 5, 7, 8, object_key(999), 32)
    )
    result = compactions.commit_merge(merge_request(runs)).results
    assert [r.committed for r in result] == [True, False, False, True]
    assert "end at 4, not 7" in (result[1].error or "")
    assert "not a chunk of" in (result[2].error or "")
    assert setup.references()[MERGED] == 2


def test_a_transaction_that_fails_its_compares_is_retried_run_by_run(setup: Setup) -> None:
    partitions = setup.make(Limits(max_ops=100_000, max_bytes=1 << 30))
    spans = [("t", p, base, base) for p in range(3) for base in range(5)]
    assert all(
        r.committed for r in partitions.commit_object(commit_request(setup, 0, spans)).results
    )
    compactions = committer(setup)
    runs = [merge_run(setup, p, 0, 4) for p in range(3)]
    assert compactions.commit_merge(merge_request([])).results == []  # the WalRecord only
    # Partition 1's first chunk is compacted by someone else between the reads and the commit.
    prepared = [(i, compactions._prepare(run, {})) for i, run in enumerate(runs)]
    assert compactions.commit(
        CommitCompaction("t", setup.topic_ids["t"], 1, 0, 4, spec_segment(0, 4))
    ).committed
    results = compactions._commit_batch(prepared)  # type: ignore[arg-type]
    assert [results[i].committed for i in range(3)] == [True, False, True]
    assert "is a segment" in (results[1].error or "")


def test_a_merged_chunk_needs_its_wal_record(setup: Setup) -> None:
    chunks_committed(setup, 5)
    result = committer(setup).commit(
        CommitCompaction("t", setup.topic_ids["t"], 0, 0, 4, merged_chunk(0, 4))
    )
    assert not result.committed and "no WAL record" in (result.error or "")
    assert entries(setup) == [(b, b, True) for b in range(5)]


def test_only_the_owner_compacts(setup: Setup) -> None:
    chunks_committed(setup, 10)
    compactions = committer(setup)
    setup.leaders.lose("t", 0)  # another broker claimed it: our key is gone, we still think not
    refused = compactions.commit(compaction(setup, 0, 9))
    assert not refused.committed and "owner changed" in (refused.error or "")
    setup.leaders.held.pop(("t", 0))  # and once we know
    refused = compactions.commit(compaction(setup, 0, 9))
    assert not refused.committed and (refused.error or "").startswith("fenced")
    assert entries(setup) == [(b, b, True) for b in range(10)]
