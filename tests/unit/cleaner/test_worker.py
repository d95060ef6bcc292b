"""The log cleaner's rounds against real stores (a local directory, SQLite) and the real
coordinator committer: which partitions it cleans, what the new segments hold, what it leaves
when its commit is refused or a key is taken, and the garbage collection of what it replaced."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.cleaner.worker import UNCLEANABLE_MS, Cleaner
from kafscale.coordinator.cleanings import GRACE_MS, CleaningCommitter
from kafscale.coordinator.garbage import GarbageCollector
from kafscale.ipc.base import Message
from kafscale.ipc.cleaning import CommitCleaning, SegmentsCleaned
from kafscale.ipc.write_path import SegmentCommitted
from kafscale.metadata import records
from kafscale.metadata.records import (
    Keys,
    LeaderRecord,
    PartitionRecord,
    SegmentRecord,
    TopicRecord,
)
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import Put
from kafscale.protocol import records as batches
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore

NS, TOPIC, TOPIC_ID = "default", "compacted", "0f7a0d41-4bd1-4a5c-8a43-7a4c8d2b1b11"
T0 = 1_700_000_000_000
LEADER = LeaderRecord(owner=0, epoch=1, lease=7, run_id="r")


class Leaders:
    def __init__(self) -> None:
        self.owned = True

    def leader(self, topic: str, partition: int) -> LeaderRecord | None:
        return LEADER if self.owned else None

    def fenced(self, topic: str, partition: int, epoch: int) -> None:
        pass


class Log:
    """One compacted partition: its records in the store, its segments in the bucket."""

    def __init__(self, root: Path, **configs: str) -> None:
        self.config = configuration.load(
            {"KAFSCALE_DATA_DIR": str(root), "KAFSCALE_CLEANER_BUFFER_BYTES": "1MiB"}
        )
        self.objects = LocalObjectStore(str(root / "segments"))
        self.store = SqliteMetadataStore(str(root / "metadata.db"))
        self.keys = Keys(NS)
        self.now = T0 + 3_600_000
        self.next_offset = 0
        self.leaders = Leaders()
        self.committer = CleaningCommitter(
            self.store, NS, lambda t, p: self.next_offset, self.leaders, lambda: self.now
        )
        self.commits: list[CommitCleaning] = []
        self.notices: list[tuple[int, Message]] = []
        topic = TopicRecord(
            TOPIC,
            TOPIC_ID,
            1,
            {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", **configs},
        )
        self.store.put(self.keys.topic(TOPIC), records.encode(topic))
        self.store.put(self.keys.leader(TOPIC, 0), records.encode(LEADER))
        self.store.put(self.keys.partition(TOPIC, 0), records.encode(PartitionRecord(TOPIC_ID)))
        self.cleaner = Cleaner(
            self.config, self.objects, self.store, self.commit, self.notify, clock=lambda: self.now
        )

    def commit(self, request: CommitCleaning) -> SegmentCommitted:
        self.commits.append(request)
        return self.committer.commit(request)

    def notify(self, shard: int, message: Message) -> None:
        self.notices.append((shard, message))

    def write(self, *rows: tuple[str, str | None]) -> SegmentRecord:
        """A segment of one batch per two records, at the next offsets, committed."""
        base = self.next_offset
        built = []
        for i in range(0, len(rows), 2):
            pairs = rows[i : i + 2]
            built.append(
                batches.build_batch(
                    [
                        (k.encode(), None if v is None else v.encode(), [], T0 + base + i + j)
                        for j, (k, v) in enumerate(pairs)
                    ],
                    base_offset=base + i,
                )
            )
        kfs, index = segments.build_segment(built, 0, T0)
        for key, blob in (
            (segments.segment_key(NS, TOPIC, 0, base), kfs),
            (segments.index_key(NS, TOPIC, 0, base), index),
        ):
            self.objects.put_if_absent(key, blob)
        record = SegmentRecord(
            base, base + len(rows) - 1, len(kfs), len(index), len(rows), T0 + base + len(rows), T0
        )
        self.store.put(self.keys.segment(TOPIC, 0, base), records.encode(record))
        self.next_offset += len(rows)
        return record

    def entries(self) -> list[SegmentRecord]:
        prefix = self.keys.segments(TOPIC, 0)
        return [records.decode_segment(kv.value) for kv in self.store.get_prefix(prefix)]

    def contents(self) -> list[tuple[int, str, str | None]]:
        """(offset, key, value) of every record the partition's segments hold now."""
        out = []
        for entry in self.entries():
            key = segments.segment_key(NS, TOPIC, 0, entry.base_offset, entry.generation)
            parsed = segments.parse_segment(self.objects.get(key), verify=True)
            assert (parsed.base_offset, parsed.last_offset) == (
                entry.base_offset,
                entry.last_offset,
            )
            assert bool(parsed.flags & segments.FLAG_CLEANED) == (entry.generation > 0)
            for span in parsed.batches:
                batch = parsed.data[span.position : span.position + span.length]
                for record in batches.iter_records(batch):
                    value = None if record.value is None else record.value.decode()
                    out.append((record.offset, (record.key or b"").decode(), value))
        return out


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    made = Log(tmp_path)
    yield made
    made.store.close()


def test_a_round_keeps_the_last_record_of_each_key_at_its_offset(log: Log) -> None:
    log.write(("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"))
    log.write(("b", "2"), ("a", "3"), ("d", "1"), ("c", "2"))
    assert log.cleaner.round()
    assert log.contents() == [(4, "b", "2"), (5, "a", "3"), (6, "d", "1"), (7, "c", "2")]
    entries = log.entries()
    # Both segments fit in one: one new segment at generation 1, covering 0..7.
    assert [(e.base_offset, e.last_offset, e.generation, e.records) for e in entries] == [
        (0, 7, 1, 4)
    ]
    [(shard, notice)] = log.notices
    assert shard == 0 and isinstance(notice, SegmentsCleaned) and notice.segments == entries
    # Nothing is dirty any more.
    assert not log.cleaner.round()


def test_only_compacted_topics_and_owned_partitions_are_cleaned(tmp_path: Path) -> None:
    log = Log(tmp_path, **{"cleanup.policy": "delete"})
    log.write(("a", "1"), ("a", "2"))
    assert not log.cleaner.round()
    log.store.put(
        log.keys.topic(TOPIC),
        records.encode(TopicRecord(TOPIC, TOPIC_ID, 1, {"cleanup.policy": "compact,delete"})),
    )
    log.cleaner._owned = lambda: set()
    assert not log.cleaner.round()
    log.cleaner._owned = lambda: {(TOPIC, 0)}
    assert log.cleaner.round()
    assert log.contents() == [(1, "a", "2")]


def test_segments_younger_than_the_min_compaction_lag_wait(tmp_path: Path) -> None:
    log = Log(tmp_path, **{"min.compaction.lag.ms": str(7_200_000)})
    log.write(("a", "1"), ("a", "2"))
    assert not log.cleaner.round()
    log.now += 7_200_000
    assert log.cleaner.round()


def test_a_tombstone_stays_for_delete_retention_then_goes(tmp_path: Path) -> None:
    log = Log(tmp_path, **{"delete.retention.ms": "60000"})
    log.write(("a", "1"), ("b", "1"), ("a", None), ("c", "1"))
    assert log.cleaner.round()
    assert sorted(log.contents()) == [(1, "b", "1"), (2, "a", None), (3, "c", "1")]
    # A later cleaning within delete.retention.ms keeps it; after, it is gone.
    log.write(("c", "2"), ("d", "1"))
    assert log.cleaner.round()
    assert (2, "a", None) in log.contents()
    log.now += 60_001
    log.write(("d", "2"), ("e", "1"))
    assert log.cleaner.round()
    assert sorted(log.contents()) == [(1, "b", "1"), (4, "c", "2"), (6, "d", "2"), (7, "e", "1")]
    assert [(e.base_offset, e.last_offset) for e in log.entries()] == [(0, 7)]


def test_a_refused_commit_leaves_the_log_and_no_new_object(log: Log) -> None:
    log.write(("a", "1"), ("a", "2"))
    log.write(("a", "3"), ("b", "1"))
    before = log.entries()
    log.leaders.owned = False  # another broker owns it now
    assert not log.cleaner.round()
    assert log.entries() == before
    assert [o.key for o in log.objects.list(f"{NS}/{TOPIC}/0/")] == sorted(
        key
        for e in before
        for key in (
            segments.segment_key(NS, TOPIC, 0, e.base_offset),
            segments.index_key(NS, TOPIC, 0, e.base_offset),
        )
    )
    # A record changed after the cleaner read it is refused the same way.
    log.leaders.owned = True
    found = log.cleaner.candidates(log.now)
    log.store.put(log.keys.segment(TOPIC, 0, 0), records.encode(before[0]))  # a new revision
    with pytest.raises(Exception, match="changed"):
        log.cleaner.clean(found[0], log.now)
    assert log.entries() == before


def test_a_taken_key_moves_the_cleaning_to_the_next_generation(log: Log) -> None:
    log.write(("a", "1"), ("a", "2"))
    taken = segments.segment_key(NS, TOPIC, 0, 0, 1)
    log.objects.put_if_absent(taken, b"someone else's")
    assert log.cleaner.round()
    [entry] = log.entries()
    assert entry.generation == 2
    assert log.objects.get(taken) == b"someone else's"
    assert log.contents() == [(1, "a", "2")]


def test_replaced_objects_are_deleted_after_the_grace(log: Log) -> None:
    log.write(("a", "1"), ("a", "2"))
    assert log.cleaner.round()
    old = segments.segment_key(NS, TOPIC, 0, 0)
    garbage = GarbageCollector(log.store, log.objects, log.keys, lambda: log.now)
    assert garbage.sweep(log.now) == 0 and log.objects.get(old)
    assert garbage.sweep(log.now + GRACE_MS) == 1
    assert [o.key for o in log.objects.list(f"{NS}/{TOPIC}/0/")] == [
        segments.index_key(NS, TOPIC, 0, 0, 1),
        segments.segment_key(NS, TOPIC, 0, 0, 1),
    ]
    assert log.store.get_prefix(log.keys.garbage) == []
    assert log.contents() == [(1, "a", "2")]


def test_the_clean_section_grows_as_dirty_segments_come(log: Log) -> None:
    log.write(("a", "1"), ("b", "1"))
    assert log.cleaner.round()
    log.write(("a", "2"), ("c", "1"))
    log.write(("b", "2"), ("d", "1"))
    assert log.cleaner.round()
    assert sorted(log.contents()) == [(2, "a", "2"), (3, "c", "1"), (4, "b", "2"), (5, "d", "1")]
    [entry] = log.entries()
    assert (entry.base_offset, entry.last_offset, entry.generation) == (0, 5, 2)
    commit = log.commits[-1]
    assert [base for base, _ in commit.replaced] == [0, 2, 4]


def test_the_records_change_no_offset_and_the_high_watermark_is_untouched(log: Log) -> None:
    log.write(*[(f"k{i % 3}", str(i)) for i in range(30)])
    log.store.transaction(
        [],
        [
            Put(
                log.keys.partition(TOPIC, 0),
                records.encode(PartitionRecord(TOPIC_ID, high_watermark=30)),
            )
        ],
    )
    assert log.cleaner.round()
    assert sorted(log.contents()) == [(27, "k0", "27"), (28, "k1", "28"), (29, "k2", "29")]
    stored = log.store.get(log.keys.partition(TOPIC, 0))
    assert stored is not None
    partition = records.decode_partition(stored.value)
    assert partition.high_watermark == 30 and partition.log_start_offset == 0


def test_a_partition_with_an_unreadable_segment_is_left_alone_for_a_while(log: Log) -> None:
    first = log.write(("a", "1"), ("a", "2"))
    key = segments.segment_key(NS, TOPIC, 0, first.base_offset)
    log.objects.delete(key)
    log.objects.put_if_absent(key, b"not a segment")
    assert not log.cleaner.round()
    assert log.cleaner.candidates(log.now) == []  # left alone
    log.now += UNCLEANABLE_MS
    assert [c.partition for c in log.cleaner.candidates(log.now)] == [0]


def test_cleaned_segments_are_grouped_up_to_segment_bytes(tmp_path: Path) -> None:
    # (A record here is stored unvalidated, so segment.bytes may be far below Kafka's minimum.)
    log = Log(tmp_path, **{"segment.bytes": "200"})
    for base in range(0, 8, 2):
        log.write((f"k{base}", "x" * 40), (f"k{base + 1}", "x" * 40))
    log.write(("k0", "y"), ("k1", "y"))  # supersedes the first segment's two records
    assert log.cleaner.round()
    entries = log.entries()
    # 0..1 is left empty; the rest no longer fit in one 200-byte segment together.
    assert (entries[0].base_offset, entries[0].last_offset) == (0, 3)
    assert len(entries) > 1 and entries[-1].last_offset == 9
    assert all(e.generation == 1 for e in entries)
    for before, after in itertools.pairwise(entries):
        assert after.base_offset == before.last_offset + 1
    assert [offset for offset, _, _ in log.contents()] == [2, 3, 4, 5, 6, 7, 8, 9]


def test_garbage_of_a_topic_created_again_deletes_nothing_of_the_new_one(log: Log) -> None:
    log.write(("a", "1"), ("a", "2"))
    assert log.cleaner.round()
    # The topic is deleted and created again under its name; its first segment has the key
    # the cleaning replaced.
    log.store.put(
        log.keys.topic(TOPIC),
        records.encode(TopicRecord(TOPIC, "another-id", 1, {"cleanup.policy": "compact"})),
    )
    reused = segments.segment_key(NS, TOPIC, 0, 0)
    log.objects.delete(reused)
    log.objects.put_if_absent(reused, b"the new topic's segment")
    garbage = GarbageCollector(log.store, log.objects, log.keys, lambda: log.now)
    assert garbage.sweep(log.now + GRACE_MS) == 1
    assert log.objects.get(reused) == b"the new topic's segment"
    assert log.store.get_prefix(log.keys.garbage) == []
