"""Recovery of uploaded but uncommitted write-ahead objects: the adoption plan (pure), and
``adopt_orphans`` against a local object store, SQLite and a fake coordinator that commits the
way the real one does (an entry commits only at its partition's high watermark)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import prometheus_client
import pytest

from kafscale import config as configuration
from kafscale.config import Config
from kafscale.flusher.recovery import Committed, Orphan, adopt_orphans, plan_adoption
from kafscale.ipc import messages, write_path
from kafscale.ipc.rpc import Bulk, Reply
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys, PartitionRecord, TopicRecord, WalRecord
from kafscale.metadata.store import MetadataStore
from kafscale.protocol import records as batches
from kafscale.protocol.records import BatchHeader
from kafscale.shards.producers import BatchMetadata, ProducerStates, Verdict
from kafscale.storage import open_object_store, wal
from kafscale.storage.objects import ObjectStore
from kafscale.storage.wal import ChunkInput, DirectoryEntry
from tests.unit.storage.test_segment import make_batches

NS = "default"
OLD_TOKEN, NEW_TOKEN = "ffffffffffffffff", "0000000000000000"  # the newer one lists first
ORDERS = str(uuid.UUID(int=1))
PRODUCERS: write_path.Producers = {7: (0, 5, [(0, 4, 0, 4)])}


class FakeCoordinator:
    """Commits ``CommitObject`` into the store as the coordinator would (one partition at a
    time, at its high watermark), or answers ``ErrorReply`` while ``down``."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.keys = Keys(NS)
        self.requests: list[write_path.CommitObject] = []
        self.down = False
        self.before: Callable[[], None] = lambda: None  # what happens just before a commit

    def call(self, message: messages.Message, bulk: Bulk = (), timeout_ms: int = 1000) -> Reply:
        assert isinstance(message, write_path.CommitObject)
        self.requests.append(message)
        if self.down:
            return Reply(messages.ErrorReply("etcd is unavailable"))
        self.before()
        before = self.store.revision()
        results = [self._commit(chunk) for chunk in message.chunks]
        if self.store.revision() != before:  # the WalRecord goes with the first chunk written
            record_key = self.keys.wal_object(wal.object_name(message.wal.key))
            self.store.put(record_key, records.encode(message.wal))
        return Reply(write_path.ObjectCommitResult(results))

    def _commit(self, chunk: write_path.ObjectChunk) -> write_path.ChunkCommitted:
        key = self.keys.partition(chunk.topic, chunk.partition)
        kv = self.store.get(key)
        assert kv is not None
        state = records.decode_partition(kv.value)
        base, last = chunk.chunk.base_offset, chunk.chunk.last_offset
        committed = state.high_watermark == base
        if committed:
            state = msgspec.structs.replace(
                state, high_watermark=last + 1, producers=chunk.producers
            )
            self.store.put(key, records.encode(state))
            segment_key = self.keys.segment(chunk.topic, chunk.partition, base)
            self.store.put(segment_key, records.encode(chunk.chunk))
        return write_path.ChunkCommitted(
            chunk.topic,
            chunk.partition,
            base,
            committed or last < state.high_watermark,
            state.high_watermark,
            None if committed else "not at the high watermark",
        )


class Broker:
    def __init__(self, tmp_path: Path) -> None:
        self.config: Config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path)})
        assert (self.config.s3_namespace, self.config.broker_id) == (NS, 0)
        self.store = open_metadata_store(self.config)
        self.objects: ObjectStore = open_object_store(self.config)
        self.coordinator = FakeCoordinator(self.store)
        self.keys = Keys(NS)

    def topic(self, name: str, topic_id: str, partitions: int, high_watermark: int) -> None:
        record = TopicRecord(name, topic_id, partitions)
        self.store.put(self.keys.topic(name), records.encode(record))
        for partition in range(partitions):
            state = PartitionRecord(topic_id, high_watermark, producers=PRODUCERS, owner=0)
            self.store.put(self.keys.partition(name, partition), records.encode(state))

    def upload(
        self,
        token: str,
        seq: int,
        created_ms: int,
        chunks: list[tuple[str, int, int, int]],  # topic, partition, base offset, records
        broker_id: int = 0,
        batches_of: Callable[[int, int], list[bytes]] = lambda base, count: make_batches(
            base, [count]
        ),
    ) -> str:
        key = wal.object_key(NS, broker_id, token, seq)
        inputs = [
            ChunkInput(
                topic=topic,
                topic_id=ORDERS,
                partition=partition,
                base_offset=base,
                last_offset=base + count - 1,
                records=count,
                max_timestamp=created_ms,
                codec=0,
                created_ms=created_ms,
                batches=batches_of(base, count),
            )
            for topic, partition, base, count in chunks
        ]
        data, _ = wal.build_object(inputs, created_ms)
        assert self.objects.put_if_absent(key, data)
        return key

    def recover(self) -> None:
        adopt_orphans(self.config, self.objects, self.store, self.coordinator)

    def exists(self, key: str) -> bool:
        return bool(self.objects.list(key))

    def high_watermark(self, topic: str, partition: int) -> int:
        kv = self.store.get(self.keys.partition(topic, partition))
        assert kv is not None
        return records.decode_partition(kv.value).high_watermark

    def wal_record(self, key: str) -> WalRecord | None:
        kv = self.store.get(self.keys.wal_object(wal.object_name(key)))
        return None if kv is None else records.decode_wal(kv.value)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    found = Broker(tmp_path)
    yield found
    found.store.close()
    found.objects.close()


# -- the plan (no I/O) ---------------------------------------------------------------------------


def entry(
    topic: str, partition: int, base: int, count: int, topic_id: str = ORDERS
) -> DirectoryEntry:
    return DirectoryEntry(
        topic, topic_id, partition, base, base + count - 1, 0, 1, count, 0, 0, 0, 0
    )


def header(base: int, count: int, producer_id: int = -1, sequence: int = -1) -> BatchHeader:
    """The header of a batch of ``count`` records at ``base`` (epoch 0 if idempotent)."""
    values = [(None, b"v", (), 1000 + i) for i in range(count)]
    epoch = 0 if producer_id >= 0 else -1
    batch = batches.build_batch(
        values,
        base_offset=base,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    return batches.read_header(batch)


def orphan(key: str, created_ms: int, *entries: DirectoryEntry) -> Orphan:
    """An orphan whose chunks hold one non-idempotent batch each."""
    headers = tuple((header(e.base_offset, e.records),) for e in entries)
    return Orphan(key, 1, created_ms, entries, headers)


def test_the_plan_adopts_runs_from_the_high_watermark_across_orphans() -> None:
    committed = {("o", 0): Committed(ORDERS, 10, {}), ("o", 1): Committed(ORDERS, 0, {})}
    newer = orphan("b", 200, entry("o", 0, 15, 5), entry("o", 1, 0, 3))
    older = orphan("c", 100, entry("o", 0, 10, 3), entry("o", 0, 13, 2), entry("o", 1, 9, 1))
    gone = orphan("a", 300, entry("gone", 0, 0, 1), entry("o", 0, 20, 1, str(uuid.UUID(int=9))))
    plan = plan_adoption([newer, gone, older], committed)
    assert [
        (orphan.key, [(a.entry.partition, a.entry.base_offset) for a in adopted])
        for orphan, adopted in plan
    ] == [
        ("c", [(0, 10), (0, 13)]),  # o-1@9 is not at o-1's high watermark 0
        ("b", [(0, 15), (1, 0)]),
        ("a", []),  # an unknown topic; a topic id that is not the topic's
    ]
    assert all(a.producers == {} for _, adopted in plan for a in adopted)


def test_the_plan_rebuilds_producer_state_from_the_adopted_batches() -> None:
    """Each adoption carries the partition's producer state with the batches of every entry
    adopted before it (in this and older orphans): what the shards load, so a producer
    retrying an adopted batch is answered as a duplicate."""
    committed = {("o", 0): Committed(ORDERS, 10, {7: (0, 5, [(0, 9, 0, 9)])})}
    first = entry("o", 0, 10, 5)
    second = entry("o", 0, 15, 3)
    skipped = entry("o", 0, 40, 1)  # not at the high watermark: its batches do not count
    older = Orphan(
        "a",
        1,
        100,
        (first, skipped),
        ((header(10, 2, 7, 10), header(12, 3, 8, 0)), (header(40, 1, 7, 99),)),
    )
    newer = Orphan("b", 1, 200, (second,), ((header(15, 3, 7, 12),),))
    [(_, [one]), (_, [two])] = plan_adoption([newer, older], committed)
    assert one.producers == {
        7: (0, 1001, [(0, 9, 0, 9), (10, 11, 10, 11)]),
        8: (0, 1002, [(0, 2, 12, 14)]),
    }
    assert two.producers == {
        7: (0, 1002, [(0, 9, 0, 9), (10, 11, 10, 11), (12, 14, 15, 17)]),
        8: (0, 1002, [(0, 2, 12, 14)]),
    }


# -- adopt_orphans -------------------------------------------------------------------------------


def test_entries_at_the_high_watermark_are_adopted_with_one_commit(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.topic("orders", ORDERS, 3, high_watermark=10)
    key = broker.upload(
        OLD_TOKEN,
        4,
        1000,
        [("orders", 0, 10, 5), ("orders", 0, 15, 2), ("orders", 1, 3, 2), ("orders", 2, 10, 1)],
    )
    with caplog.at_level(logging.WARNING):
        broker.recover()
    [request] = broker.coordinator.requests
    assert {c.leader_epoch for c in request.chunks} == {write_path.ANY_EPOCH}  # ours, now
    assert [(c.topic, c.partition, c.chunk.base_offset) for c in request.chunks] == [
        ("orders", 0, 10),
        ("orders", 0, 15),
        ("orders", 2, 10),
    ]
    assert all(c.producers == PRODUCERS and c.topic_id == ORDERS for c in request.chunks)
    data = broker.objects.get(key)
    parsed = wal.parse_object(data)
    for chunk, directory in zip(
        request.chunks, [parsed.entries[i] for i in (0, 1, 3)], strict=True
    ):
        assert chunk.chunk.object == key and chunk.chunk.is_chunk
        assert (chunk.chunk.position, chunk.chunk.size) == (directory.position, directory.size)
        assert (chunk.chunk.last_offset, chunk.chunk.records) == (
            directory.last_offset,
            directory.records,
        )
        assert chunk.chunk.index_size == 0
    assert broker.wal_record(key) == WalRecord(
        key, len(data), 1000, 0, [("orders", 0, 10), ("orders", 0, 15), ("orders", 2, 10)]
    )
    assert [broker.high_watermark("orders", p) for p in range(3)] == [17, 10, 11]
    assert broker.exists(key)
    assert any("with the producer state its batches" in r.getMessage() for r in caplog.records)


def test_an_object_with_nothing_to_adopt_is_deleted(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=10)
    committed_already = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 5, 5)])
    topic_gone = broker.upload(OLD_TOKEN, 1, 1000, [("deleted", 0, 0, 1)])
    empty = broker.upload(OLD_TOKEN, 2, 1000, [])
    broker.recover()
    assert broker.coordinator.requests == []
    for key in (committed_already, topic_gone, empty):
        assert not broker.exists(key)


def test_a_recreated_topic_does_not_adopt_its_predecessor_s_data(broker: Broker) -> None:
    broker.topic("orders", str(uuid.UUID(int=2)), 1, high_watermark=0)
    key = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 0, 5)])  # topic id ORDERS
    broker.recover()
    assert broker.coordinator.requests == []
    assert not broker.exists(key)


def test_committed_objects_and_other_brokers_objects_are_left_alone(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=0)
    committed = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 0, 5)])
    record = WalRecord(committed, 1, 1000, 0, [("orders", 0, 0)])
    broker.store.put(broker.keys.wal_object(wal.object_name(committed)), records.encode(record))
    other = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 0, 5)], broker_id=1)
    broker.recover()
    assert broker.coordinator.requests == []
    assert broker.exists(committed) and broker.exists(other)
    assert broker.high_watermark("orders", 0) == 0


def test_orphans_are_adopted_oldest_first_whatever_their_key_order(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=0)
    newer = broker.upload(NEW_TOKEN, 0, 2000, [("orders", 0, 5, 5)])
    older = broker.upload(OLD_TOKEN, 7, 1000, [("orders", 0, 0, 5)])
    assert newer < older
    broker.recover()
    assert [r.wal.key for r in broker.coordinator.requests] == [older, newer]
    assert broker.high_watermark("orders", 0) == 10
    assert broker.exists(older) and broker.exists(newer)


def test_a_corrupt_object_is_reported_and_never_deleted(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=0)
    key = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 0, 5)])
    data = bytearray(broker.objects.get(key))
    data[-20] ^= 0xFF  # a chunk byte: its CRC no longer holds
    broker.objects.delete(key)
    broker.objects.put_if_absent(key, bytes(data))
    faults = prometheus_client.REGISTRY.get_sample_value(
        "kafscale_read_faults_total", {"path": "recovery"}
    )
    broker.recover()
    assert broker.coordinator.requests == []
    assert broker.exists(key)
    after = prometheus_client.REGISTRY.get_sample_value(
        "kafscale_read_faults_total", {"path": "recovery"}
    )
    assert after == (faults or 0) + 1


def test_a_failed_commit_stops_recovery_and_deletes_nothing(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=0)
    adoptable = broker.upload(OLD_TOKEN, 1, 1000, [("orders", 0, 0, 5)])
    after_it = broker.upload(OLD_TOKEN, 2, 2000, [("orders", 0, 5, 5)])
    stale = broker.upload(OLD_TOKEN, 0, 500, [("gone", 0, 0, 1)])
    broker.coordinator.down = True
    broker.recover()  # logged, not raised: the next boot tries again
    assert len(broker.coordinator.requests) == 1
    assert all(broker.exists(key) for key in (adoptable, after_it, stale))
    broker.coordinator.down = False
    broker.recover()
    assert broker.high_watermark("orders", 0) == 10
    assert broker.exists(adoptable) and broker.exists(after_it) and not broker.exists(stale)


def test_an_object_whose_entries_were_committed_meanwhile_is_deleted(broker: Broker) -> None:
    broker.topic("orders", ORDERS, 1, high_watermark=0)
    key = broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 0, 5)])

    def shard_re_offered_it() -> None:  # through another object, before this commit
        state = PartitionRecord(ORDERS, 5, producers=PRODUCERS, owner=0)
        broker.store.put(broker.keys.partition("orders", 0), records.encode(state))

    broker.coordinator.before = shard_re_offered_it
    broker.recover()
    assert len(broker.coordinator.requests) == 1  # answered committed, nothing written
    assert broker.wal_record(key) is None
    assert not broker.exists(key)


def test_adopted_batches_bring_their_producer_state_into_the_partition(broker: Broker) -> None:
    """A whole-pod crash after the upload: the producer never heard, and retries its batches at
    the next broker; the partition's producer state says they are written (duplicates)."""
    broker.topic("orders", ORDERS, 1, high_watermark=5)  # PRODUCERS: producer 7 wrote 0..4

    def idempotent(base: int, count: int) -> list[bytes]:
        values = [(None, b"v%d" % (base + i), (), 2000) for i in range(count)]
        sequence = base  # producer 7's sequences run with the offsets here
        return [
            batches.build_batch(
                values, base_offset=base, producer_id=7, producer_epoch=0, base_sequence=sequence
            )
        ]

    broker.upload(OLD_TOKEN, 0, 1000, [("orders", 0, 5, 3)], batches_of=idempotent)
    broker.upload(OLD_TOKEN, 1, 1001, [("orders", 0, 8, 2)], batches_of=idempotent)
    broker.recover()
    assert broker.high_watermark("orders", 0) == 10
    kv = broker.store.get(broker.keys.partition("orders", 0))
    assert kv is not None
    producers = ProducerStates.restore(records.decode_partition(kv.value).producers)
    retried = producers.check(7, 0, 5, 2)  # the batch of the first orphan, sent again
    assert retried.verdict == Verdict.DUPLICATE
    assert retried.duplicate_of == BatchMetadata(5, 7, 5, 7)
    assert producers.check(7, 0, 8, 1).verdict == Verdict.DUPLICATE
    assert producers.check(7, 0, 10, 0).verdict == Verdict.APPEND
