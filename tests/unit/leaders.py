"""Partition ownership for unit tests that commit without the ownership driver: claims the
partitions in the store exactly as ``coordinator.owners`` does (leader keys on a lease, the
partition record at the new epoch), answers the committers as it does
(``coordinator.leadership.Leaders``) and tells its listeners (``opened``/``closed``, as
``coordinator.owners.Owners`` tells the group service) when a partition becomes ours or stops
being served by us."""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
        self.opened: list[Callable[[tuple[str, int], LeaderRecord], None]] = []
        self.closed: list[Callable[[tuple[str, int]], None]] = []

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
            for listener in self.opened:
                listener((topic, partition), txn.leader)
            topic_kv = self.store.get(self.keys.topic(topic))  # unchanged; keep it fresh
            assert topic_kv is not None

    def lose(self, topic: str, partition: int) -> None:
        """As if another broker claimed it: our key goes, we no longer hold it (and find out
        only when a write is fenced)."""
        self.store.delete(self.keys.leader(topic, partition))

    def close(self, topic: str, partition: int) -> None:
        """Stop serving the partition (a hand-over starts, or the view showed it lost)."""
        if self.held.pop((topic, partition), None) is not None:
            for listener in self.closed:
                listener((topic, partition))

    # -- leadership.Leaders --------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> LeaderRecord | None:
        return self.held.get((topic, partition))

    def fenced(self, topic: str, partition: int, epoch: int) -> None:
        self.fences.append((topic, partition, epoch))
        held = self.held.get((topic, partition))
        if held is not None and held.epoch == epoch:
            self.close(topic, partition)
