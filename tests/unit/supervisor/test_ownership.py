"""The store lock: taken once, refused naming the holder, kept through outages, lost loudly.

``StoreLock`` runs against SQLite and a real etcd (the same lock on either backend); ``acquire``
(both locks, from a ``Config``) against the embedded backends and etcd. Waiting is a deadline
loop on a condition; the only fixed pauses are outages whose length is the scenario.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kafscale.config import Config, load
from kafscale.metadata import records
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.records import BrokerRecord, Keys
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import KeyValue, MetadataStore, MetadataStoreUnavailable
from kafscale.supervisor import ownership
from kafscale.supervisor.ownership import (
    Holding,
    LockLost,
    OwnerRecord,
    StoreLock,
    StoreLocked,
    judge,
)

TIMEOUT_S = 20.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def record(run_id: str, pid: int = 4242, port: int = 9092) -> OwnerRecord:
    return OwnerRecord(
        broker_id=0,
        host="broker-host",
        pid=pid,
        advertised=f"10.0.0.1:{port}",
        metrics_port=port + 1,
        run_id=run_id,
        started_ms=1_700_000_000_000,
    )


@pytest.fixture(params=["sqlite", "etcd"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens clients of one store (each a separate connection, as two brokers would have)."""
    opened: list[MetadataStore] = []

    def open_one() -> MetadataStore:
        if request.param == "sqlite":
            store: MetadataStore = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        else:
            store = EtcdMetadataStore([request.getfixturevalue("etcd_server").endpoint])
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


# -- the pure parts -----------------------------------------------------------------------------


def test_judge() -> None:
    mine = KeyValue("k", b"", 1, 1, lease_id=7)
    other = KeyValue("k", b"", 1, 1, lease_id=8)
    assert judge(None, 7) is Holding.FREE
    assert judge(None, None) is Holding.FREE
    assert judge(mine, 7) is Holding.MINE
    assert judge(other, 7) is Holding.TAKEN
    assert judge(mine, None) is Holding.TAKEN  # our lease is gone: whoever holds it is not us


def test_the_description_names_the_holder() -> None:
    text = record("run-a").describe()
    for part in ("broker 0", "pid 4242", "broker-host", "10.0.0.1:9092", "9093", "run-a"):
        assert part in text
    assert "2023-11-14T22:13:20+00:00" in text
    assert ownership.describe_owner(b"not json").startswith("an unknown holder")


# -- StoreLock on either backend ---------------------------------------------------------------


def test_a_held_lock_is_refused_naming_its_holder(open_store: Callable[[], Any]) -> None:
    ns = namespace()
    first = StoreLock(open_store(), ns, record("run-a"), ttl_s=2)
    first.acquire()
    first.keep(lambda reason: None)  # a running holder refreshes its lease
    second = StoreLock(open_store(), ns, record("run-b", pid=77), ttl_s=2)
    with pytest.raises(StoreLocked) as refused:
        second.acquire()  # waits out the holder's TTL (+2 s): a running holder keeps it
    message = str(refused.value)
    assert f"/kafscale/{ns}/owner" in message
    assert "pid 4242" in message and "10.0.0.1:9092" in message and "run-a" in message
    assert second.lease is None
    first.check()  # untouched
    first.release()
    second.acquire()  # released: free at once
    kv = second.store.get(Keys(ns).owner)
    assert kv is not None and msgspec.json.decode(kv.value, type=OwnerRecord).run_id == "run-b"
    second.release()
    assert second.store.get(Keys(ns).owner) is None


def test_a_crashed_holders_lock_is_taken_once_its_lease_runs_out(
    open_store: Callable[[], Any],
) -> None:
    ns = namespace()
    crashed = StoreLock(open_store(), ns, record("run-a"), ttl_s=2)
    crashed.acquire()  # and never refreshed: as if SIGKILLed
    restarted = StoreLock(open_store(), ns, record("run-b"), ttl_s=2)
    restarted.acquire()
    assert judge(restarted.store.get(restarted.key), restarted.lease.id) is Holding.MINE  # type: ignore[union-attr]
    restarted.release()


def test_check_takes_a_lapsed_lock_again(open_store: Callable[[], Any]) -> None:
    ns = namespace()
    lock = StoreLock(open_store(), ns, record("run-a"), ttl_s=5)
    lock.acquire()
    assert lock.lease is not None
    lock.store.delete(lock.key)  # deleted, lease alive (an operator, say)
    lock.check()
    assert judge(lock.store.get(lock.key), lock.lease.id) is Holding.MINE
    lock.lease.revoke()  # lease gone, key with it (it ran out while the store was away)
    lock.check()
    assert lock.lease is not None
    assert judge(lock.store.get(lock.key), lock.lease.id) is Holding.MINE
    lock.release()


def test_check_reports_a_lock_taken_by_another_broker(open_store: Callable[[], Any]) -> None:
    ns = namespace()
    lock = StoreLock(open_store(), ns, record("run-a"), ttl_s=5)
    lock.acquire()
    assert lock.lease is not None
    lock.lease.revoke()  # lapsed ...
    other = StoreLock(open_store(), ns, record("run-b", pid=99, port=9192), ttl_s=5)
    other.acquire()  # ... and taken by another broker
    with pytest.raises(LockLost) as lost:
        lock.check()
    assert "pid 99" in str(lost.value) and "10.0.0.1:9192" in str(lost.value)
    assert "run-b" in str(lost.value)
    other.check()  # the new holder keeps it
    lock.release()  # releasing a lost lock leaves the new holder's key alone
    assert other.store.get(other.key) is not None
    other.release()


def test_the_keeper_refreshes_and_calls_on_lost_once(open_store: Callable[[], Any]) -> None:
    ns = namespace()
    lock = StoreLock(open_store(), ns, record("run-a"), ttl_s=2)
    lock.acquire()
    calls: list[str] = []
    lock.keep(calls.append)
    time.sleep(3 * lock.ttl_s)  # longer than the TTL: only the keeper's refreshes keep it
    assert lock.lease is not None
    assert judge(lock.store.get(lock.key), lock.lease.id) is Holding.MINE
    assert calls == []
    other = open_store()  # another broker takes it over in one write (as after a lapse)
    other.put(lock.key, msgspec.json.encode(record("run-b", pid=99)), other.grant_lease(5).id)
    wait_until(lambda: bool(calls), "on_lost")
    assert lock.lost == calls[0] and "pid 99" in calls[0]
    time.sleep(lock.ttl_s)  # the keeper has ended: no second call
    assert len(calls) == 1
    lock.release()


def test_a_dead_holders_lock_and_registrations_are_taken_over_at_once(
    open_store: Callable[[], Any],
) -> None:
    ns = namespace()
    store = open_store()
    dead = StoreLock(store, ns, record("run-a"), ttl_s=60)
    dead.acquire()
    registration = BrokerRecord(node_id=0, host="10.0.0.1", port=9092, run_id="run-a")
    lease = store.grant_lease(60)
    store.put(Keys(ns).broker(0), records.encode(registration), lease_id=lease.id)
    # The data directory's flock proved the holder dead: no waiting for a 60 s lease.
    successor = StoreLock(open_store(), ns, record("run-b"), ttl_s=60, holder_is_dead=True)
    successor.acquire()
    assert successor.lease is not None
    assert judge(store.get(successor.key), successor.lease.id) is Holding.MINE
    assert store.get(Keys(ns).broker(0)) is None
    successor.release()
    lease.revoke()


# -- etcd outages ---------------------------------------------------------------------------------


def test_the_lock_survives_an_etcd_outage_longer_than_its_ttl(etcd_server: Any) -> None:
    ns = namespace()
    store = EtcdMetadataStore([etcd_server.endpoint], timeout=1.0)
    lock = StoreLock(store, ns, record("run-a"), ttl_s=2)
    lock.acquire()
    calls: list[str] = []
    lock.keep(calls.append)
    etcd_server.stop()
    try:
        time.sleep(lock.ttl_s + 2)  # the outage outlasts the TTL: that is the scenario
        with pytest.raises(MetadataStoreUnavailable):
            lock.check()
    finally:
        etcd_server.start()

    def confirmed() -> bool:
        try:
            lock.check()
        except MetadataStoreUnavailable:
            return False
        return True

    wait_until(confirmed, "etcd to come back")
    time.sleep(lock.ttl_s)  # the keeper refreshes again
    assert calls == [] and lock.lost is None
    assert lock.lease is not None
    assert judge(store.get(lock.key), lock.lease.id) is Holding.MINE
    lock.release()
    store.close()


def test_the_lock_is_taken_again_after_etcd_paused_longer_than_its_ttl(etcd_server: Any) -> None:
    """A paused etcd (SIGSTOP) keeps its clock: on resume it may expire the lease before the
    keeper's refresh gets in. Nobody else took the key meanwhile, so the keeper takes it again."""
    ns = namespace()
    store = EtcdMetadataStore([etcd_server.endpoint], timeout=1.0)
    lock = StoreLock(store, ns, record("run-a"), ttl_s=2)
    lock.acquire()
    calls: list[str] = []
    lock.keep(calls.append)
    with etcd_server.paused():
        time.sleep(lock.ttl_s + 2)  # the pause outlasts the TTL: that is the scenario

    def held() -> bool:
        try:
            current = store.get(lock.key)
        except MetadataStoreUnavailable:
            return False
        return lock.lease is not None and judge(current, lock.lease.id) is Holding.MINE

    wait_until(held, "the keeper to hold the lock after the pause")
    assert calls == [] and lock.lost is None
    lock.release()
    store.close()


# -- acquire: both locks from the configuration -----------------------------------------------


def config(**values: str) -> Config:
    return load({f"KAFSCALE_{name.upper()}": value for name, value in values.items()})


def test_a_second_broker_on_one_data_dir_is_refused_at_once(tmp_path: Path) -> None:
    first_config = config(data_dir=str(tmp_path / "data"), broker_port="9092", metrics_port="9093")
    (tmp_path / "data").mkdir()
    first_store = SqliteMetadataStore(str(tmp_path / "data" / "metadata.sqlite"))
    first = ownership.acquire(first_config, first_store, "run-a")
    second_config = config(data_dir=str(tmp_path / "data"), broker_port="9192", metrics_port="9193")
    second_store = SqliteMetadataStore(str(tmp_path / "data" / "metadata.sqlite"))
    try:
        with pytest.raises(StoreLocked) as refused:
            ownership.acquire(second_config, second_store, "run-b")
        message = str(refused.value)
        assert str(tmp_path / "data") in message
        assert "127.0.0.1:9092" in message and "metrics port 9093" in message
        assert "run-a" in message and "one data directory, one broker" in message
        first.release()
        second = ownership.acquire(second_config, second_store, "run-b")
        assert second.dir_lock is not None and second.dir_lock.held
        second.release()
    finally:
        first.release()
        first_store.close()
        second_store.close()


def test_with_s3_and_etcd_brokers_share_the_store(etcd_server: Any, tmp_path: Path) -> None:
    # Scale-out: partitions are fenced one by one (leader keys), so the store takes no lock.
    shared = {"s3_bucket": "one-bucket", "etcd_endpoints": etcd_server.endpoint}
    store = EtcdMetadataStore([etcd_server.endpoint])
    ns = namespace()
    first = ownership.acquire(
        config(**shared, data_dir=str(tmp_path / "a"), s3_namespace=ns), store, "run-a"
    )
    second = ownership.acquire(
        config(**shared, data_dir=str(tmp_path / "b"), s3_namespace=ns), store, "run-b"
    )
    for owned in (first, second):
        assert owned.store_lock is None and owned.dir_lock is None and owned.lost is None
        owned.keep(lambda reason: None)
        owned.release()
    assert store.get(Keys(ns).owner) is None
    store.close()


def test_with_etcd_and_local_objects_the_lock_is_per_namespace(
    etcd_server: Any, tmp_path: Path
) -> None:
    # Objects in a data directory are one machine's: one broker per namespace.
    shared = {"etcd_endpoints": etcd_server.endpoint, "store_lock_ttl_ms": "2000"}
    store = EtcdMetadataStore([etcd_server.endpoint])
    ns_a, ns_b = namespace(), namespace()
    first = ownership.acquire(
        config(**shared, data_dir=str(tmp_path / "a"), s3_namespace=ns_a), store, "run-a"
    )
    first.keep(lambda reason: None)
    other_namespace = ownership.acquire(
        config(**shared, data_dir=str(tmp_path / "b"), s3_namespace=ns_b), store, "run-b"
    )
    with pytest.raises(StoreLocked, match="run-a"):
        ownership.acquire(
            config(**shared, data_dir=str(tmp_path / "c"), s3_namespace=ns_a), store, "run-c"
        )
    first.release()
    other_namespace.release()
    store.close()


def test_concurrent_acquires_have_one_winner(etcd_server: Any, tmp_path: Path) -> None:
    ns = namespace()
    stores = [EtcdMetadataStore([etcd_server.endpoint]) for _ in range(4)]
    outcomes: dict[int, ownership.Ownership | Exception] = {}
    start = threading.Barrier(len(stores))

    def contend(index: int) -> None:
        start.wait()
        settings = config(  # etcd with objects in each broker's own data directory
            data_dir=str(tmp_path / str(index)),
            etcd_endpoints=etcd_server.endpoint,
            s3_namespace=ns,
            store_lock_ttl_ms="2000",
        )
        try:
            owned = ownership.acquire(settings, stores[index], f"run-{index}")
            owned.keep(lambda reason: None)  # a running holder refreshes its lease
            outcomes[index] = owned
        except StoreLocked as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes.values() if isinstance(o, ownership.Ownership)]
    assert len(winners) == 1 and len(outcomes) == len(stores)
    winners[0].release()
    for store in stores:
        store.close()
