"""Contract tests of ``MetadataStore``: one suite, run against SQLite and a real etcd server.

Every test works under its own key prefix, so the etcd variant can share one server. Waiting is
always a deadline loop on a condition, never a bare sleep. ``put_if_absent`` on a lease is the
exclusive lease the store lock is built on (acquire, refused while held, released, expired after
its holder was SIGKILLed). What only one backend has is in ``test_metadata_store_backends.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale.metadata import (
    Compare,
    Delete,
    EventType,
    LeaseExpired,
    MetadataStore,
    MetadataStoreError,
    Put,
    RevisionCompacted,
    WatchEvent,
)
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import put_if_absent

TIMEOUT_S = 15.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Collector:
    """A watch callback that records events and lets a test wait for them."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: WatchEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, count: int) -> list[WatchEvent]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.events) >= count, TIMEOUT_S):
                raise AssertionError(f"expected {count} events, got {self.events}")
            return list(self.events)

    def seen(self) -> list[tuple[EventType, str, bytes]]:
        with self._cond:
            return [(event.type, event.key, event.value) for event in self.events]


@dataclass
class Backend:
    store: MetadataStore
    prefix: str  # unique to the test
    open_another: Callable[[], MetadataStore]  # a second client of the same data
    compact: Callable[[], None]  # drop the change history up to the current revision
    spec: tuple[str, str]  # (kind, path or endpoint): how another process opens the same data


@pytest.fixture(params=["sqlite", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    prefix = f"test-{uuid.uuid4().hex[:12]}/"
    opened: list[MetadataStore] = []

    def track(store: MetadataStore) -> MetadataStore:
        opened.append(store)
        return store

    if request.param == "sqlite":
        path = str(tmp_path / "metadata.sqlite")
        spec = ("sqlite", path)

        def open_store() -> MetadataStore:
            return track(SqliteMetadataStore(path))

        def compact() -> None:
            track(SqliteMetadataStore(path, history_revisions=1)).put(prefix + "~compact", b"")
    else:
        endpoint = request.getfixturevalue("etcd_server").endpoint
        spec = ("etcd", endpoint)

        def open_store() -> MetadataStore:
            return track(EtcdMetadataStore([endpoint]))

        def compact() -> None:
            other = track(EtcdMetadataStore([endpoint]))
            other.compact(other.put(prefix + "~compact", b""))

    yield Backend(open_store(), prefix, open_store, compact, spec)
    for store in opened:
        store.close()


# -- key-value --------------------------------------------------------------------------------


def test_get_put_delete_and_revisions(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "k"
    assert store.get(key) is None
    first = store.put(key, b"one")
    kv = store.get(key)
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease_id) == (
        key,
        b"one",
        first,
        first,
        0,
    )
    second = store.put(key, b"two")
    assert second > first
    assert store.revision() >= second
    kv = store.get(key)
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision) == (
        b"two",
        first,
        second,
    )
    assert store.delete(key) is True
    assert store.get(key) is None
    assert store.delete(key) is False
    third = store.put(key, b"three")  # re-created: a new create_revision
    kv = store.get(key)
    assert kv is not None and kv.create_revision == kv.mod_revision == third > second


def test_get_prefix_is_sorted_and_filtered(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    for key in ["a/z", "a/b", "a/é", "a/a", "ab", "a", "b/a"]:
        store.put(p + key, key.encode())
    assert [kv.key for kv in store.get_prefix(p + "a/")] == [
        p + "a/a",
        p + "a/b",
        p + "a/z",
        p + "a/é",
    ]
    assert [kv.value for kv in store.get_prefix(p + "a")] == [
        b"a",
        b"a/a",
        b"a/b",
        b"a/z",
        "a/é".encode(),
        b"ab",
    ]
    assert store.get_prefix(p + "c") == []


def test_transaction_on_absent_key(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "topic"
    created = store.transaction([Compare.absent(key)], [Put(key, b"v1")], [Put(key + "-x", b"")])
    assert created.succeeded
    kv = store.get(key)
    assert kv is not None and kv.mod_revision == created.revision
    again = store.transaction([Compare.absent(key)], [Put(key, b"v2")], [Put(key + "-x", b"f")])
    assert not again.succeeded
    assert store.get(key).value == b"v1"  # type: ignore[union-attr]
    assert store.get(key + "-x").value == b"f"  # type: ignore[union-attr]


def test_transaction_on_mod_revision(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "epoch"
    stale = store.put(key, b"1")
    current = store.put(key, b"2")
    failed = store.transaction([Compare(key, mod_revision=stale)], [Put(key, b"stale")])
    assert not failed.succeeded and failed.revision >= current
    assert store.get(key).value == b"2"  # type: ignore[union-attr]
    done = store.transaction([Compare(key, mod_revision=current)], [Put(key, b"3")])
    assert done.succeeded and done.revision > current
    assert store.get(key).mod_revision == done.revision  # type: ignore[union-attr]


def test_transaction_on_value(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "owner"
    assert not store.transaction([Compare(key, value=b"")], [Put(key, b"x")]).succeeded
    store.put(key, b"broker-1")
    assert not store.transaction([Compare(key, value=b"broker-2")], [Delete(key)]).succeeded
    assert store.transaction([Compare(key, value=b"broker-1")], [Delete(key)]).succeeded
    assert store.get(key) is None


def test_multi_operation_transaction_is_atomic(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    store.put(p + "gone", b"")
    result = store.transaction(
        [Compare.absent(p + "a")], [Put(p + "a", b"1"), Put(p + "b", b"2"), Delete(p + "gone")]
    )
    assert result.succeeded
    assert [(kv.key, kv.mod_revision) for kv in store.get_prefix(p)] == [
        (p + "a", result.revision),
        (p + "b", result.revision),
    ]
    failed = store.transaction(
        [Compare.absent(p + "a")], [Put(p + "c", b""), Delete(p + "a")], [Put(p + "d", b"")]
    )
    assert not failed.succeeded
    assert [kv.key for kv in store.get_prefix(p)] == [p + "a", p + "b", p + "d"]
    lease = store.grant_lease(30)
    lease.revoke()
    with pytest.raises(LeaseExpired):  # the second put fails, so the first must not happen
        store.transaction([], [Put(p + "e", b""), Put(p + "f", b"", lease_id=lease.id)])
    assert store.get(p + "e") is None


def cas_increment(store: MetadataStore, key: str, times: int) -> None:
    for _ in range(times):
        while True:
            kv = store.get(key)
            value = int(kv.value) if kv else 0
            compare = Compare(key, mod_revision=kv.mod_revision if kv else 0)
            if store.transaction([compare], [Put(key, str(value + 1).encode())]).succeeded:
                break


def test_concurrent_cas_increments_lose_no_update(backend: Backend) -> None:
    key = backend.prefix + "counter"
    threads = [
        threading.Thread(target=cas_increment, args=(backend.store, key, 25)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.store.get(key).value == b"100"  # type: ignore[union-attr]


# -- watches ----------------------------------------------------------------------------------


def test_watch_sees_puts_and_deletes_in_order_under_its_prefix(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    seen = Collector()
    watch = store.watch_prefix(p + "w/", seen)
    store.put(p + "w/a", b"1")
    store.transaction([], [Put(p + "w/b", b"2"), Put(p + "w/c", b"3")])
    store.delete(p + "w/a")
    store.put(p + "other", b"x")
    store.put(p + "w/end", b"")
    events = seen.wait_for(5)
    assert seen.seen() == [
        (EventType.PUT, p + "w/a", b"1"),
        (EventType.PUT, p + "w/b", b"2"),
        (EventType.PUT, p + "w/c", b"3"),
        (EventType.DELETE, p + "w/a", b""),
        (EventType.PUT, p + "w/end", b""),
    ]
    revisions = [event.mod_revision for event in events]
    assert revisions[1] == revisions[2] and revisions == sorted(revisions)
    assert len(set(revisions)) == 4
    watch.cancel()


def test_watch_replays_after_start_revision(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    first = store.put(p + "a", b"1")
    store.put(p + "b", b"2")
    store.delete(p + "a")
    after_first, from_start = Collector(), Collector()
    watches = [
        store.watch_prefix(p, after_first, start_revision=first),
        store.watch_prefix(p, from_start, start_revision=first - 1),
    ]
    after_first.wait_for(2)
    from_start.wait_for(3)
    store.put(p + "c", b"3")
    after_first.wait_for(3)
    assert after_first.seen() == [
        (EventType.PUT, p + "b", b"2"),
        (EventType.DELETE, p + "a", b""),
        (EventType.PUT, p + "c", b"3"),
    ]
    assert from_start.seen()[0] == (EventType.PUT, p + "a", b"1")
    for watch in watches:
        watch.cancel()


def test_cancelled_watch_gets_nothing_more(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    cancelled, live = Collector(), Collector()
    watch = store.watch_prefix(p, cancelled)
    other = store.watch_prefix(p, live)
    store.put(p + "before", b"")
    cancelled.wait_for(1)
    watch.cancel()
    store.put(p + "after", b"")
    live.wait_for(2)
    assert cancelled.seen() == [(EventType.PUT, p + "before", b"")]
    other.cancel()


def test_watch_from_compacted_revision_is_an_error(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    old = store.put(p + "a", b"")
    store.put(p + "b", b"")
    backend.compact()
    errors: list[MetadataStoreError] = []
    try:
        watch = store.watch_prefix(p, Collector(), start_revision=old - 1, on_error=errors.append)
    except RevisionCompacted as exc:
        assert exc.compact_revision > old
    else:  # etcd may report it just after creating the watch
        wait_until(lambda: bool(errors), "on_error")
        assert isinstance(errors[0], RevisionCompacted)
        watch.cancel()


# -- leases -----------------------------------------------------------------------------------


def test_revoked_lease_deletes_its_keys(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "broker"
    lease = store.grant_lease(30)
    seen = Collector()
    watch = store.watch_prefix(backend.prefix, seen)
    store.put(key, b"alive", lease_id=lease.id)
    assert store.get(key).lease_id == lease.id  # type: ignore[union-attr]
    lease.revoke()
    assert store.get(key) is None
    seen.wait_for(2)
    assert seen.seen() == [(EventType.PUT, key, b"alive"), (EventType.DELETE, key, b"")]
    with pytest.raises(LeaseExpired):
        lease.refresh()
    with pytest.raises(LeaseExpired):
        store.put(key, b"again", lease_id=lease.id)
    lease.revoke()  # idempotent
    watch.cancel()


def test_unrefreshed_lease_expires(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "broker"
    lease = store.grant_lease(1)
    assert lease.ttl >= 1
    seen = Collector()
    watch = store.watch_prefix(backend.prefix, seen)
    store.put(key, b"alive", lease_id=lease.id)
    wait_until(lambda: store.get(key) is None, "the leased key to expire")
    seen.wait_for(2)
    assert seen.seen()[1] == (EventType.DELETE, key, b"")
    with pytest.raises(LeaseExpired):
        lease.refresh()
    watch.cancel()


def test_refreshed_lease_keeps_its_keys(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "broker"
    lease = store.grant_lease(2)
    store.put(key, b"alive", lease_id=lease.id)
    until = time.monotonic() + 2.5 * lease.ttl
    while time.monotonic() < until:
        lease.refresh()
        assert store.get(key) is not None
        time.sleep(lease.ttl / 5)
    lease.revoke()
    assert store.get(key) is None


# -- exclusive leases: put_if_absent on a lease --------------------------------------------------


def test_put_if_absent_on_a_lease_is_held_until_released(backend: Backend) -> None:
    first, second, key = backend.store, backend.open_another(), backend.prefix + "owner"
    mine = first.grant_lease(30)
    assert put_if_absent(first, key, b"first", mine.id) is None
    theirs = second.grant_lease(30)
    holder = put_if_absent(second, key, b"second", theirs.id)
    assert holder is not None
    assert (holder.key, holder.value, holder.lease_id) == (key, b"first", mine.id)
    assert put_if_absent(first, key, b"first again", mine.id) is not None  # even to its holder
    assert first.get(key).value == b"first"  # type: ignore[union-attr]
    mine.revoke()  # released: the key goes with the lease
    assert put_if_absent(second, key, b"second", theirs.id) is None
    now = first.get(key)
    assert now is not None and (now.value, now.lease_id) == (b"second", theirs.id)
    theirs.revoke()


def test_put_if_absent_without_a_lease_stays(backend: Backend) -> None:
    store, key = backend.store, backend.prefix + "cluster_id"
    assert put_if_absent(store, key, b"one") is None
    holder = put_if_absent(store, key, b"two")
    assert holder is not None and (holder.value, holder.lease_id) == (b"one", 0)


def test_racing_put_if_absent_has_exactly_one_winner(backend: Backend) -> None:
    key = backend.prefix + "owner"
    clients = [backend.store] + [backend.open_another() for _ in range(3)]
    leases = [client.grant_lease(30) for client in clients]
    results: dict[int, object] = {}
    start = threading.Barrier(len(clients))

    def race(index: int) -> None:
        start.wait()
        results[index] = put_if_absent(clients[index], key, str(index).encode(), leases[index].id)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [index for index, holder in results.items() if holder is None]
    assert len(winners) == 1
    kv = backend.store.get(key)
    assert kv is not None and kv.value == str(winners[0]).encode()
    assert kv.lease_id == leases[winners[0]].id
    for index, holder in results.items():
        if index != winners[0]:
            assert holder == kv  # each loser was told who won
    for lease in leases:
        lease.revoke()


def _hold_exclusive_lease(spec: tuple[str, str], key: str, ttl: int) -> None:
    kind, where = spec
    store: MetadataStore = (
        SqliteMetadataStore(where) if kind == "sqlite" else EtcdMetadataStore([where])
    )
    lease = store.grant_lease(ttl)
    if put_if_absent(store, key, b"held", lease.id) is not None:
        raise SystemExit(f"{key} was already held")
    while True:
        lease.refresh()
        time.sleep(ttl / 4)


def test_exclusive_lease_of_a_sigkilled_holder_expires(backend: Backend) -> None:
    store, key, ttl = backend.store, backend.prefix + "owner", 2
    holder = multiprocessing.get_context("spawn").Process(
        target=_hold_exclusive_lease, args=(backend.spec, key, ttl)
    )
    holder.start()
    try:
        wait_until(lambda: store.get(key) is not None, "the holder to take the lease")
        mine = store.grant_lease(30)
        held = put_if_absent(store, key, b"mine", mine.id)
        assert held is not None and held.value == b"held"
        time.sleep(ttl * 1.5)  # longer than the TTL: the holder's refreshes keep it
        assert put_if_absent(store, key, b"mine", mine.id) is not None
        assert holder.is_alive()
    finally:
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    # No release: the lease runs out within its TTL (etcd may raise it to its minimum).
    wait_until(lambda: put_if_absent(store, key, b"mine", mine.id) is None, "the lease to expire")
    assert store.get(key).lease_id == mine.id  # type: ignore[union-attr]
    mine.revoke()


# -- health and sharing -----------------------------------------------------------------------


def test_check_passes(backend: Backend) -> None:
    backend.store.check()
    assert backend.store.description


def test_two_clients_see_each_others_writes_and_watches(backend: Backend) -> None:
    first, second, p = backend.store, backend.open_another(), backend.prefix
    seen = Collector()
    watch = second.watch_prefix(p, seen)
    revision = first.put(p + "a", b"from first")
    assert second.get(p + "a").mod_revision == revision  # type: ignore[union-attr]
    seen.wait_for(1)
    assert seen.events[0].mod_revision == revision
    deleted = second.transaction([Compare(p + "a", mod_revision=revision)], [Delete(p + "a")])
    assert deleted.succeeded
    assert first.get(p + "a") is None
    seen.wait_for(2)
    watch.cancel()
