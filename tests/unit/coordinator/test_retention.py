"""Which segments retention deletes (the pure part of ``kafscale.coordinator.retention``), and
that a record which does not decode costs only its own topic or partition."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import zmq

from kafscale import config as configuration
from kafscale.coordinator.retention import (
    MAX_ENTRIES,
    MAX_SEGMENTS,
    RetentionCleaner,
    expired,
    first_batch,
    limits,
)
from kafscale.coordinator.wal_gc import WalReferences
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys, PartitionRecord, SegmentRecord, TopicRecord
from kafscale.storage import open_object_store, wal
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectStoreError

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


def test_entries_that_end_below_the_log_start_go_whatever_the_limits() -> None:
    assert expired(SEGMENTS, -1, -1, NOW, log_start_offset=10) == SEGMENTS[:1]
    assert expired(SEGMENTS, -1, -1, NOW, log_start_offset=15) == SEGMENTS[:1]  # 10-19 stays
    assert expired(SEGMENTS, -1, -1, NOW, log_start_offset=30) == SEGMENTS
    assert expired(SEGMENTS, 2000, -1, NOW, log_start_offset=10) == SEGMENTS[:2]


@pytest.mark.parametrize(
    ("policy", "retention_bytes", "expected"),
    [
        ("delete", "100", (5, 100)),
        ("compact,delete", "100", (5, 100)),
        ("delete", "-7", (5, -1)),  # any negative size is no limit, as in Kafka
        ("compact", "100", (-1, -1)),  # compact only: nothing expires
        ("", "100", (-1, -1)),  # empty (Kafka 4.3): infinite retention
    ],
)
def test_only_a_delete_policy_expires_by_time_and_size(
    policy: str, retention_bytes: str, expected: tuple[int, int]
) -> None:
    configs = {"cleanup.policy": policy, "retention.ms": "5", "retention.bytes": retention_bytes}
    assert limits(configs) == expected


def chunk(base: int, size: int, max_ts: int, object_key: str = "o") -> SegmentRecord:
    return SegmentRecord(base, base + 9, size, 0, 10, max_ts, 0, object=object_key, position=32)


def test_chunks_and_segments_expire_alike() -> None:
    mixed = [seg(0, 100, NOW - 5000), chunk(10, 100, NOW - 3000), chunk(20, 100, NOW - 1000)]
    assert expired(mixed, 2000, -1, NOW) == mixed[:2]
    assert expired(mixed, -1, 100, NOW) == mixed[:2]


def test_a_round_deletes_a_bounded_prefix() -> None:
    segments_only = [seg(10 * n, 1, 0) for n in range(MAX_SEGMENTS + 50)]
    assert first_batch(segments_only) == segments_only[:MAX_SEGMENTS]
    chunks_only = [chunk(10 * n, 1, 0) for n in range(MAX_ENTRIES + 50)]
    assert first_batch(chunks_only) == chunks_only[:MAX_ENTRIES]
    mixed = [seg(10 * n, 1, 0) if n % 2 else chunk(10 * n, 1, 0) for n in range(400)]
    assert first_batch(mixed) == mixed[: 2 * MAX_SEGMENTS + 1]  # to the 101st segment
    assert first_batch([]) == []


# -- records that do not decode cost only their own topic or partition --------------------------


def test_a_record_that_does_not_decode_costs_only_its_partition(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"})
    keys = Keys(config.s3_namespace)
    store = open_metadata_store(config)
    objects = open_object_store(config)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        topic = TopicRecord("logs", str(uuid.UUID(int=1)), 3, {"retention.ms": "1000"})
        store.put(keys.topic("logs"), records.encode(topic))
        store.put(keys.topic("broken"), b"{not json")
        for partition in range(3):
            state = PartitionRecord(topic_id=topic.topic_id, high_watermark=10)
            store.put(keys.partition("logs", partition), records.encode(state))
            kfs = segments.segment_key(config.s3_namespace, "logs", partition, 0)
            objects.put_if_absent(kfs, b"segment bytes")
            store.put(keys.segment("logs", partition, 0), records.encode(seg(0, 13, NOW - 5000)))
        store.put(keys.segment("logs", 1, 10), b'{"base_offset": "ten"}')  # another version's?
        cleaner = RetentionCleaner(config, store, objects, context, str(tmp_path))
        try:
            with caplog.at_level(logging.DEBUG):
                assert cleaner.run(NOW) == 2  # partitions 0 and 2
                assert cleaner.run(NOW) == 0  # nothing left there; the faults again
        finally:
            cleaner.close()
        faults = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert sorted(r.__dict__["key"] for r in faults) == sorted(
            [keys.topic("broken"), keys.partition("logs", 1)]
        )  # each logged once over two rounds
        ns = config.s3_namespace
        assert not objects.list(segments.segment_prefix(ns, "logs", 0))
        assert objects.list(segments.segment_prefix(ns, "logs", 1))  # its record did not decode
        assert store.get(keys.segment("logs", 1, 0)) is not None
    finally:
        context.term()
        store.close()
        objects.close()


def test_objects_whose_delete_failed_are_deleted_next_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"})
    keys, ns = Keys(config.s3_namespace), config.s3_namespace
    store = open_metadata_store(config)
    objects = open_object_store(config)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        topic = TopicRecord("logs", str(uuid.UUID(int=1)), 2, {"retention.ms": "1000"})
        store.put(keys.topic("logs"), records.encode(topic))
        for partition in range(2):
            state = PartitionRecord(topic_id=topic.topic_id, high_watermark=10)
            store.put(keys.partition("logs", partition), records.encode(state))
            objects.put_if_absent(segments.segment_key(ns, "logs", partition, 0), b"segment")
            store.put(keys.segment("logs", partition, 0), records.encode(seg(0, 7, NOW - 5000)))
        real_delete = objects.delete
        doomed = segments.segment_key(ns, "logs", 0, 0)

        def fails_for_partition_0(key: str) -> None:
            if key == doomed:
                raise ObjectStoreError("S3 is down")
            real_delete(key)

        monkeypatch.setattr(objects, "delete", fails_for_partition_0)
        cleaner = RetentionCleaner(config, store, objects, context, str(tmp_path))
        try:
            assert cleaner.run(NOW) == 2  # both records go; partition 0's object stays
            assert objects.list(segments.segment_prefix(ns, "logs", 0))
            assert not objects.list(segments.segment_prefix(ns, "logs", 1))
            monkeypatch.setattr(objects, "delete", real_delete)
            assert cleaner.run(NOW) == 0
        finally:
            cleaner.close()
        # The leftover of partition 0 was not forgotten when partition 1 was cleaned after it.
        assert not objects.list(segments.segment_prefix(ns, "logs", 0))
    finally:
        context.term()
        store.close()
        objects.close()


def test_retention_drops_chunk_records_and_tells_the_garbage_collector(tmp_path: Path) -> None:
    config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"})
    keys, ns = Keys(config.s3_namespace), config.s3_namespace
    store = open_metadata_store(config)
    objects = open_object_store(config)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    wal_keys = [wal.object_key(ns, 0, "0123456789abcdef", seq) for seq in range(3)]
    try:
        topic = TopicRecord("logs", str(uuid.UUID(int=1)), 1, {"retention.ms": "2000"})
        store.put(keys.topic("logs"), records.encode(topic))
        state = PartitionRecord(topic_id=topic.topic_id, high_watermark=50, owner=0)
        store.put(keys.partition("logs", 0), records.encode(state))
        objects.put_if_absent(segments.segment_key(ns, "logs", 0, 0), b"segment")
        entries = [
            seg(0, 7, NOW - 9000),
            chunk(10, 7, NOW - 8000, wal_keys[0]),
            chunk(20, 7, NOW - 7000, wal_keys[0]),
            chunk(30, 7, NOW - 6000, wal_keys[1]),
            chunk(40, 7, NOW - 1000, wal_keys[2]),  # kept
        ]
        for entry in entries:
            store.put(keys.segment("logs", 0, entry.base_offset), records.encode(entry))
        for object_key in wal_keys:
            objects.put_if_absent(object_key, b"wal object")
            record = records.WalRecord(object_key, 10, 0, 0, [("logs", 0, 0)])
            store.put(keys.wal_object(wal.object_name(object_key)), records.encode(record))
        refs = WalReferences(store, objects, keys)
        refs.load()
        assert [refs.count(k) for k in wal_keys] == [2, 1, 1]
        cleaner = RetentionCleaner(config, store, objects, context, str(tmp_path))
        try:
            assert cleaner.run(NOW) == 4
        finally:
            cleaner.close()
        assert [kv.key for kv in store.get_prefix(keys.segments("logs", 0))] == [
            keys.segment("logs", 0, 40)
        ]
        partition = store.get(keys.partition("logs", 0))
        assert partition is not None
        assert records.decode_partition(partition.value) == PartitionRecord(
            topic_id=topic.topic_id, high_watermark=50, log_start_offset=40, owner=0
        )
        refs = WalReferences(store, objects, keys)  # counted from the store, as the GC does
        refs.load()
        assert [refs.count(k) for k in wal_keys] == [0, 0, 1]
        assert not objects.list(segments.segment_prefix(ns, "logs", 0))
        assert len(objects.list(wal.wal_prefix(ns))) == 3  # the collector's, after its grace
    finally:
        context.term()
        store.close()
        objects.close()
