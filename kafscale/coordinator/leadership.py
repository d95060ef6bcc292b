"""The transactions that claim, release and fence a partition's ownership: pure builders.

docs/design/scale-out.md, sections 1 and 2. No I/O: the coordinator reads the records, runs the
transactions and feeds the outcome to its ownership state machine. Invariants:

- A claim succeeds only if the partition has no owner (its leader key is absent), its partition
  record is exactly the one read (``mod_revision``) and its topic still exists as read. It puts the
  leader key on the claimant's lease and the partition record at the next leader epoch, with the
  epoch added to the history at the high watermark. So epochs only grow, and two claimants cannot
  both succeed.
- A release deletes the leader key only if it still holds our exact value.
- ``fence`` is the compare every write on behalf of a partition carries: the leader key holds our
  exact value (owner, epoch, lease). It fails once the lease is gone or anyone claimed since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from kafscale.metadata import epochs, records
from kafscale.metadata.records import Keys, LeaderRecord, PartitionRecord, TopicRecord
from kafscale.metadata.store import Compare, Delete, KeyValue, Operation, Put


class Leaders(Protocol):
    """What committers ask the ownership driver (``coordinator.owners``)."""

    def leader(self, topic: str, partition: int) -> LeaderRecord | None:
        """Our leader record of the partition while we own it (or hand it over), else None."""
        ...

    def fenced(self, topic: str, partition: int, epoch: int) -> None:
        """A write of ours for the partition at ``epoch`` failed its fence."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimTxn:
    topic: str
    partition: int
    leader: LeaderRecord
    record: PartitionRecord  # the partition record the claim writes
    compares: tuple[Compare, ...]
    operations: tuple[Operation, ...]

    @property
    def leader_value(self) -> bytes:
        return records.encode(self.leader)


def claim(
    keys: Keys,
    topic: KeyValue,
    partition: int,
    current: KeyValue | None,
    owner: int,
    lease: int,
    run_id: str,
) -> ClaimTxn:
    """The claim of ``partition`` of the topic whose record is ``topic``, whose partition record
    is ``current`` (None: none committed yet, the first epoch is 0)."""
    topic_record: TopicRecord = records.decode_topic(topic.value)
    if partition < 0 or partition >= topic_record.partitions:
        raise ValueError(f"{topic_record.name} has no partition {partition}")
    if current is None:
        epoch = 0
        record = PartitionRecord(topic_id=topic_record.topic_id)
        history: epochs.History = []
    else:
        record = records.decode_partition(current.value)
        if record.topic_id != topic_record.topic_id:
            raise ValueError(
                f"the record of {topic_record.name}/{partition} belongs to topic id "
                f"{record.topic_id}, not {topic_record.topic_id}"
            )
        history = epochs.history(record.epochs, record.leader_epoch, record.log_start_offset)
        epoch = max(record.leader_epoch, history[-1][0]) + 1
    history = epochs.started(history, epoch, record.high_watermark)
    # A record with an owner but no epoch history was committed by the version before epochs,
    # which set the owner only when committing: carried over, as claims now set the owner.
    committed = record.wal_committed or (record.owner >= 0 and not record.epochs)
    updated = msgspec.structs.replace(
        record, owner=owner, leader_epoch=epoch, epochs=history, wal_committed=committed
    )
    leader = LeaderRecord(owner=owner, epoch=epoch, lease=lease, run_id=run_id)
    name = topic_record.name
    partition_key, leader_key = keys.partition(name, partition), keys.leader(name, partition)
    return ClaimTxn(
        topic=name,
        partition=partition,
        leader=leader,
        record=updated,
        compares=(
            Compare.absent(leader_key),
            Compare(partition_key, mod_revision=current.mod_revision if current else 0),
            Compare(keys.topic(name), mod_revision=topic.mod_revision),
        ),
        operations=(
            Put(leader_key, records.encode(leader), lease),
            Put(partition_key, records.encode(updated)),
        ),
    )


def fence(keys: Keys, topic: str, partition: int, leader: LeaderRecord) -> Compare:
    """The compare that makes a write count only while ``leader`` still owns the partition."""
    return Compare(keys.leader(topic, partition), value=records.encode(leader))


def release(
    keys: Keys, topic: str, partition: int, leader: LeaderRecord
) -> tuple[list[Compare], list[Operation]]:
    """Give the partition up: delete its leader key if it is still ``leader``'s."""
    return [fence(keys, topic, partition, leader)], [Delete(keys.leader(topic, partition))]
