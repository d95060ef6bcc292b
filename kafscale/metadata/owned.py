"""The partitions this broker owns, for a process that follows the leader keys itself.

docs/design/scale-out.md, section 5: the coordinator claims and releases partitions; the other
processes of the broker (shards, the flusher's compactor) follow the result, not the coordinator's
messages, through their own watched view of ``leaders/``. A partition is this broker's when its
leader key names this broker on this broker's lease (a key of an earlier run of the same broker id
is not). Following the keys means a respawned process misses nothing.
"""

from __future__ import annotations

from kafscale.metadata.records import Keys
from kafscale.metadata.store import MetadataStore
from kafscale.metadata.view import MetadataView

Key = tuple[str, int]


class OwnedPartitions:
    def __init__(self, store: MetadataStore, namespace: str, me: int, lease: int) -> None:
        self.me, self.lease = me, lease
        self.store, self.keys = store, Keys(namespace)
        self.view = MetadataView(store, namespace, prefix=self.keys.leaders)
        self._seen_revision = -1

    def start(self) -> None:
        self.view.start()

    def stop(self) -> None:
        self.view.stop()

    def epoch(self, topic: str, partition: int) -> int | None:
        """Our leader epoch of the partition, or None if it is not ours."""
        leader = self.view.snapshot.leaders.get((topic, partition))
        if leader is None or leader.owner != self.me or leader.lease != self.lease:
            return None
        return leader.epoch

    def partitions(self) -> set[Key]:
        """Every partition that is ours now."""
        return {
            key
            for key, leader in self.view.snapshot.leaders.items()
            if leader.owner == self.me and leader.lease == self.lease
        }

    def changed(self) -> bool:
        """Whether the view moved since the last call."""
        revision = self.view.snapshot.revision
        moved, self._seen_revision = revision != self._seen_revision, revision
        return moved
