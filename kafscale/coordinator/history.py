"""Keeping the metadata store's history bounded (etcd's MVCC keeps every revision of every key
until told to forget; at 100 GB/day over 300 partitions the write path's commits grew etcd's
database by ~0.8 MB/s, past its 2 GiB default quota within the hour, after which etcd refuses
every write).

kube-apiserver's way: every interval, compact to the revision seen one interval earlier, so the
last interval's history (what a lagging watch may still need) is always kept. A watch that fell
further behind gets ``RevisionCompacted`` and reloads, as it would after etcd's own compaction.
With several brokers each may compact; compacting to a revision already compacted is no error.
SQLite prunes its own history; ``compact`` does nothing there.
"""

from __future__ import annotations

import logging

from kafscale.metadata.store import MetadataStore, MetadataStoreError

log = logging.getLogger(__name__)


class HistoryCompactor:
    def __init__(self, store: MetadataStore, interval_ms: int) -> None:
        """``interval_ms`` 0: never (etcd's ``--auto-compaction-retention`` does it)."""
        self.store = store
        self.interval_ms = interval_ms
        self._next_ms: int | None = None
        self._mark: int | None = None  # the revision seen at the previous round

    def maybe_run(self, now_ms: int) -> None:
        """Compact when an interval has passed since the last round (monotonic ``now_ms``)."""
        if self.interval_ms <= 0:
            return
        if self._next_ms is not None and now_ms < self._next_ms:
            return
        self._next_ms = now_ms + self.interval_ms
        try:
            if self._mark is not None:
                self.store.compact(self._mark)
                log.info("metadata history compacted", extra={"revision": self._mark})
            self._mark = self.store.revision()
        except MetadataStoreError as exc:  # an outage: the next round tries again
            log.warning("cannot compact the metadata history", extra={"error": str(exc)})
