"""Which partitions this shard may serve, from the leader keys (docs/design/scale-out.md, 5-6).

A partition is this shard's to serve when its leader key names this broker on this broker's
lease (``kafscale.metadata.owned``); appends are taken at that key's epoch.

- ``epoch`` is None for a partition we do not own: appends, fetches and offset queries get
  ``NOT_LEADER_OR_FOLLOWER`` (raised as ``NotLeader``).
- ``sealing`` holds the partitions the coordinator is handing over (``SealPartition``): appends
  are refused while the shard commits what it holds, then the partition is unloaded and
  ``PartitionSealed`` answers.
- ``lost`` lists the loaded partitions that the view no longer shows as ours at the epoch they
  were loaded at: the shard closes them (drops their buffers, fails their waiters). A commit the
  coordinator fenced comes to the same end, sooner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kafscale.metadata import records
from kafscale.metadata.owned import Key, OwnedPartitions
from kafscale.metadata.store import MetadataStore


class NotLeader(Exception):
    """This broker does not own the partition (or is handing it over)."""


class ShardLeases(OwnedPartitions):
    def __init__(self, store: MetadataStore, namespace: str, me: int, lease: int) -> None:
        super().__init__(store, namespace, me, lease)
        self.sealing: dict[Key, int] = {}  # partition -> the epoch being handed over
        # Partitions found ours in the store before the view showed it: the key's revision
        # (until the view reaches it, the view's silence about the key means nothing).
        self._read_at: dict[Key, int] = {}

    def require(self, topic: str, partition: int) -> int:
        """Our epoch of the partition; ``NotLeader`` if it is not ours. A partition our view
        does not show as ours yet is looked up in the store: the frontend routes a request
        here once its own view shows our claim, which this view may not have caught up with."""
        epoch = self.epoch(topic, partition)
        if epoch is None:
            epoch = self._read(topic, partition)
        if epoch is None:
            raise NotLeader(f"this broker does not own {topic}/{partition}")
        return epoch

    def _read(self, topic: str, partition: int) -> int | None:
        kv = self.store.get(self.keys.leader(topic, partition))
        if kv is None:
            return None
        leader = records.decode_leader(kv.value)
        if (leader.owner, leader.lease) != (self.me, self.lease):
            return None
        self._read_at[(topic, partition)] = kv.mod_revision
        return leader.epoch

    def require_writable(self, topic: str, partition: int) -> int:
        """As ``require``, and not being handed over."""
        epoch = self.require(topic, partition)
        if self.sealing.get((topic, partition)) == epoch:
            raise NotLeader(f"{topic}/{partition} is being handed over to another broker")
        return epoch

    def lost(self, loaded: Mapping[Key, int]) -> list[Key]:
        """The partitions of ``loaded`` (key -> epoch loaded at) no longer ours at that epoch."""
        revision = self.view.snapshot.revision
        for key, read_at in list(self._read_at.items()):
            if revision >= read_at:
                del self._read_at[key]  # the view has caught up: it decides again
        return [
            key
            for key, epoch in loaded.items()
            if key not in self._read_at and self.epoch(*key) != epoch
        ]

    def forget(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.sealing.pop(key, None)
