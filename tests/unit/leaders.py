"""Partition ownership for unit tests that commit without the ownership driver: claims the
partitions in the store exactly as ``coordinator.owners`` does (leader keys on a lease, the
partition record at the new epoch) and answers the committers as it does
(``coordinator.leadership.Leaders``)."""

from __future__ import annotations

from collections.abc import Iterable

from kafscale.coordinator import leadership
from kafscale.metadata.records import Keys, LeaderRecord
from kafscale.metadata.store import MetadataStore


class ClaimedLeaders:
    def __init__(self, store: MetadataStore, namespace: str, broker: int = 1) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.broker = broker
        self.lease = store.grant_lease(600)
        self.held: dict[tuple[str, int], LeaderRecord] = {}
        self.fences: list[tuple[str, int, int]] = []

    def claim(self, topic: str, partitions: Iterable[int]) -> None:
        """Claim ``partitions`` of ``topic`` (whose record must exist); asserts it worked."""
        topic_kv = self.store.get(self.keys.topic(topic))
        assert topic_kv is not None, f"no topic {topic} to claim partitions of"
        for partition in partitions:
            current = self.store.get(self.keys.partition(topic, partition))
            txn = leadership.claim(
                self.keys, topic_kv, partition, current, self.broker, self.lease.id, "test"
            )
            result = self.store.transaction(list(txn.compares), list(txn.operations))
            assert result.succeeded, f"cannot claim {topic}/{partition}"
            self.held[(topic, partition)] = txn.leader
            topic_kv = self.store.get(self.keys.topic(topic))  # unchanged; keep it fresh
            assert topic_kv is not None

    def lose(self, topic: str, partition: int) -> None:
        """As if another broker claimed it: our key goes, we no longer hold it."""
        self.store.delete(self.keys.leader(topic, partition))

    # -- leadership.Leaders --------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> LeaderRecord | None:
        return self.held.get((topic, partition))

    def fenced(self, topic: str, partition: int, epoch: int) -> None:
        self.fences.append((topic, partition, epoch))
        self.held.pop((topic, partition), None)
