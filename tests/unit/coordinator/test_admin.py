"""Topic administration on the embedded backends (real SQLite and a real directory)."""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kafscale.coordinator.admin import MAX_OPERATIONS, TopicAdmin
from kafscale.coordinator.wal_gc import WalReferences
from kafscale.ipc.messages import CreateTopics, DeleteTopics, TopicSpec
from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import TxnResult
from kafscale.metadata.topic_names import name_error
from kafscale.protocol.errors import ErrorCode
from kafscale.storage import wal
from kafscale.storage.local import LocalObjectStore


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[TopicAdmin]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    objects = LocalObjectStore(str(tmp_path / "segments"))
    yield TopicAdmin(store, objects, "ns", default_partitions=2)
    store.close()


def create(admin: TopicAdmin, *specs: TopicSpec) -> list[tuple[str | None, int]]:
    reply = admin.create(CreateTopics(topics=list(specs)))
    return [(r.name, r.error_code) for r in reply.results]


def test_create_writes_a_record_with_a_topic_id(admin: TopicAdmin) -> None:
    reply = admin.create(CreateTopics(topics=[TopicSpec(name="orders", partitions=-1)]))
    [result] = reply.results
    assert result.error_code == 0 and result.partitions == 2
    stored = admin.store.get(Keys("ns").topic("orders"))
    assert stored is not None and stored.mod_revision == reply.revision
    record = records.decode_topic(stored.value)
    assert (record.name, record.partitions, record.topic_id) == ("orders", 2, result.topic_id)
    assert create(admin, TopicSpec(name="orders", partitions=1)) == [
        ("orders", ErrorCode.topic_already_exists)
    ]


def test_validate_only_writes_nothing(admin: TopicAdmin) -> None:
    reply = admin.create(
        CreateTopics(topics=[TopicSpec(name="dry", partitions=3)], validate_only=True)
    )
    assert reply.results[0].error_code == 0 and reply.revision == 0
    assert admin.store.get(Keys("ns").topic("dry")) is None


def test_delete_removes_objects_and_allows_a_clean_re_creation(admin: TopicAdmin) -> None:
    first = admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)])).results[0]
    admin.objects.put_if_absent("ns/t/0/segment-00000000000000000000.kfs", b"old")
    admin.objects.put_if_absent("ns/t2/0/segment-00000000000000000000.kfs", b"other topic")
    reply = admin.delete(DeleteTopics(names=["t", "ghost"]))
    assert [(r.name, r.error_code) for r in reply.results] == [
        ("t", 0),
        ("ghost", ErrorCode.unknown_topic_or_partition),
    ]
    assert [o.key for o in admin.objects.list("ns/")] == [
        "ns/t2/0/segment-00000000000000000000.kfs"
    ]
    assert admin.store.get_prefix(Keys("ns").deleting) == []
    second = admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)])).results[0]
    assert second.error_code == 0 and second.topic_id != first.topic_id


def test_delete_by_topic_id(admin: TopicAdmin) -> None:
    created = admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)])).results[0]
    assert created.topic_id is not None
    reply = admin.delete(
        DeleteTopics(topic_ids=[created.topic_id, "00000000-0000-0000-0000-000000000001"])
    )
    assert [(r.name, r.error_code) for r in reply.results] == [
        ("t", 0),
        (None, ErrorCode.unknown_topic_id),
    ]


def test_interrupted_deletion_blocks_the_name_until_resumed(admin: TopicAdmin) -> None:
    admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)]))
    admin.objects.put_if_absent("ns/t/0/segment-00000000000000000000.kfs", b"old")
    record = records.decode_topic(admin.store.get(Keys("ns").topic("t")).value)  # type: ignore[union-attr]
    assert admin._mark_deleted(record)  # the coordinator dies right after this step
    assert create(admin, TopicSpec(name="t", partitions=1)) == [
        ("t", ErrorCode.topic_already_exists)
    ]
    admin.resume_deletions()  # what a restarted coordinator does first
    assert admin.objects.list("ns/t/") == []
    assert create(admin, TopicSpec(name="t", partitions=1)) == [("t", 0)]


class CountingStore(SqliteMetadataStore):
    """Counts the write round trips a deletion makes."""

    writes = 0

    def delete(self, key: str) -> bool:
        self.writes += 1
        return super().delete(key)

    def transaction(self, *args: Any, **kwargs: Any) -> TxnResult:
        self.writes += 1
        return super().transaction(*args, **kwargs)


class RecordingObjects(LocalObjectStore):
    """Records the batches a deletion hands the object store."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.batches: list[list[str]] = []

    def delete(self, key: str) -> None:
        raise AssertionError(f"{key} deleted on its own, not in a batch")

    def delete_many(self, keys: Sequence[str]) -> None:
        self.batches.append(list(keys))
        for key in keys:
            super().delete(key)


def test_deleting_a_topic_with_many_segments_batches_its_writes(tmp_path: Path) -> None:
    store = CountingStore(str(tmp_path / "metadata.sqlite"))
    # The kgo suite's 20,000-record topic (5,092 objects, 2,546 segment keys) deleted one key at a
    # time held the coordinator for over 30 s: DeleteTopics timed out, the broker lease expired.
    objects = RecordingObjects(str(tmp_path / "segments"))
    admin = TopicAdmin(store, objects, "ns", default_partitions=1)
    keys = Keys("ns")
    admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)]))
    segments = 250
    store.put(keys.partition("t", 0), b"state")
    for base_offset in range(segments):
        store.put(keys.segment("t", 0, base_offset), b"segment")
        objects.put_if_absent(f"ns/t/0/segment-{base_offset:020d}.kfs", b"records")
    store.writes = 0
    reply = admin.delete(DeleteTopics(names=["t"]))
    assert [(r.name, r.error_code) for r in reply.results] == [("t", 0)]
    assert objects.list("ns/") == []
    assert [sorted(batch) for batch in objects.batches] == [
        [f"ns/t/0/segment-{base_offset:020d}.kfs" for base_offset in range(segments)]
    ]
    assert store.get_prefix(keys.topic_segments("t")) == []
    assert store.get_prefix(keys.topic_partitions("t")) == []
    assert store.get_prefix(keys.deleting) == []
    # marker + one partition batch + segment batches of MAX_OPERATIONS + marker removal
    assert store.writes == 3 + -(-segments // MAX_OPERATIONS)
    store.close()


def test_deleting_a_topic_removes_its_references_to_write_ahead_objects(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    objects = LocalObjectStore(str(tmp_path / "segments"))
    keys = Keys("ns")
    shared, own = (wal.object_key("ns", 0, "0123456789abcdef", seq) for seq in range(2))
    admin = TopicAdmin(store, objects, "ns", default_partitions=2)
    admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=2)]))
    admin.create(CreateTopics(topics=[TopicSpec(name="other", partitions=1)]))

    def chunk(topic: str, partition: int, base: int, object_key: str) -> None:
        record = records.SegmentRecord(base, base + 9, 10, 0, 10, 0, 0, object=object_key)
        store.put(keys.segment(topic, partition, base), records.encode(record))

    # shared holds t-0, t-1 and other-0; own only t-0 (150 chunks: more than one batch)
    chunk("t", 0, 0, shared)
    chunk("t", 1, 0, shared)
    chunk("other", 0, 0, shared)
    for n in range(1, 151):
        chunk("t", 0, 10 * n, own)
    store.put(
        keys.segment("t", 1, 10), records.encode(records.SegmentRecord(10, 19, 1, 1, 1, 0, 0))
    )
    store.put(keys.segment("t", 1, 20), b"{damaged")
    for object_key in (shared, own):
        record = records.WalRecord(
            object_key, 10, 0, 0, [("t", 0, 0), ("t", 1, 0), ("other", 0, 0)]
        )
        store.put(keys.wal_object(wal.object_name(object_key)), records.encode(record))
    refs = WalReferences(store, objects, keys)
    refs.load()
    assert (refs.count(shared), refs.count(own)) == (3, 150)
    reply = admin.delete(DeleteTopics(names=["t"]))
    assert [(r.name, r.error_code) for r in reply.results] == [("t", 0)]
    assert store.get_prefix(keys.topic_segments("t")) == []
    # What the WAL garbage collector counts from the store now (it follows it by a watch).
    refs = WalReferences(store, objects, keys)
    refs.load()
    assert (refs.count(shared), refs.count(own)) == (1, 0)
    store.close()


@pytest.mark.parametrize(
    ("name", "legal"),
    [
        ("orders", True),
        ("a.b_c-D9", True),
        ("x" * 249, True),
        ("x" * 250, False),
        ("", False),
        (".", False),
        ("..", False),
        ("with space", False),
        ("slash/", False),
        ("ümlaut", False),
    ],
)
def test_topic_names_follow_kafka(name: str, legal: bool) -> None:
    assert (name_error(name) is None) is legal


def test_internal_topics_get_their_partition_counts_from_the_broker(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    objects = LocalObjectStore(str(tmp_path / "segments"))
    admin = TopicAdmin(store, objects, "ns", default_partitions=2, offsets_partitions=7)
    reply = admin.create(
        CreateTopics(
            topics=[
                TopicSpec(name="__consumer_offsets", partitions=1),  # asked for 1: gets 7
                TopicSpec(name="__transaction_state", partitions=-1),
            ]
        )
    )
    assert [(r.name, r.partitions) for r in reply.results] == [
        ("__consumer_offsets", 7),
        ("__transaction_state", 0),
    ]
    store.close()


def test_a_partitionless_consumer_offsets_topic_gets_its_partitions(admin: TopicAdmin) -> None:
    # an earlier version created __consumer_offsets without partitions: no group had an owner
    key = Keys("ns").topic("__consumer_offsets")
    old = records.TopicRecord(name="__consumer_offsets", topic_id="tid", partitions=0)
    admin.store.put(key, records.encode(old))
    admin.grow_offsets_topic()
    kv = admin.store.get(key)
    assert kv is not None
    grown = records.decode_topic(kv.value)
    assert (grown.topic_id, grown.partitions) == ("tid", admin.offsets_partitions)
    revision = kv.mod_revision
    admin.grow_offsets_topic()  # a count it has is kept
    assert admin.store.get(key).mod_revision == revision  # type: ignore[union-attr]
