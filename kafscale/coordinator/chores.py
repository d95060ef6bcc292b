"""Which broker runs the cluster-wide chores (docs/design/scale-out.md, section 7).

Retention, the removal of deleted topics' objects, the garbage collection of write-ahead objects
and etcd's history compaction run on one broker: the one whose ``LeaderRecord`` is at the
``chores`` key, put-if-absent on its broker lease. It goes with the lease (a broker that stops or
dies), and any broker that finds the key absent takes it. Checked at most every ``CHECK_MS``.

The chores are safe under a late handover: every write they make is a compare-and-set on the
records it changes (a partition's log start, a deleting topic's marker), and deleting an object
twice is harmless; the garbage collector counts references from the store, not from its own
commits (``coordinator.wal_gc``).
"""

from __future__ import annotations

import logging

from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError, put_if_absent

log = logging.getLogger(__name__)

CHECK_MS = 1_000


class Chores:
    def __init__(self, store: MetadataStore, keys: Keys, me: int, lease: int, run_id: str) -> None:
        self.store = store
        self.key = keys.chores
        self.value = records.encode(LeaderRecord(owner=me, epoch=0, lease=lease, run_id=run_id))
        self.lease = lease
        self._held = False
        self._next_ms = 0

    def held(self, now_ms: int) -> bool:
        """Whether this broker runs the chores now (checked against the store every second)."""
        if now_ms < self._next_ms:
            return self._held
        self._next_ms = now_ms + CHECK_MS
        try:
            existing = self.store.get(self.key)
            if existing is None:
                existing = put_if_absent(self.store, self.key, self.value, self.lease)
        except MetadataStoreError as exc:
            log.warning("cannot check who runs the chores", extra={"error": str(exc)})
            return self._held  # an outage: the chores fail on their own and retry
        held = existing is None or existing.value == self.value
        if held != self._held:
            log.info("running the cluster's chores" if held else "another broker runs the chores")
        self._held = held
        return held
