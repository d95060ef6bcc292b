"""Write path v2 end to end (docs/design/write-path.md): one write-ahead object per flush cycle
whatever the partition count, acks=all group commit, compaction into spec segments, recovery of
an uploaded but uncommitted object, and a bucket written by the previous version read unchanged.

Each test runs a real broker with real clients; the backends are the embedded ones unless the
test is parametrized over both (etcd + MinIO)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store
from kafscale.metadata.records import Keys, SegmentRecord, decode_topic, decode_wal
from kafscale.protocol import records as batches
from kafscale.storage import open_object_store, wal
from kafscale.storage import segment as segments
from tests.harness.stored import StoredReader, committed_entries, committed_records

pytestmark = pytest.mark.integration

TOKEN = "write-path-admin-token"


def s3_requests(broker: Any, operation: str) -> float:
    pattern = rf'^kafscale_s3_requests_total\{{operation="{operation}"\}} (\S+)$'
    found = re.search(pattern, broker.metrics_text(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def metric(broker: Any, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", broker.metrics_text(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def explicit_flush(broker: Any) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kafscale", "flush", "--metrics-url",
         f"http://127.0.0.1:{broker.metrics_port}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KAFSCALE_ADMIN_TOKEN": TOKEN},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert '"flushed": true' in result.stdout


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("backends", ["embedded", "real"])
def test_many_partitions_flush_in_one_object(
    start_broker: Callable[..., Any], backends: str
) -> None:
    """200 partitions with unflushed data, one flush: one PUT, one object, and every partition's
    committed entry is a chunk of that object. Loading the 200 partitions LISTs nothing (a topic
    created now cannot hold a previous version's uncommitted segments)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(
        env={"KAFSCALE_FLUSH_INTERVAL_MS": "3600000", "KAFSCALE_ADMIN_TOKEN": TOKEN},
        backends=backends,
        ready=True,
    )
    partitions = 200
    lists_before = s3_requests(broker, "list")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("wide", partitions, 1)])["wide"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1", "linger.ms": 20})
    for p in range(partitions):
        for i in range(5):
            producer.produce("wide", b"p%d-%d" % (p, i), partition=p)
    assert producer.flush(60) == 0
    puts_before = s3_requests(broker, "put")
    explicit_flush(broker)
    assert s3_requests(broker, "put") - puts_before == 1
    assert s3_requests(broker, "list") == lists_before
    objects = set()
    with StoredReader(broker.env) as stored:
        for p in range(partitions):
            [entry] = stored.entries("wide", p)
            assert entry.is_chunk
            objects.add(entry.record.object)
            assert [r.value for r in stored.records("wide", p)] == [
                b"p%d-%d" % (p, i) for i in range(5)
            ]
    assert len(objects) == 1
    [key] = objects
    assert f"/{wal.WAL_PREFIX}/" in key


def test_acks_all_is_answered_by_group_commit(start_broker: Callable[..., Any]) -> None:
    """With a flush interval of an hour, acks=all requests are still answered: each one that
    waits makes the flusher cut a cycle (group commit), and what is acknowledged is committed."""
    from confluent_kafka import Producer

    broker = start_broker(env={"KAFSCALE_FLUSH_INTERVAL_MS": "3600000"}, ready=True)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 60_000,
        }
    )
    errors: list[Any] = []

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            errors.append(error)

    for i in range(50):
        producer.produce("grouped", b"%d" % i, on_delivery=delivered)
        if i % 10 == 9:
            assert producer.flush(60) == 0
    assert producer.flush(60) == 0
    assert errors == []
    assert [r.value for r in committed_records(broker.env, "grouped", 0)] == [
        b"%d" % i for i in range(50)
    ]
    urgent = re.search(
        r'^kafscale_wal_cuts_total\{reason="urgent"\} (\S+)$', broker.metrics_text(), re.MULTILINE
    )
    assert urgent is not None and float(urgent.group(1)) >= 1


@pytest.mark.parametrize("backends", ["embedded", "real"])
def test_compaction_rewrites_chunks_into_spec_segments(
    start_broker: Callable[..., Any], backends: str
) -> None:
    """Chunks older than KAFSCALE_COMPACTION_MAX_AGE_MS become spec segments: every entry ends
    a segment whose .kfs and .index parse with every CRC checked (`kafscale segments dump`
    accepts them), holding exactly the records produced, and consumers read them all."""
    from confluent_kafka import Producer

    broker = start_broker(
        env={"KAFSCALE_COMPACTION_MAX_AGE_MS": "1000", "KAFSCALE_FLUSH_INTERVAL_MS": "20"},
        backends=backends,
        ready=True,
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2})
    sent = [b"v%05d" % i for i in range(2000)]
    for i, value in enumerate(sent):
        producer.produce("compacted", value)
        if i % 100 == 99:
            producer.flush(60)  # many cycles: many chunks
    assert producer.flush(60) == 0
    wait_for(
        lambda: all(not e.is_chunk for e in committed_entries(broker.env, "compacted", 0)),
        60,
        "compaction of every chunk",
    )
    entries = committed_entries(broker.env, "compacted", 0)
    assert entries and entries[0].record.base_offset == 0
    assert [e.record.base_offset for e in entries[1:]] == [
        e.record.last_offset + 1 for e in entries[:-1]
    ]
    config = configuration.load(broker.env)
    objects = open_object_store(config)
    try:
        for entry in entries:
            kfs = objects.get(entry.key)
            parsed = segments.parse_segment(kfs)  # header, footer, every CRC
            assert (parsed.base_offset, parsed.last_offset) == (
                entry.record.base_offset,
                entry.record.last_offset,
            )
            index = segments.parse_index(
                objects.get(segments.index_key(config.s3_namespace, "compacted", 0,
                                               entry.record.base_offset))
            )  # fmt: skip
            assert index.entries and index.entries[0].offset == entry.record.base_offset
    finally:
        objects.close()
    assert [r.value for r in committed_records(broker.env, "compacted", 0)] == sent
    assert sorted(consume_all(broker.bootstrap, "compacted", 1, len(sent))) == sent
    assert metric(broker, "kafscale_compactions_total") >= 1


@pytest.mark.parametrize("backends", ["embedded", "real"])
def test_a_sweep_seals_sparse_partitions_reading_merged_objects_by_range(
    start_broker: Callable[..., Any], backends: str
) -> None:
    """Many sparse partitions and a small compaction buffer: their chunks go into merged
    objects, each holding a chunk of many partitions. When they age, one sweep seals them all
    into spec segments, reading each merged object with about one ranged GET, not one per
    chunk; every record is in its segment."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(
        env={
            "KAFSCALE_FLUSH_INTERVAL_MS": "20",
            "KAFSCALE_COMPACTION_BUFFER_BYTES": "256KiB",  # merges at 192 KiB
            "KAFSCALE_COMPACTION_MAX_AGE_MS": "20000",
        },
        backends=backends,
        ready=True,
    )
    partitions = 24
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("sparse", partitions, 1)])["sparse"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1", "linger.ms": 5})
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for round_ in range(4):  # within a second: one sweep takes them all
        for p in range(partitions):
            for i in range(10):
                value = b"%d-%d-%d-" % (p, round_, i) + os.urandom(1000)
                sent[p].append(value)
                producer.produce("sparse", value, partition=p)
        assert producer.flush(60) == 0
        time.sleep(0.25)
    wait_for(lambda: metric(broker, "kafscale_compaction_merges_total") >= 2, 30, "merges")
    time.sleep(2)  # what the merges leave settles; nothing is due before the max age
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        wal_records = [
            decode_wal(kv.value) for kv in store.get_prefix(Keys(config.s3_namespace).wal_objects)
        ]
    finally:
        store.close()
    merged = {record.key for record in wal_records if record.merged}
    chunks = [
        entry.record
        for p in range(partitions)
        for entry in committed_entries(broker.env, "sparse", p)
        if entry.is_chunk
    ]
    in_merged = [chunk for chunk in chunks if chunk.object in merged]
    others = {chunk.object for chunk in chunks if chunk.object not in merged}
    # A merged object holds several partitions' chunks: more than the two ranged GETs the sweep
    # may spend on it (how many depends on how far the rounds got before each merge: 3.4 a
    # merged object on average seen on a loaded machine).
    assert len(in_merged) > 2 * len(merged) > 0
    gets_before = s3_requests(broker, "get")
    wait_for(
        lambda: (
            not any(
                entry.is_chunk
                for p in range(partitions)
                for entry in committed_entries(broker.env, "sparse", p)
            )
        ),
        90,
        "the sweep",
    )
    gets = s3_requests(broker, "get") - gets_before
    # a ranged GET per merged object (twice if the sweep was split), a load per other object
    assert gets <= 2 * len(merged) + len(others) < len(in_merged) + len(others)
    for p in range(partitions):
        entries = committed_entries(broker.env, "sparse", p)
        assert all(not entry.is_chunk for entry in entries)
        assert [r.value for r in committed_records(broker.env, "sparse", p)] == sent[p]


def test_compacted_write_ahead_objects_are_deleted(start_broker: Callable[..., Any]) -> None:
    """Once compaction has sealed every chunk, no record references the write-ahead objects
    they were in: the broker running the chores (its references loaded on a thread after it
    took them) deletes them after the grace period, and their WalRecords with them."""
    from confluent_kafka import Producer

    from kafscale.coordinator.wal_gc import WAL_GC_GRACE_MS

    broker = start_broker(
        env={"KAFSCALE_COMPACTION_MAX_AGE_MS": "1000"}, backends="real", ready=True
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    sent = [b"gc-%d" % i for i in range(50)]
    for value in sent:
        producer.produce("collected", value)
        assert producer.flush(30) == 0  # a write-ahead object each
    config = configuration.load(broker.env)
    objects = open_object_store(config)
    store = open_metadata_store(config)
    try:
        prefix = wal.wal_prefix(config.s3_namespace)
        assert len(objects.list(prefix)) >= len(sent)
        wait_for(
            lambda: all(not e.is_chunk for e in committed_entries(broker.env, "collected", 0)),
            60,
            "compaction of every chunk",
        )
        # every record is in a segment now, and nothing else was produced
        wait_for(lambda: not objects.list(prefix), WAL_GC_GRACE_MS / 1000 + 60, "the GC")
        assert not list(store.get_prefix(Keys(config.s3_namespace).wal_objects))
    finally:
        store.close()
        objects.close()
    assert [r.value for r in committed_records(broker.env, "collected", 0)] == sent


def test_the_coordinator_compacts_the_etcd_history(start_broker: Callable[..., Any]) -> None:
    """etcd keeps every revision until told: the coordinator compacts, every
    KAFSCALE_METADATA_COMPACTION_INTERVAL_MS, to the revision of the round before, so that the
    write path's commits do not grow etcd's database without end. Current values stay."""
    from confluent_kafka import Producer

    from kafscale.metadata import MetadataStoreError, RevisionCompacted

    broker = start_broker(
        env={"KAFSCALE_METADATA_COMPACTION_INTERVAL_MS": "1000"}, backends="real", ready=True
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce("history", b"%d" % i)
        assert producer.flush(30) == 0
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        written = store.revision()

        def compacted_past_written() -> bool:
            errors: list[MetadataStoreError] = []
            try:
                watch = store.watch_prefix("~", lambda _: None, 1, on_error=errors.append)
            except RevisionCompacted as exc:
                return exc.compact_revision >= written
            time.sleep(0.2)
            watch.cancel()
            return any(
                isinstance(e, RevisionCompacted) and e.compact_revision >= written for e in errors
            )

        wait_for(compacted_past_written, 30, "a compaction past the produced records")
    finally:
        store.close()
    assert [r.value for r in committed_records(broker.env, "history", 0)] == [
        b"%d" % i for i in range(20)
    ]


def test_an_uploaded_but_uncommitted_object_is_adopted_at_boot(
    start_broker: Callable[..., Any],
) -> None:
    """A write-ahead object in S3 that no commit references (its broker crashed between upload
    and commit) is adopted at the next boot when it continues its partition's log, and removed
    when it does not."""
    from confluent_kafka import Producer

    broker = start_broker(ready=True)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(3):
        producer.produce("orphans", b"before-%d" % i)
    assert producer.flush(30) == 0
    assert broker.terminate() == 0
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    objects = open_object_store(config)
    try:
        found = store.get(Keys(config.s3_namespace).topic("orphans"))
        assert found is not None
        topic_record = decode_topic(found.value)
        token = "0123456789abcdef"
        adopted = _orphan(objects, config, topic_record.topic_id, token, 0, base=3, count=2)
        stale = _orphan(objects, config, topic_record.topic_id, token, 1, base=1, count=1)
    finally:
        objects.close()
        store.close()
    restarted = start_broker(env=broker.env, ready=True)
    values = consume_all(restarted.bootstrap, "orphans", 1, 5)
    assert values == [b"before-0", b"before-1", b"before-2", b"orphan-3", b"orphan-4"]
    objects = open_object_store(config)
    try:
        remaining = {info.key for info in objects.list(wal.wal_prefix(config.s3_namespace))}
        assert adopted in remaining
        assert stale not in remaining
    finally:
        objects.close()


def _orphan(
    objects: Any, config: Any, topic_id: str, token: str, seq: int, base: int, count: int
) -> str:
    """Upload a write-ahead object for partition 0 of "orphans" holding ``count`` records from
    offset ``base``, with no commit: what a broker killed after its upload leaves behind."""
    now = int(time.time() * 1000)
    batch = batches.build_batch(
        [(None, b"orphan-%d" % (base + i), (), now) for i in range(count)], base_offset=base
    )
    header = batches.read_header(batch)
    chunk = wal.ChunkInput(
        topic="orphans", topic_id=topic_id, partition=0, base_offset=base,
        last_offset=base + count - 1, records=count, max_timestamp=header.max_timestamp,
        codec=0, created_ms=now, batches=[batch],
    )  # fmt: skip
    data, _ = wal.build_object([chunk], created_ms=now)
    key = wal.object_key(config.s3_namespace, config.broker_id, token, seq)
    assert objects.put_if_absent(key, data)
    return key


def test_a_bucket_written_by_the_previous_version_is_read_unchanged(
    start_broker: Callable[..., Any],
) -> None:
    """Spec segments and metadata records as the previous version wrote them (no chunk fields,
    no owner, no write_path), and a segment it uploaded at the high watermark but never
    committed: the new broker adopts that segment when it first loads the partition (one LIST),
    serves them all, then appends after them. That append's commit made the partition its own,
    so after a restart the partition loads without a LIST."""
    from confluent_kafka import Producer

    broker = start_broker(ready=True)
    assert broker.terminate() == 0  # a data directory with a cluster id, nothing else
    config = configuration.load(broker.env)
    keys = Keys(config.s3_namespace)
    topic_id = str(uuid.uuid4())
    values = [b"old-%d" % i for i in range(15)]
    store = open_metadata_store(config)
    objects = open_object_store(config)
    try:
        bodies = []
        for first in (0, 5, 10):
            records = [(None, v, (), 1_700_000_000_000) for v in values[first : first + 5]]
            bodies.append((first, batches.build_batch(records, base_offset=first)))
        for first, batch in bodies:
            kfs, index = segments.build_segment([batch], flags=0, created_ms=1_700_000_000_000)
            assert objects.put_if_absent(
                segments.segment_key(config.s3_namespace, "legacy", 0, first), kfs
            )
            assert objects.put_if_absent(
                segments.index_key(config.s3_namespace, "legacy", 0, first), index
            )
            if first == 10:
                continue  # uploaded, then the previous version crashed before the commit
            old_record = {  # the previous version's SegmentRecord: no object/position/codec
                "base_offset": first, "last_offset": first + 4, "size": len(kfs),
                "index_size": len(index), "records": 5,
                "max_timestamp": batches.read_header(batch).max_timestamp,
                "created_ms": 1_700_000_000_000,
            }  # fmt: skip
            store.put(keys.segment("legacy", 0, first), json.dumps(old_record).encode())
        old_topic = {"name": "legacy", "topic_id": topic_id, "partitions": 1, "configs": {},
                     "replication_factor": 1, "created_ms": 1}  # fmt: skip
        store.put(keys.topic("legacy"), json.dumps(old_topic).encode())
        old_partition = {"topic_id": topic_id, "high_watermark": 10, "log_start_offset": 0,
                         "producers": {}}  # fmt: skip
        store.put(keys.partition("legacy", 0), json.dumps(old_partition).encode())
    finally:
        objects.close()
        store.close()
    restarted = start_broker(env=broker.env, ready=True)
    lists_before = s3_requests(restarted, "list")
    assert consume_all(restarted.bootstrap, "legacy", 1, 15) == values
    assert s3_requests(restarted, "list") - lists_before == 1  # the adoption's
    producer = Producer({"bootstrap.servers": restarted.bootstrap, "acks": "all"})
    producer.produce("legacy", b"new-15", partition=0)
    assert producer.flush(30) == 0
    entries = committed_entries(restarted.env, "legacy", 0)
    assert [e.is_chunk for e in entries] == [False, False, False, True]
    assert all(isinstance(e.record, SegmentRecord) for e in entries)
    assert entries[-1].record.base_offset == 15
    assert [r.value for r in committed_records(restarted.env, "legacy", 0)] == [
        *values,
        b"new-15",
    ]
    assert restarted.terminate() == 0
    again = start_broker(env=broker.env, ready=True)
    lists_before = s3_requests(again, "list")
    assert consume_all(again.bootstrap, "legacy", 1, 16) == [*values, b"new-15"]
    assert s3_requests(again, "list") == lists_before
