"""Claiming, releasing and fencing a partition's ownership, run against the embedded store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.coordinator import leadership
from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord, PartitionRecord, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import KeyValue, Put

KEYS = Keys("ns")
TOPIC = TopicRecord(name="orders", topic_id="6f1c1d5e-8f33-4c51-9d0e-6a3d7a1e0f11", partitions=3)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    opened.put(KEYS.topic(TOPIC.name), records.encode(TOPIC))
    yield opened
    opened.close()


def topic_kv(store: SqliteMetadataStore) -> KeyValue:
    kv = store.get(KEYS.topic(TOPIC.name))
    assert kv is not None
    return kv


def claim(store: SqliteMetadataStore, broker: int, partition: int = 0, lease: int = 0):
    lease_id = lease or store.grant_lease(10).id
    txn = leadership.claim(
        KEYS,
        topic_kv(store),
        partition,
        store.get(KEYS.partition(TOPIC.name, partition)),
        broker,
        lease_id,
        f"run-{broker}",
    )
    result = store.transaction(list(txn.compares), list(txn.operations))
    return txn, result.succeeded


def partition_record(store: SqliteMetadataStore, partition: int = 0) -> PartitionRecord:
    kv = store.get(KEYS.partition(TOPIC.name, partition))
    assert kv is not None
    return records.decode_partition(kv.value)


def test_the_first_claim_creates_the_record_at_epoch_0(store):
    txn, ok = claim(store, broker=1)
    assert ok and txn.leader.epoch == 0 and txn.leader.owner == 1
    record = partition_record(store)
    assert (record.owner, record.leader_epoch, record.epochs) == (1, 0, [(0, 0)])
    leader = store.get(KEYS.leader(TOPIC.name, 0))
    assert leader is not None and records.decode_leader(leader.value) == txn.leader
    assert leader.lease_id == txn.leader.lease


def test_an_owned_partition_cannot_be_claimed(store):
    claim(store, broker=1)
    _, ok = claim(store, broker=2)
    assert not ok
    assert partition_record(store).owner == 1


def test_claims_read_before_another_claim_fail(store):
    first = leadership.claim(KEYS, topic_kv(store), 0, None, 1, store.grant_lease(10).id, "a")
    second = leadership.claim(KEYS, topic_kv(store), 0, None, 2, store.grant_lease(10).id, "b")
    assert store.transaction(list(first.compares), list(first.operations)).succeeded
    store.delete(KEYS.leader(TOPIC.name, 0))  # even with the key gone, the record moved on
    assert not store.transaction(list(second.compares), list(second.operations)).succeeded


def test_every_claim_after_a_release_is_a_higher_epoch_starting_at_the_high_watermark(store):
    txn, _ = claim(store, broker=1)
    committed = PartitionRecord(
        topic_id=TOPIC.topic_id, high_watermark=42, owner=1, leader_epoch=0, epochs=[(0, 0)]
    )
    store.put(KEYS.partition(TOPIC.name, 0), records.encode(committed))
    compares, operations = leadership.release(KEYS, TOPIC.name, 0, txn.leader)
    assert store.transaction(compares, operations).succeeded
    second, ok = claim(store, broker=2)
    assert ok and second.leader.epoch == 1
    assert partition_record(store).epochs == [(0, 0), (1, 42)]
    assert partition_record(store).high_watermark == 42


def test_a_record_from_before_epochs_continues_its_epoch(store):
    old = PartitionRecord(topic_id=TOPIC.topic_id, high_watermark=7, owner=0, leader_epoch=0)
    store.put(KEYS.partition(TOPIC.name, 1), records.encode(old))
    txn, ok = claim(store, broker=3, partition=1)
    assert ok and txn.leader.epoch == 1
    assert partition_record(store, 1).epochs == [(0, 0), (1, 7)]


def test_a_fenced_write_fails_once_the_owner_lease_is_gone(store):
    lease = store.grant_lease(10)
    txn, _ = claim(store, broker=1, lease=lease.id)
    fence = leadership.fence(KEYS, TOPIC.name, 0, txn.leader)
    assert store.transaction([fence], [Put("/x", b"1")]).succeeded
    lease.revoke()
    assert store.get(KEYS.leader(TOPIC.name, 0)) is None
    assert not store.transaction([fence], [Put("/x", b"2")]).succeeded


def test_a_fenced_write_fails_after_someone_else_claimed(store):
    txn, _ = claim(store, broker=1)
    store.delete(KEYS.leader(TOPIC.name, 0))  # the lease ran out
    claim(store, broker=2)
    stale = leadership.fence(KEYS, TOPIC.name, 0, txn.leader)
    assert not store.transaction([stale], [Put("/x", b"1")]).succeeded


def test_a_release_only_deletes_our_own_key(store):
    txn, _ = claim(store, broker=1)
    store.delete(KEYS.leader(TOPIC.name, 0))
    claim(store, broker=2)
    compares, operations = leadership.release(KEYS, TOPIC.name, 0, txn.leader)
    assert not store.transaction(compares, operations).succeeded
    assert store.get(KEYS.leader(TOPIC.name, 0)) is not None


def test_a_claim_fails_when_the_topic_changed_under_it(store):
    read = topic_kv(store)
    store.put(KEYS.topic(TOPIC.name), records.encode(TOPIC))  # re-created or re-configured
    txn = leadership.claim(KEYS, read, 0, None, 1, store.grant_lease(10).id, "a")
    assert not store.transaction(list(txn.compares), list(txn.operations)).succeeded


def test_a_partition_the_topic_does_not_have_is_refused(store):
    with pytest.raises(ValueError, match="no partition 3"):
        leadership.claim(KEYS, topic_kv(store), 3, None, 1, 1, "a")


def test_leader_keys_parse_back():
    assert KEYS.parse_leader(KEYS.leader("a.b-c", 12)) == ("a.b-c", 12)
    assert KEYS.parse_leader(KEYS.leaders + "nopartition") is None
    assert KEYS.parse_leader(KEYS.topic("x")) is None
    assert LeaderRecord(owner=1, epoch=2, lease=3, run_id="r") == records.decode_leader(
        records.encode(LeaderRecord(owner=1, epoch=2, lease=3, run_id="r"))
    )


def test_a_record_committed_by_the_version_before_epochs_stays_marked_committed(store):
    # That version set the owner only when it committed; claims set it now, so the claim
    # carries the fact over (the loader skips its LIST for uncommitted legacy segments).
    committed = PartitionRecord(topic_id=TOPIC.topic_id, high_watermark=7, owner=0)
    store.put(KEYS.partition(TOPIC.name, 1), records.encode(committed))
    claim(store, broker=3, partition=1)
    assert partition_record(store, 1).wal_committed
    never = PartitionRecord(topic_id=TOPIC.topic_id, high_watermark=7)  # owner -1: legacy only
    store.put(KEYS.partition(TOPIC.name, 2), records.encode(never))
    claim(store, broker=3, partition=2)
    assert not partition_record(store, 2).wal_committed
