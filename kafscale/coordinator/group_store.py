"""Consumer groups and committed offsets in the metadata store (``GroupStore`` for the group
state machine), and loading them back at start.

One key per group (its membership and assignment as of its last rebalance) and one per committed
partition offset, so a commit writes only what it changes; a commit of many partitions is one
transaction (split in chunks under etcd's default limit of 128 operations per transaction).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kafscale.metadata import records
from kafscale.metadata.records import GroupRecord, Keys, OffsetRecord
from kafscale.metadata.store import Delete, MetadataStore, Operation, Put

TopicPartition = tuple[str, int]
MAX_OPERATIONS = 100


class MetadataGroupStore:
    def __init__(self, store: MetadataStore, namespace: str) -> None:
        self.store = store
        self.keys = Keys(namespace)

    def save_group(self, record: GroupRecord) -> None:
        self.store.put(self.keys.group(record.group_id), records.encode(record))

    def delete_group(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._apply(
            [Delete(self.keys.group(group_id))]
            + [Delete(self.keys.offset(group_id, t, p)) for t, p in partitions]
        )

    def save_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None:
        self._apply(
            [
                Put(self.keys.offset(group_id, topic, partition), records.encode(offset))
                for (topic, partition), offset in offsets.items()
            ]
        )

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        self._apply([Delete(self.keys.offset(group_id, t, p)) for t, p in partitions])

    def _apply(self, operations: Sequence[Operation]) -> None:
        for start in range(0, len(operations), MAX_OPERATIONS):
            self.store.transaction([], operations[start : start + MAX_OPERATIONS])

    def load(
        self,
    ) -> tuple[list[GroupRecord], dict[str, dict[TopicPartition, OffsetRecord]]]:
        groups = [records.decode_group(kv.value) for kv in self.store.get_prefix(self.keys.groups)]
        offsets: dict[str, dict[TopicPartition, OffsetRecord]] = {}
        for kv in self.store.get_prefix(self.keys.offsets):
            parsed = self.keys.parse_offset(kv.key)
            if parsed is not None:
                group_id, topic, partition = parsed
                offsets.setdefault(group_id, {})[(topic, partition)] = records.decode_offset(
                    kv.value
                )
        return groups, offsets
