"""Deleting objects no record refers to any more once their grace has passed: the segments a
cleaning replaced (``kafscale.coordinator.cleanings`` puts a ``GarbageRecord`` for each, in the
transaction that stops every reader from finding them).

On the broker holding the chores, ``sweep`` runs at most every ``SWEEP_INTERVAL_MS``: it reads
the garbage records, deletes the objects of those due (one DeleteObjects request) and then the
records (one transaction, each compared at the revision read). A record whose topic is gone, or
is another topic of the same name now, is dropped without deleting anything: the deletion of
the topic removed its objects, and the new topic's may have the same keys. An object store
failure leaves the records for the next sweep; deleting an object twice (a chores hand-over
between the deletes and the transaction) is harmless. At most ``SWEEP_LIMIT`` records per sweep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, Delete, MetadataStore, MetadataStoreError
from kafscale.storage.objects import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

SWEEP_INTERVAL_MS = 5_000
SWEEP_LIMIT = 40  # records per sweep: a transaction of 2 x 40 operations (etcd allows 128)


class GarbageCollector:
    def __init__(
        self,
        store: MetadataStore,
        objects: ObjectStore,
        keys: Keys,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.objects = objects
        self.keys = keys
        self.clock = clock
        self._next_ms = 0

    def maybe_sweep(self) -> int:
        """Sweep if it is time; the number of records whose objects were deleted."""
        now = self.clock()
        if now < self._next_ms:
            return 0
        self._next_ms = now + SWEEP_INTERVAL_MS
        try:
            return self.sweep(now)
        except (MetadataStoreError, ObjectStoreError) as exc:
            log.warning("cannot delete replaced objects now", extra={"error": str(exc)})
            return 0

    def sweep(self, now_ms: int) -> int:
        due = []
        for kv in self.store.get_prefix(self.keys.garbage):
            try:
                record = records.decode_garbage(kv.value)
            except msgspec.DecodeError:
                log.warning("a garbage record does not decode; left alone", extra={"key": kv.key})
                continue
            if record.due_ms <= now_ms:
                due.append((kv, record))
                if len(due) == SWEEP_LIMIT:
                    break
        if not due:
            return 0
        ids: dict[str, str | None] = {}
        for _, record in due:
            if record.topic not in ids:
                found = self.store.get(self.keys.topic(record.topic))
                ids[record.topic] = None if found is None else topic_id(found.value)
        doomed = [key for _, r in due if ids[r.topic] == r.topic_id for key in r.objects]
        if doomed:
            self.objects.delete_many(doomed)
        self.store.transaction(
            [Compare(kv.key, mod_revision=kv.mod_revision) for kv, _ in due],
            [Delete(kv.key) for kv, _ in due],
        )
        log.info("replaced objects deleted", extra={"records": len(due), "objects": len(doomed)})
        return len(due)


def topic_id(value: bytes) -> str | None:
    """The id in a topic record; None if it does not decode (its objects are then left)."""
    try:
        return records.decode_topic(value).topic_id
    except msgspec.DecodeError:
        return None
