"""The WAL garbage collector: reference counting (no I/O), rebuilding the counts from the store,
and sweeping unreferenced objects after the grace period (SQLite store, local object store)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.coordinator.wal_gc import RETRY_MS, SWEEP_LIMIT, WAL_GC_GRACE_MS, WalReferences
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys, SegmentRecord, WalRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.storage import open_object_store, wal
from kafscale.storage.objects import ObjectStore, ObjectStoreUnavailable

NS = "default"
TOKEN = "0123456789abcdef"
GRACE = WAL_GC_GRACE_MS


def key(seq: int) -> str:
    return wal.object_key(NS, 0, TOKEN, seq)


def chunk(base: int, object_key: str) -> SegmentRecord:
    return SegmentRecord(base, base + 9, 100, 0, 10, 0, 0, object=object_key, position=32)


class Stores:
    def __init__(self, tmp_path: Path) -> None:
        config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path)})
        assert config.s3_namespace == NS
        self.store: MetadataStore = open_metadata_store(config)
        self.objects: ObjectStore = open_object_store(config)
        self.keys = Keys(NS)

    def refs(self) -> WalReferences:
        return WalReferences(self.store, self.objects, self.keys)

    def commit(self, object_key: str, chunks: Sequence[tuple[str, int, int]]) -> None:
        """What a committed object leaves behind: the object, its WalRecord, chunk records."""
        self.objects.put_if_absent(object_key, b"object bytes")
        record = WalRecord(object_key, 12, 0, 0, [(t, p, base) for t, p, base in chunks])
        self.store.put(self.wal_record(object_key), records.encode(record))
        for topic, partition, base in chunks:
            segment = chunk(base, object_key)
            self.store.put(self.keys.segment(topic, partition, base), records.encode(segment))

    def wal_record(self, object_key: str) -> str:
        return self.keys.wal_object(wal.object_name(object_key))

    def exists(self, object_key: str) -> bool:
        stored = bool(self.objects.list(object_key))
        assert stored == (self.store.get(self.wal_record(object_key)) is not None)
        return stored


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    found = Stores(tmp_path)
    yield found
    found.store.close()
    found.objects.close()


# -- counting (no I/O) ----------------------------------------------------------------------------


def test_an_object_is_due_once_unreferenced_for_the_grace_period(stores: Stores) -> None:
    refs = stores.refs()
    refs.added(key(1), 3)
    assert refs.due(0) == []
    refs.removed(key(1), 2)
    assert refs.due(1000) == []  # still referenced
    refs.removed(key(1), 1)
    assert refs.count(key(1)) == 0
    assert refs.due(2000) == []  # first seen at 0 now: the grace starts
    assert refs.due(2000 + GRACE - 1) == []
    assert refs.due(2000 + GRACE) == [key(1)]
    assert refs.due(10 * GRACE) == []  # handed out once


def test_a_new_reference_cancels_the_countdown(stores: Stores) -> None:
    refs = stores.refs()
    refs.added(key(1), 1)
    refs.removed(key(1), 1)
    assert refs.due(0) == []
    refs.added(key(1), 1)  # e.g. a commit retried after a lost answer
    assert refs.due(GRACE) == []
    refs.removed(key(1), 1)
    assert refs.due(GRACE) == []
    assert refs.due(2 * GRACE) == [key(1)]


def test_an_object_recorded_without_references_is_collected(stores: Stores) -> None:
    refs = stores.refs()
    refs.added(key(1), 0)
    assert refs.due(0) == []
    assert refs.due(GRACE) == [key(1)]


def test_removing_unknown_or_too_many_references_never_goes_below_zero(stores: Stores) -> None:
    refs = stores.refs()
    refs.removed(key(9), 1)  # no WalRecord known: never collected
    assert refs.count(key(9)) is None
    refs.added(key(1), 1)
    refs.removed(key(1), 5)
    assert refs.count(key(1)) == 0
    refs.added(key(1), 1)
    assert refs.count(key(1)) == 1


def test_due_objects_come_oldest_first_and_bounded(stores: Stores) -> None:
    refs = stores.refs()
    for seq in range(SWEEP_LIMIT + 5):
        refs.added(key(seq), 0)
    refs.due(0)
    refs.added(key(1000), 0)
    refs.due(10)
    assert refs.due(GRACE) == [key(seq) for seq in range(SWEEP_LIMIT)]
    assert refs.due(GRACE) == [key(seq) for seq in range(SWEEP_LIMIT, SWEEP_LIMIT + 5)]
    assert refs.due(GRACE + 10) == [key(1000)]


# -- load: the counts rebuilt from the store --------------------------------------------------


def test_load_counts_the_records_still_referencing_each_object(stores: Stores) -> None:
    stores.commit(key(1), [("a", 0, 0), ("a", 1, 0), ("b", 0, 0)])
    stores.commit(key(2), [("a", 0, 10), ("b", 0, 10)])
    stores.commit(key(3), [("a", 0, 20)])
    # compaction replaced a-0's chunks 0 and 10 by one segment; retention dropped b-0@0
    segment = SegmentRecord(0, 19, 300, 40, 20, 0, 0)
    stores.store.put(stores.keys.segment("a", 0, 0), records.encode(segment))
    stores.store.delete(stores.keys.segment("a", 0, 10))
    stores.store.delete(stores.keys.segment("b", 0, 0))
    stores.commit(key(4), [])  # recorded, nothing committed with it
    refs = stores.refs()
    refs.load()
    assert [refs.count(key(seq)) for seq in range(1, 5)] == [1, 1, 1, 0]
    assert refs.due(0) == []
    assert refs.due(GRACE) == [key(4)]


def test_load_keeps_every_object_a_damaged_segment_record_may_reference(stores: Stores) -> None:
    stores.commit(key(1), [("a", 0, 0)])
    stores.commit(key(2), [("a", 0, 10), ("b", 0, 0)])
    stores.commit(key(3), [("b", 0, 10)])
    stores.store.put(stores.keys.segment("a", 0, 20), b"{damaged")
    stores.store.put(stores.wal_record(key(5)), b"{damaged")
    refs = stores.refs()
    refs.load()
    for seq in (1, 2, 3):
        refs.removed(key(seq), 2)
    assert refs.count(key(5)) is None
    refs.due(0)
    assert refs.due(GRACE) == [key(3)]  # 1 and 2 name partition a-0: pinned


# -- sweep: objects, then records ---------------------------------------------------------------


def test_sweep_deletes_the_object_then_its_record_after_the_grace(stores: Stores) -> None:
    stores.commit(key(1), [("a", 0, 0)])
    stores.commit(key(2), [("a", 0, 10)])
    refs = stores.refs()
    refs.load()
    refs.removed(key(1), 1)
    assert refs.sweep(0) == 0
    assert refs.sweep(GRACE - 1) == 0
    assert stores.exists(key(1))
    assert refs.sweep(GRACE) == 1
    assert not stores.exists(key(1))
    assert stores.exists(key(2))
    assert refs.count(key(1)) is None
    fresh = stores.refs()
    fresh.load()  # a restarted coordinator agrees
    assert fresh.count(key(1)) is None
    assert fresh.count(key(2)) == 1


class FailingDeletes:
    """An object store whose deletes fail until ``healed``."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        self.healed = False

    def delete_many(self, keys: Sequence[str]) -> None:
        if not self.healed:
            raise ObjectStoreUnavailable("s3 is down")
        self.objects.delete_many(keys)


def test_a_failed_delete_is_retried_later(stores: Stores) -> None:
    stores.commit(key(1), [("a", 0, 0)])
    failing = FailingDeletes(stores.objects)
    refs = WalReferences(stores.store, failing, stores.keys)  # type: ignore[arg-type]
    refs.load()
    refs.removed(key(1), 1)
    refs.sweep(0)
    assert refs.sweep(GRACE) == 0
    assert stores.exists(key(1))
    failing.healed = True
    assert refs.sweep(GRACE + RETRY_MS - 1) == 0  # backing off
    assert refs.sweep(GRACE + RETRY_MS) == 1
    assert not stores.exists(key(1))


# -- following the store (references added and removed by other brokers) --------------------


def settled(refs: WalReferences, stores: Stores, wanted: dict[str, int]) -> None:
    """Apply the watched events until the counts are ``wanted`` (the watch delivers on its own
    thread; nothing is counted until ``apply``)."""
    deadline = time.monotonic() + 10
    while True:
        refs.apply()
        if {k: refs.count(k) for k in wanted} == wanted or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert {k: refs.count(k) for k in wanted} == wanted


def test_counts_follow_commits_compactions_and_deletions_made_elsewhere(stores: Stores) -> None:
    stores.commit(key(1), [("t", 0, 0), ("t", 0, 10), ("t", 1, 0)])
    refs = stores.refs()
    refs.follow(refs.load())
    try:
        # another broker commits a new object after our load
        stores.commit(key(2), [("t", 2, 0), ("t", 2, 10)])
        settled(refs, stores, {key(1): 3, key(2): 2})
        # ... compacts t/0's two chunks of key(1) into a spec segment (first key replaced,
        # the second deleted), and retention deletes t/2's first chunk of key(2)
        spec = SegmentRecord(0, 19, 4096, 28, 20, 0, 0)
        stores.store.put(stores.keys.segment("t", 0, 0), records.encode(spec))
        stores.store.delete(stores.keys.segment("t", 0, 10))
        stores.store.delete(stores.keys.segment("t", 2, 0))
        settled(refs, stores, {key(1): 1, key(2): 1})
        stores.store.delete(stores.keys.segment("t", 1, 0))
        settled(refs, stores, {key(1): 0, key(2): 1})
        assert refs.sweep(0) == 0  # the grace starts
        assert refs.sweep(GRACE) == 1
        assert not stores.exists(key(1)) and stores.exists(key(2))
    finally:
        refs.stop()


def test_a_replayed_event_changes_nothing(stores: Stores) -> None:
    before = stores.store.revision()
    stores.commit(key(1), [("t", 0, 0), ("t", 0, 10)])  # read by load and replayed by the watch
    refs = stores.refs()
    refs.load()
    refs.follow(before)
    try:
        stores.commit(key(2), [("t", 1, 0)])
        settled(refs, stores, {key(1): 2, key(2): 1})
    finally:
        refs.stop()


# -- on the chores broker: loaded on a thread, stopped, loaded again ------------------------------


def ready(refs: WalReferences) -> None:
    deadline = time.monotonic() + 10
    while not refs.ready and time.monotonic() < deadline:
        time.sleep(0.02)
    assert refs.ready


def test_start_loads_on_a_thread_and_sweeps_nothing_before(stores: Stores) -> None:
    stores.commit(key(1), [("t", 0, 0)])
    stores.commit(key(2), [("t", 1, 0)])
    stores.store.delete(stores.keys.segment("t", 1, 0))  # key(2) is unreferenced at the load
    refs = stores.refs()
    assert not refs.running and not refs.ready
    refs.start()
    try:
        assert refs.running
        ready(refs)
        assert (refs.count(key(1)), refs.count(key(2))) == (1, 0)
        stores.commit(key(3), [("t", 2, 0)])  # followed from the load's revision
        settled(refs, stores, {key(3): 1})
        assert refs.sweep(0) == 0
        assert refs.sweep(GRACE) == 1
        assert not stores.exists(key(2)) and stores.exists(key(1))
    finally:
        refs.stop()


class HeldReads:
    """The store, whose prefix reads wait until ``release`` (a load still running)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.released = threading.Event()

    def get_prefix(self, prefix: str) -> object:
        assert self.released.wait(10)
        return self.store.get_prefix(prefix)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def unreferenced_object_held_load(stores: Stores) -> tuple[HeldReads, WalReferences]:
    """key(1) committed and then unreferenced; references whose load waits for ``released``."""
    stores.commit(key(1), [("t", 0, 0)])
    stores.store.delete(stores.keys.segment("t", 0, 0))
    held = HeldReads(stores.store)
    return held, WalReferences(held, stores.objects, stores.keys)  # type: ignore[arg-type]


def test_a_sweep_before_the_load_is_done_deletes_nothing(stores: Stores) -> None:
    held, refs = unreferenced_object_held_load(stores)
    refs.start()
    try:
        assert refs.sweep(0) == 0
        assert refs.sweep(GRACE * 10) == 0
        assert refs.running and not refs.ready
        held.released.set()
        ready(refs)
        assert refs.sweep(GRACE * 10) == 0  # counted at 0 now: the grace starts
        assert refs.sweep(GRACE * 11) == 1
    finally:
        refs.stop()
    assert not stores.exists(key(1))


def test_stop_forgets_the_counts_and_throws_away_a_load_in_flight(stores: Stores) -> None:
    held, refs = unreferenced_object_held_load(stores)
    refs.start()
    refs.stop()
    held.released.set()  # the load finishes after the stop
    time.sleep(0.3)
    assert not refs.running and not refs.ready
    assert refs.count(key(1)) is None
    assert refs.sweep(GRACE * 10) == 0  # not counting: nothing is due
    assert refs.sweep(GRACE * 20) == 0
    assert stores.exists(key(1))


def test_a_watch_that_ends_makes_the_next_sweep_load_again(stores: Stores) -> None:
    stores.commit(key(1), [("t", 0, 0)])
    refs = stores.refs()
    refs.start()
    try:
        ready(refs)
        refs._lost(MetadataStoreError("required revision has been compacted"))
        stores.store.delete(stores.keys.segment("t", 0, 0))
        assert refs.sweep(0) == 0  # loading again
        ready(refs)
        assert refs.count(key(1)) == 0  # counted afresh from the store
        assert refs.sweep(1) == 0
        assert refs.sweep(GRACE + 1) == 1
    finally:
        refs.stop()


class FailingReads(HeldReads):
    """The store, whose first ``failures`` prefix reads fail (an outage, then a bug)."""

    def __init__(self, store: MetadataStore, failures: list[Exception]) -> None:
        super().__init__(store)
        self.released.set()
        self.failures = failures

    def get_prefix(self, prefix: str) -> object:
        if self.failures:
            raise self.failures.pop(0)
        return self.store.get_prefix(prefix)


def test_a_load_that_fails_is_tried_again(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kafscale.coordinator.wal_gc.RETRY_MS", 50)
    stores.commit(key(1), [("t", 0, 0)])
    failing = FailingReads(stores.store, [MetadataStoreError("etcd is down"), KeyError("a bug")])
    refs = WalReferences(failing, stores.objects, stores.keys)  # type: ignore[arg-type]
    refs.start()
    try:
        ready(refs)
        assert not failing.failures and refs.count(key(1)) == 1
    finally:
        refs.stop()
