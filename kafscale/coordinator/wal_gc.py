"""Garbage collection of write-ahead objects (docs/design/write-path.md, sections 3 and 6).

A write-ahead object holds chunks of many partitions; each committed chunk is a ``SegmentRecord``
naming the object. The coordinator counts, per object that has a ``WalRecord``, the records that
still reference it. Several brokers add and remove those records (each commits, compacts and
merges the partitions it owns; retention and topic deletion run on the chores broker), so the
counts follow the store, not this process: rebuilt from it (``load``, which returns the revision
it read at) and kept exact by a watch on ``segments/`` and ``wal/`` from that revision
(``follow``), which knows each chunk record's object, so a record replaced or deleted takes its
reference away (``added``/``removed`` are the counting steps, without I/O). Events replayed from
before a read change nothing: a put of what was read removes and adds the same reference.

Only the broker holding the chores counts. It ``start``s when it takes them: the load runs on a
thread of its own (it reads every ``WalRecord`` and the chunk records of the partitions they name:
tens of seconds with tens of thousands of them, which must delay neither the coordinator's boot
nor its requests), then the watch follows. ``sweep`` deletes nothing until the load is done. A
broker that loses the chores ``stop``s counting; a watch that ends (its history compacted while
it lagged) makes the next ``sweep`` load again.

An object whose count is 0 is deleted ``WAL_GC_GRACE_MS`` after ``sweep`` first saw it so (a read
that found its chunk just before has that long to finish), then its ``WalRecord``. Only the
broker holding the chores (``coordinator.chores``) sweeps. ``sweep`` does bounded work per call:
at most ``SWEEP_LIMIT`` objects, one DeleteObjects request and one metadata transaction. A failed
delete is retried after ``RETRY_MS``; the object stays counted at 0 meanwhile.

Containment: a ``WalRecord`` that does not decode names no object we could delete: it is left
alone. A segment record that does not decode might reference any object its partition's entries
came from, so those objects are kept (``pinned``) for as long as this coordinator runs. Both are
logged once and counted in ``kafscale_read_faults_total{path="wal_gc"}``.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass

import msgspec

from kafscale import metrics
from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import (
    Delete,
    EventType,
    MetadataStore,
    MetadataStoreError,
    Watch,
    WatchEvent,
)
from kafscale.storage import wal
from kafscale.storage.faults import FaultLog
from kafscale.storage.objects import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

WAL_GC_GRACE_MS = 60_000
SWEEP_LIMIT = 100  # objects per sweep: one DeleteObjects request, one transaction (etcd: 128 ops)
RETRY_MS = 5_000  # after a failed delete (S3 or the metadata store down)
UNDECODABLE = (msgspec.DecodeError, ValueError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class _Counted:
    """The counts as one read of the store found them, at ``revision``."""

    revision: int
    counts: dict[str, int]
    record_keys: dict[str, str]
    objects_of: dict[str, str]
    pinned: set[str]


class WalReferences:
    """Reference counts of the committed write-ahead objects, and their deletion at 0."""

    def __init__(
        self,
        store: MetadataStore,
        objects: ObjectStore,
        keys: Keys,
        grace_ms: int = WAL_GC_GRACE_MS,
    ) -> None:
        self.store = store
        self.objects = objects
        self.keys = keys
        self.grace_ms = grace_ms
        self._counts: dict[str, int] = {}  # object key -> SegmentRecords referencing it
        self._record_keys: dict[str, str] = {}  # object key -> its WalRecord's key
        self._pinned: set[str] = set()  # never deleted by this coordinator (see the docstring)
        self._fresh: dict[str, None] = {}  # at 0 since the last sweep (ordered: a set in order)
        self._since: dict[str, int] = {}  # at 0 since (ms, the sweep that saw it), oldest first
        self._retry_at = 0
        self._faults = FaultLog(log, "wal_gc", metrics.READ_FAULTS.labels("wal_gc").inc)
        self._objects_of: dict[str, str] = {}  # chunk record key -> the object it references
        self._events: collections.deque[WatchEvent] = collections.deque()  # from the watches
        self._watches: list[Watch] = []
        # Between start and stop (the load thread installs its counts under the lock, and only
        # if no stop or start came meanwhile: the generation is unchanged).
        self._lock = threading.Lock()
        self._generation = 0
        self._running = False
        self._ready = False  # counts loaded and followed: sweeps may delete
        self._reload = False  # set by a watch that ended
        self._stopped = threading.Event()  # wakes a load thread waiting to retry

    # -- counting (no I/O) ----------------------------------------------------------------------

    def added(self, object_key: str, count: int) -> None:
        """``count`` more records reference the object (0: its WalRecord exists, unreferenced)."""
        total = self._counts.get(object_key, 0) + count
        self._counts[object_key] = total
        if object_key not in self._record_keys:
            self._record_keys[object_key] = self.keys.wal_object(wal.object_name(object_key))
        if total > 0:
            self._fresh.pop(object_key, None)
            self._since.pop(object_key, None)
        elif object_key not in self._since:
            self._fresh[object_key] = None

    def removed(self, object_key: str, count: int) -> None:
        """``count`` records referencing the object were deleted."""
        if count <= 0:
            return
        known = self._counts.get(object_key)
        if known is None:
            # Its WalRecord did not decode at boot (or a bug): never delete what we cannot count.
            log.warning("references removed from an unknown WAL object", extra={"key": object_key})
            return
        if count > known:
            log.error(
                "more WAL object references removed than counted",
                extra={"key": object_key, "counted": known, "removed": count},
            )
        self._counts[object_key] = max(known - count, 0)
        if self._counts[object_key] == 0 and object_key not in self._since:
            self._fresh[object_key] = None

    def count(self, object_key: str) -> int | None:
        """The object's reference count; None for an object without a (readable) WalRecord."""
        return self._counts.get(object_key)

    def due(self, now_ms: int, limit: int = SWEEP_LIMIT) -> list[str]:
        """Stamp the objects that reached 0 since the last call with ``now_ms``; the oldest ones
        at 0 for the grace period (at most ``limit``), which are no longer tracked as due."""
        for key in self._fresh:
            self._since[key] = now_ms
        self._fresh.clear()
        found: list[str] = []
        for key, since in self._since.items():
            if len(found) == limit or since > now_ms - self.grace_ms:
                break
            found.append(key)
        for key in found:
            del self._since[key]
        return [key for key in found if key not in self._pinned]

    # -- I/O ------------------------------------------------------------------------------------

    def load(self) -> int:
        """Rebuild the counts from the store (``_read``); returns the revision the reads
        started at (``follow`` from there)."""
        counted = self._read()
        self._install(counted)
        return counted.revision

    def _read(self) -> _Counted:
        """Every WalRecord, and the segment lists of the partitions their entries name (each
        partition read once), counted. No state of ours is touched: it runs on the load
        thread."""
        revision = self.store.revision()
        record_keys: dict[str, str] = {}
        named: dict[tuple[str, int], set[str]] = defaultdict(set)
        for kv in self.store.get_prefix(self.keys.wal_objects):
            try:
                record = records.decode_wal(kv.value)
            except UNDECODABLE as exc:
                self._faults.report(kv.key, f"WAL record does not decode: {exc}")
                continue
            record_keys[record.key] = kv.key
            for topic, partition, _ in record.entries:
                named[(topic, partition)].add(record.key)
        counts = dict.fromkeys(record_keys, 0)
        pinned: set[str] = set()
        objects_of: dict[str, str] = {}
        for (topic, partition), named_objects in named.items():
            for kv in self.store.get_prefix(self.keys.segments(topic, partition)):
                try:
                    segment = records.decode_segment(kv.value)
                except UNDECODABLE as exc:
                    self._faults.report(kv.key, f"segment record does not decode: {exc}")
                    pinned |= named_objects
                    continue
                if segment.object in counts:
                    counts[segment.object] += 1
                    objects_of[kv.key] = segment.object
        return _Counted(revision, counts, record_keys, objects_of, pinned)

    def _install(self, counted: _Counted) -> None:
        self._counts = counted.counts
        self._objects_of = counted.objects_of
        self._record_keys = counted.record_keys
        self._pinned = counted.pinned
        self._since = {}
        self._fresh = {key: None for key, count in counted.counts.items() if count == 0}
        log.info(
            "WAL object references loaded",
            extra={
                "objects": len(counted.counts),
                "unreferenced": len(self._fresh),
                "pinned": len(counted.pinned),
            },
        )

    # -- on the chores broker -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Between ``start`` and ``stop``."""
        return self._running

    @property
    def ready(self) -> bool:
        """The counts are loaded and followed: sweeps delete."""
        return self._ready

    def start(self) -> None:
        """Load the counts on a thread of their own, then follow the store from the load's
        revision. A failed load is tried again every ``RETRY_MS`` until ``stop``."""
        self.stop()
        with self._lock:
            self._running = True
            self._stopped = threading.Event()
            generation = self._generation
        threading.Thread(
            target=self._load_and_follow,
            args=(generation, self._stopped),
            name="wal-gc-load",
            daemon=True,
        ).start()

    def _load_and_follow(self, generation: int, stopped: threading.Event) -> None:
        while True:
            try:
                counted = self._read()
                break
            except MetadataStoreError as exc:
                log.warning("cannot load the WAL object references", extra={"error": str(exc)})
            except Exception:  # a bug: logged, tried again (the thread must not end unseen)
                log.exception("loading the WAL object references failed")
            if stopped.wait(RETRY_MS / 1000):
                return
        with self._lock:
            if generation != self._generation:
                return  # stopped (or restarted) meanwhile
            self._install(counted)
            try:
                self.follow(counted.revision)
            except MetadataStoreError as exc:  # the next sweep starts over
                log.warning("cannot watch the WAL object references", extra={"error": str(exc)})
                self._reload = True
                return
            self._ready = True

    def stop(self) -> None:
        """Stop counting (the chores went to another broker, or the coordinator stops): the
        watches end, a load still running is thrown away, and the counts are forgotten."""
        with self._lock:
            self._generation += 1
            self._stopped.set()
            for watch in self._watches:
                watch.cancel()
            self._watches = []
            self._events.clear()
            self._running = self._ready = self._reload = False
            self._counts, self._record_keys, self._objects_of = {}, {}, {}
            self._pinned, self._fresh, self._since = set(), {}, {}

    def follow(self, revision: int) -> None:
        """Keep the counts exact from ``revision`` on: watch every chunk record and WalRecord
        (applied on the caller's thread, at the next ``sweep`` or ``apply``)."""
        for prefix in (self.keys.wal_objects, self.keys.all_segments):
            self._watches.append(
                self.store.watch_prefix(
                    prefix, self._events.append, start_revision=revision, on_error=self._lost
                )
            )

    def _lost(self, error: MetadataStoreError) -> None:
        # The watch ended (its history was compacted while it lagged): counts may be stale
        # from here, so nothing is deleted until they are loaded again (the next sweep).
        log.error("WAL references watch ended: loading them again", extra={"error": str(error)})
        self._reload = True

    def apply(self) -> None:
        """Count what the watches delivered since the last call."""
        while self._events:
            event = self._events.popleft()
            if event.key.startswith(self.keys.wal_objects):
                self._wal_event(event)
            else:
                self._segment_event(event)

    def _wal_event(self, event: WatchEvent) -> None:
        if event.type is not EventType.PUT:
            return  # deleted by a sweep (ours, or a previous chores broker's)
        try:
            record = records.decode_wal(event.value)
        except UNDECODABLE as exc:
            self._faults.report(event.key, f"WAL record does not decode: {exc}")
            return
        if record.key not in self._counts:
            self._record_keys[record.key] = event.key
            self.added(record.key, 0)

    def _segment_event(self, event: WatchEvent) -> None:
        previous = self._objects_of.pop(event.key, None)
        if event.type is EventType.PUT:
            try:
                segment = records.decode_segment(event.value)
            except UNDECODABLE as exc:
                self._faults.report(event.key, f"segment record does not decode: {exc}")
                if previous is not None:
                    self._pinned.add(previous)
                return
            if segment.object:
                self._objects_of[event.key] = segment.object
                self.added(segment.object, 1)
        if previous is not None:
            self.removed(previous, 1)

    def sweep(self, now_ms: int) -> int:
        """Delete the objects at 0 for the grace period (bounded work), then their WalRecords;
        returns how many were deleted. Between ``start`` and the end of its load, nothing."""
        if self._reload:
            self.start()
        if self._running and not self._ready:
            return 0
        self.apply()
        if now_ms < self._retry_at:
            return 0
        doomed = self.due(now_ms)
        if not doomed:
            return 0
        try:
            self.objects.delete_many(doomed)
            self.store.transaction([], [Delete(self._record_keys[key]) for key in doomed])
        except (ObjectStoreError, MetadataStoreError) as exc:
            log.warning(
                "cannot delete unreferenced WAL objects yet",
                extra={"objects": len(doomed), "error": str(exc)},
            )
            self._retry_at = now_ms + RETRY_MS
            self._since = {**dict.fromkeys(doomed, now_ms - self.grace_ms), **self._since}
            return 0
        for key in doomed:
            del self._counts[key]
            del self._record_keys[key]
        log.debug("unreferenced WAL objects deleted", extra={"objects": doomed})
        return len(doomed)
