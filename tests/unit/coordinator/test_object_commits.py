"""Write-ahead object commits (``PartitionCommitter.commit_object``) on the embedded store."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.commit_plan import Limits, wal_record_key
from kafscale.coordinator.partitions import PartitionCommitter
from kafscale.ipc.messages import CreateTopics, DeleteTopics, TopicSpec
from kafscale.ipc.write_path import ChunkCommitted, CommitObject, ObjectChunk
from kafscale.metadata import records
from kafscale.metadata.records import Keys, PartitionRecord, SegmentRecord, WalRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import (
    Compare,
    KeyValue,
    MetadataStoreUnavailable,
    Operation,
    TxnResult,
)
from kafscale.storage import wal
from kafscale.storage.local import LocalObjectStore
from tests.unit.leaders import ClaimedLeaders

KEYS = Keys("ns")


class Recording:
    """The SQLite store, counting reads and transactions; ``fail_at`` makes the n-th
    transaction from now raise as if the store were unreachable."""

    def __init__(self, store: SqliteMetadataStore) -> None:
        self.store = store
        self.reads = 0
        self.transactions: list[tuple[int, int]] = []  # (compares, operations)
        self.fail_at: int | None = None

    def get(self, key: str) -> KeyValue | None:
        self.reads += 1
        return self.store.get(key)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        self.reads += 1
        return self.store.get_prefix(prefix)

    def transaction(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        if self.fail_at is not None:
            self.fail_at -= 1
            if self.fail_at == 0:
                raise MetadataStoreUnavailable("the store is down")
        self.transactions.append((len(compares), len(success)))
        return self.store.transaction(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@dataclass
class Setup:
    store: Recording
    admin: TopicAdmin
    topic_ids: dict[str, str]
    make: Callable[[Limits], PartitionCommitter]
    leaders: ClaimedLeaders

    def create(self, name: str, partitions: int) -> None:
        """Create the topic, and claim its partitions as this broker."""
        result = self.admin.create(CreateTopics([TopicSpec(name=name, partitions=partitions)]))
        topic_id = result.results[0].topic_id
        assert topic_id is not None
        self.topic_ids[name] = topic_id
        self.leaders.claim(name, range(partitions))

    def references(self) -> Counter[str]:
        """How many chunk records in the store reference each write-ahead object: what the WAL
        garbage collector counts (from its watch) and deletes an object at 0 of."""
        found: Counter[str] = Counter()
        for topic in self.topic_ids:
            for kv in self.store.store.get_prefix(KEYS.topic_segments(topic)):
                segment = records.decode_segment(kv.value)
                if segment.is_chunk:
                    found[segment.object] += 1
        return found

    def partition(self, topic: str, partition: int) -> PartitionRecord:
        kv = self.store.store.get(KEYS.partition(topic, partition))
        assert kv is not None
        return records.decode_partition(kv.value)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    sqlite = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    store = Recording(sqlite)
    admin = TopicAdmin(sqlite, LocalObjectStore(str(tmp_path / "objects")), "ns", 1)
    leaders = ClaimedLeaders(sqlite, "ns")

    def make(limits: Limits) -> PartitionCommitter:
        return PartitionCommitter(store, "ns", leaders, limits)

    ready = Setup(store, admin, {}, make, leaders)
    ready.create("t", 300)
    yield ready
    sqlite.close()


def object_key(seq: int) -> str:
    return wal.object_key("ns", 1, "0123456789abcdef", seq)


def commit_request(
    setup: Setup,
    seq: int,
    spans: Sequence[tuple[str, int, int, int]],
) -> CommitObject:
    """An object holding a chunk per (topic, partition, base, last)."""
    key = object_key(seq)
    chunks = [
        ObjectChunk(
            topic=topic,
            topic_id=setup.topic_ids[topic],
            partition=partition,
            chunk=SegmentRecord(base, last, 10, 0, last - base + 1, 7, 8, key, 32 + 10 * n),
            producers={5: (0, 0, [(0, 0, base, last)])},
        )
        for n, (topic, partition, base, last) in enumerate(spans)
    ]
    entries = [(topic, partition, base) for topic, partition, base, _ in spans]
    return CommitObject(WalRecord(key, 5000, 1, 1, entries), chunks)


def summary(results: Sequence[ChunkCommitted]) -> Counter[tuple[bool, int, bool]]:
    return Counter((r.committed, r.high_watermark, r.topic_gone) for r in results)


LIMITS = Limits(max_ops=128, max_bytes=1024 * 1024)


def test_300_partitions_then_a_second_object(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    first = commit_request(setup, 0, [("t", p, 0, 9) for p in range(300)])
    result = committer.commit_object(first)
    assert summary(result.results) == {(True, 10, False): 300}
    # 63 partitions a transaction: 2 compares each (record, leader key) + the topic's
    assert len(setup.store.transactions) == 1 + math.ceil((300 - 63) / 63)
    assert all(max(ops) <= 128 for ops in setup.store.transactions)
    stored = setup.store.store.get(wal_record_key(KEYS, first.wal.key))
    assert stored is not None and records.decode_wal(stored.value) == first.wal
    assert setup.partition("t", 299) == PartitionRecord(
        setup.topic_ids["t"],
        10,
        0,
        {5: (0, 0, [(0, 0, 0, 9)])},
        owner=1,
        leader_epoch=0,
        epochs=[(0, 0)],
        wal_committed=True,
    )
    assert setup.references() == {first.wal.key: 300}
    assert committer.high_watermarks[("t", 17)] == 10

    # The second object costs no reads: every record is cached from the first one's commits.
    setup.store.reads, setup.store.transactions = 0, []
    second = commit_request(setup, 1, [("t", p, 10, 19) for p in range(300)])
    assert summary(committer.commit_object(second).results) == {(True, 20, False): 300}
    assert (setup.store.reads, len(setup.store.transactions)) == (0, 5)
    segments = setup.store.store.get_prefix(KEYS.segments("t", 42))
    assert [records.decode_segment(kv.value).object for kv in segments] == [
        first.wal.key,
        second.wal.key,
    ]


def test_retried_stale_and_gapped_chunks(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    first = commit_request(setup, 0, [("t", 0, 0, 9), ("t", 0, 10, 14), ("t", 1, 0, 4)])
    fresh = committer.commit_object(first).results
    assert summary(fresh) == {(True, 15, False): 2, (True, 5, False): 1}
    assert not any(r.earlier for r in fresh)
    # the same object again (its answer was lost): committed earlier, nothing written
    setup.store.transactions = []
    again = committer.commit_object(first).results
    assert summary(again) == {(True, 15, False): 2, (True, 5, False): 1}
    assert all(r.earlier for r in again)
    assert setup.store.transactions == []
    stale = commit_request(setup, 1, [("t", 0, 12, 19), ("t", 1, 7, 9), ("t", 2, 0, 3)])
    results = committer.commit_object(stale).results
    assert [(r.committed, r.high_watermark) for r in results] == [
        (False, 15),
        (False, 5),
        (True, 4),
    ]
    assert "next offset 15" in (results[0].error or "")
    assert setup.partition("t", 0).high_watermark == 15


def test_a_deleted_topic_answers_topic_gone(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    committer.commit_object(commit_request(setup, 0, [("t", 0, 0, 9), ("t", 1, 0, 9)]))
    setup.admin.delete(DeleteTopics(names=["t"]))
    late = commit_request(setup, 1, [("t", 0, 10, 19), ("t", 1, 10, 19)])
    results = committer.commit_object(late).results
    assert summary(results) == {(False, -1, True): 2}
    assert setup.store.store.get_prefix(KEYS.topic_segments("t")) == []
    assert setup.store.store.get(wal_record_key(KEYS, late.wal.key)) is None


def test_a_topic_created_after_a_refusal_commits(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    setup.topic_ids["u"] = "00000000-0000-0000-0000-000000000001"
    early = commit_request(setup, 0, [("u", 0, 0, 4)])
    assert summary(committer.commit_object(early).results) == {(False, -1, True): 1}
    setup.create("u", 1)
    assert summary(committer.commit_object(commit_request(setup, 1, [("u", 0, 0, 4)])).results) == {
        (True, 5, False): 1
    }


def test_another_writer_is_seen_and_replanned(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    committer.commit_object(commit_request(setup, 0, [("t", 0, 0, 9)]))
    moved = setup.partition("t", 0)
    setup.store.store.put(
        KEYS.partition("t", 0), records.encode(PartitionRecord(moved.topic_id, 10, 4, owner=1))
    )
    setup.store.transactions = []
    result = committer.commit_object(commit_request(setup, 1, [("t", 0, 10, 19)]))
    assert summary(result.results) == {(True, 20, False): 1}
    assert len(setup.store.transactions) == 2  # failed compare, then the re-planned one
    assert setup.partition("t", 0).log_start_offset == 4


def test_another_owner_fences_the_commit(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    committer.commit_object(commit_request(setup, 0, [("t", 0, 0, 9)]))
    setup.store.store.put(
        KEYS.partition("t", 0),
        records.encode(PartitionRecord(setup.topic_ids["t"], 10, owner=2, leader_epoch=1)),
    )
    results = committer.commit_object(commit_request(setup, 1, [("t", 0, 10, 19)])).results
    assert [(r.committed, r.high_watermark) for r in results] == [(False, 10)]
    assert (results[0].error or "").startswith("fenced")


def test_a_lost_leader_key_fences_the_commit_and_tells_the_driver(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    committer.commit_object(commit_request(setup, 0, [("t", 0, 0, 9), ("t", 1, 0, 9)]))
    setup.leaders.lose("t", 0)  # our lease on it ran out; the records are unchanged
    results = committer.commit_object(
        commit_request(setup, 1, [("t", 0, 10, 19), ("t", 1, 10, 19)])
    ).results
    assert [(r.committed, r.high_watermark) for r in results] == [(False, 10), (True, 20)]
    assert setup.leaders.fences == [("t", 0, 0)]
    assert setup.partition("t", 0).high_watermark == 10


def test_the_wal_record_moves_to_the_next_transaction_when_the_first_fails(setup: Setup) -> None:
    committer = setup.make(Limits(max_ops=8, max_bytes=1024 * 1024))  # 3 partitions a txn
    committer.commit_object(commit_request(setup, 0, [("t", p, 0, 9) for p in range(6)]))
    setup.store.store.put(  # fences partitions 0..2, all of the next object's first transaction
        KEYS.partition("t", 0), records.encode(PartitionRecord(setup.topic_ids["t"], 10, owner=2))
    )
    for p in (1, 2):
        setup.store.store.put(
            KEYS.partition("t", p),
            records.encode(PartitionRecord(setup.topic_ids["t"], 10, owner=2)),
        )
    second = commit_request(setup, 1, [("t", p, 10, 19) for p in range(6)])
    results = committer.commit_object(second).results
    assert [r.committed for r in results] == [False] * 3 + [True] * 3
    assert setup.store.store.get(wal_record_key(KEYS, second.wal.key)) is not None
    assert setup.references()[second.wal.key] == 3


def test_a_store_failure_after_a_partial_commit(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    request = commit_request(setup, 0, [("t", p, 0, 9) for p in range(130)])
    setup.store.fail_at = 2
    results = committer.commit_object(request).results
    assert summary(results) == {(True, 10, False): 63, (False, -1, False): 67}
    assert all("metadata store failed" in (r.error or "") for r in results[63:])
    setup.store.fail_at = None
    retried = committer.commit_object(request).results  # the flusher offers them again
    assert summary(retried) == {(True, 10, False): 130}


def test_a_store_failure_before_anything_committed_raises(setup: Setup) -> None:
    committer = setup.make(LIMITS)
    setup.store.fail_at = 1
    with pytest.raises(MetadataStoreUnavailable):
        committer.commit_object(commit_request(setup, 0, [("t", 0, 0, 9)]))
