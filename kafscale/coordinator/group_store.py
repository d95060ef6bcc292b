"""Consumer groups and committed offsets in the metadata store (``GroupStore`` for the group
state machine), each write fenced on the group's coordinator; and loading them back.

One key per group (its membership and assignment as of its last rebalance) and one per committed
partition offset, so a commit writes only what it changes; a commit of many partitions is one
transaction (split in chunks under etcd's default limit of 128 operations per transaction).

Fencing (docs/design/scale-out.md, sections 1 and 7): every transaction also compares the leader
key of the group's ``__consumer_offsets`` partition with this broker's leader record
(``leadership.fence``). A broker that is no longer the group's coordinator -- paused, cut off
from etcd, or its partition claimed by another -- writes nothing: without a leader record, or
when the compare fails, the write raises ``NotCoordinator``. A failed compare is also kept in
``fenced`` for the group service to report to the ownership driver once the state machine is done
with the request (the report closes the partition and so forgets its groups, which must not
happen in the middle of one). A write split in chunks that is fenced after its first chunk leaves
the chunks before it, written while this broker still was the coordinator: the next coordinator
loads them, and the client, answered NOT_COORDINATOR, commits again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kafscale.coordinator import leadership
from kafscale.coordinator.group_model import NotCoordinator
from kafscale.metadata import group_records, records
from kafscale.metadata.group_records import (
    ConsumerGroupKeys,
    ConsumerGroupRecord,
    ConsumerMemberRecord,
)
from kafscale.metadata.records import GroupRecord, Keys, LeaderRecord, OffsetRecord
from kafscale.metadata.store import Delete, DeleteRange, MetadataStore, Operation, Put
from kafscale.metadata.topic_names import OFFSETS_TOPIC

TopicPartition = tuple[str, int]
# A group id -> its __consumer_offsets partition and our leader record of it, or None when this
# broker does not coordinate the group.
Coordinating = Callable[[str], tuple[int, LeaderRecord] | None]
MAX_OPERATIONS = 100


class MetadataGroupStore:
    def __init__(self, store: MetadataStore, namespace: str, coordinating: Coordinating) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.consumer_keys = ConsumerGroupKeys(self.keys.root)
        self.coordinating = coordinating
        self.fenced: list[tuple[int, int]] = []  # (offsets partition, epoch): fences that failed

    def save_group(self, record: GroupRecord) -> None:
        self._apply(
            record.group_id, [Put(self.keys.group(record.group_id), records.encode(record))]
        )

    def delete_group(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._apply(
            group_id,
            [Delete(self.keys.group(group_id))]
            + [Delete(self.keys.offset(group_id, t, p)) for t, p in partitions],
        )

    def save_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None:
        self._apply(
            group_id,
            [
                Put(self.keys.offset(group_id, topic, partition), records.encode(offset))
                for (topic, partition), offset in offsets.items()
            ],
        )

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._apply(group_id, [Delete(self.keys.offset(group_id, t, p)) for t, p in partitions])

    def save_consumer(
        self,
        group_id: str,
        members: Sequence[ConsumerMemberRecord],
        removed: Iterable[str],
        group: ConsumerGroupRecord | None,
        classic: GroupRecord | None = None,
    ) -> None:
        """A consumer group's step: members put and removed, then its group record (last: a
        write split in chunks is complete once the group record is in). ``classic``: the classic
        group of the same id as it is after an upgrade (no members), just before the group
        record."""
        keys = self.consumer_keys
        operations: list[Operation] = [Delete(keys.member(group_id, m)) for m in sorted(removed)]
        operations += [
            Put(keys.member(group_id, m.member_id), group_records.encode(m)) for m in members
        ]
        if classic is not None:
            operations.append(Put(self.keys.group(group_id), records.encode(classic)))
        if group is not None:
            operations.append(Put(keys.group(group_id), group_records.encode(group)))
        self._apply(group_id, operations)

    def delete_consumer(self, group_id: str) -> None:
        """Every key of a consumer group (its offsets stay: ``delete_group`` takes those)."""
        prefix = self.consumer_keys.group_prefix(group_id)  # ends in "/": "0" follows it
        self._apply(group_id, [DeleteRange(prefix, prefix[:-1] + "0")])

    def downgrade_consumer(self, group_id: str, classic: GroupRecord) -> None:
        """A consumer group becomes the classic group ``classic``: every key of the one goes
        and the other's record is put, in one fenced write (its offsets stay)."""
        prefix = self.consumer_keys.group_prefix(group_id)
        self._apply(
            group_id,
            [
                DeleteRange(prefix, prefix[:-1] + "0"),
                Put(self.keys.group(group_id), records.encode(classic)),
            ],
        )

    def load_consumer(
        self, wanted: Callable[[str], bool]
    ) -> dict[str, tuple[ConsumerGroupRecord, list[ConsumerMemberRecord]]]:
        """The stored consumer groups ``wanted(group_id)`` selects. Members of a group without
        a group record (what a deletion fenced halfway left) are left out."""
        groups: dict[str, ConsumerGroupRecord] = {}
        members: dict[str, list[ConsumerMemberRecord]] = {}
        keys = self.consumer_keys
        for kv in self.store.get_prefix(keys.prefix):
            parsed = keys.parse(kv.key)
            if parsed is None or not wanted(parsed[0]):
                continue
            group_id, member_id = parsed
            if member_id is None:
                groups[group_id] = group_records.decode_group(kv.value)
            else:
                members.setdefault(group_id, []).append(group_records.decode_member(kv.value))
        return {g: (record, members.get(g, [])) for g, record in groups.items()}

    def _apply(self, group_id: str, operations: Sequence[Operation]) -> None:
        found = self.coordinating(group_id)
        if found is None:
            raise NotCoordinator(f"this broker does not coordinate group {group_id!r}")
        partition, leader = found
        fence = leadership.fence(self.keys, OFFSETS_TOPIC, partition, leader)
        for start in range(0, len(operations), MAX_OPERATIONS):
            result = self.store.transaction([fence], operations[start : start + MAX_OPERATIONS])
            if not result.succeeded:
                self.fenced.append((partition, leader.epoch))
                raise NotCoordinator(
                    f"{OFFSETS_TOPIC}/{partition} is no longer ours at epoch {leader.epoch}"
                )

    def load(
        self, wanted: Callable[[str], bool]
    ) -> tuple[list[GroupRecord], dict[str, dict[TopicPartition, OffsetRecord]]]:
        """The stored groups and offsets of the groups ``wanted(group_id)`` selects."""
        groups = [
            record
            for kv in self.store.get_prefix(self.keys.groups)
            if wanted((record := records.decode_group(kv.value)).group_id)
        ]
        offsets: dict[str, dict[TopicPartition, OffsetRecord]] = {}
        for kv in self.store.get_prefix(self.keys.offsets):
            parsed = self.keys.parse_offset(kv.key)
            if parsed is not None and wanted(parsed[0]):
                group_id, topic, partition = parsed
                offsets.setdefault(group_id, {})[(topic, partition)] = records.decode_offset(
                    kv.value
                )
        return groups, offsets
