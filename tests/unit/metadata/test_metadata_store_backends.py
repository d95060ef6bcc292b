"""Backend-specific tests of ``MetadataStore``, beside the shared contract suite
(``test_metadata_store_contract.py``): SQLite shared by processes (CAS from several processes,
the lease of a SIGKILLed process, a watch lagging past history), the embedded default, and etcd
endpoints and restarts (a lease outlives an etcd outage longer than its TTL).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kafscale.config import load
from kafscale.metadata import (
    EventType,
    MetadataStoreError,
    MetadataStoreUnavailable,
    RevisionCompacted,
    WatchEvent,
    open_metadata_store,
)
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import put_if_absent
from tests.unit.metadata.test_metadata_store_contract import (
    TIMEOUT_S,
    Collector,
    cas_increment,
    wait_until,
)

# -- SQLite: one file, several processes --------------------------------------------------------


def _increment_in_process(path: str, key: str, times: int) -> None:
    store = SqliteMetadataStore(path)
    cas_increment(store, key, times)
    store.close()


def _hold_lease_in_process(path: str, key: str) -> None:
    store = SqliteMetadataStore(path)
    lease = store.grant_lease(2)
    store.put(key, b"held", lease_id=lease.id)
    while True:
        lease.refresh()
        time.sleep(0.2)


def test_sqlite_cas_increments_from_processes_lose_no_update(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    store = SqliteMetadataStore(path)
    spawn = multiprocessing.get_context("spawn")
    workers = [
        spawn.Process(target=_increment_in_process, args=(path, "counter", 30)) for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    cas_increment(store, "counter", 30)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert store.get("counter").value == b"120"  # type: ignore[union-attr]
    store.close()


def test_sqlite_lease_of_killed_process_expires(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    store = SqliteMetadataStore(path)
    seen = Collector()
    watch = store.watch_prefix("brokers/", seen)
    holder = multiprocessing.get_context("spawn").Process(
        target=_hold_lease_in_process, args=(path, "brokers/1")
    )
    holder.start()
    try:
        wait_until(lambda: store.get("brokers/1") is not None, "the child to put its key")
        assert store.get("brokers/1").lease_id != 0  # type: ignore[union-attr]
    finally:
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    seen.wait_for(2)
    assert seen.seen() == [
        (EventType.PUT, "brokers/1", b"held"),
        (EventType.DELETE, "brokers/1", b""),
    ]
    assert store.get("brokers/1") is None
    watch.cancel()
    store.close()


def test_sqlite_watch_lagging_past_history_reports_error(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "m.sqlite"), history_revisions=5)
    entered, release = threading.Event(), threading.Event()
    errors: list[MetadataStoreError] = []

    def slow(event: WatchEvent) -> None:
        entered.set()
        release.wait(TIMEOUT_S)

    watch = store.watch_prefix("", slow, on_error=errors.append)
    store.put("k", b"0")
    assert entered.wait(TIMEOUT_S)
    for value in range(20):
        store.put("k", str(value).encode())
    release.set()
    wait_until(lambda: bool(errors), "on_error")
    assert isinstance(errors[0], RevisionCompacted)
    assert watch.error is errors[0]
    store.close()


def test_open_metadata_store_defaults_to_sqlite_in_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = open_metadata_store(load({"KAFSCALE_DATA_DIR": str(data_dir)}))
    assert store.description == str(data_dir / "metadata.sqlite")
    store.check()
    store.close()


# -- etcd: endpoints and restarts ---------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_etcd_unreachable_names_the_endpoint() -> None:
    endpoint = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(MetadataStoreUnavailable, match=endpoint):
        EtcdMetadataStore([endpoint], timeout=2.0)


def test_etcd_uses_first_reachable_endpoint(etcd_server: Any) -> None:
    store = EtcdMetadataStore([f"127.0.0.1:{_closed_port()}", f"http://{etcd_server.endpoint}"])
    assert store.description == f"etcd://{etcd_server.endpoint}"
    store.check()
    store.close()


def test_etcd_down_then_check_fails_and_watch_resumes(etcd_server: Any) -> None:
    store = EtcdMetadataStore([etcd_server.endpoint], timeout=2.0)
    prefix = f"test-{uuid.uuid4().hex[:12]}/"
    seen = Collector()
    watch = store.watch_prefix(prefix, seen)
    store.put(prefix + "before", b"")
    seen.wait_for(1)
    etcd_server.stop()
    try:
        with pytest.raises(MetadataStoreUnavailable, match=etcd_server.endpoint):
            store.check()
    finally:
        etcd_server.start()

    def put_after() -> bool:
        try:
            store.put(prefix + "after", b"")
        except MetadataStoreUnavailable:
            return False
        return True

    wait_until(put_after, "etcd to come back")
    seen.wait_for(2)
    assert [key for _, key, _ in seen.seen()] == [prefix + "before", prefix + "after"]
    assert watch.last_error is None  # type: ignore[attr-defined]
    store.close()


def test_etcd_lease_outlives_an_outage_longer_than_its_ttl(etcd_server: Any) -> None:
    """What the store lock relies on: etcd does not expire leases while it is down and re-arms
    their TTL when it comes back, so a holder that refreshes again soon keeps its key."""
    store = EtcdMetadataStore([etcd_server.endpoint], timeout=2.0)
    key = f"test-{uuid.uuid4().hex[:12]}/owner"
    lease = store.grant_lease(2)
    assert put_if_absent(store, key, b"held", lease.id) is None
    etcd_server.stop()
    try:
        time.sleep(lease.ttl + 2)  # the outage must outlast the TTL: that is the scenario
    finally:
        etcd_server.start()

    def refreshed() -> bool:
        try:
            lease.refresh()
        except MetadataStoreUnavailable:
            return False
        return True

    wait_until(refreshed, "etcd to come back")
    kv = store.get(key)
    assert kv is not None and (kv.value, kv.lease_id) == (b"held", lease.id)
    lease.revoke()
    store.close()


def test_etcd_compact_forgets_history_below_the_revision_and_keeps_values(
    etcd_server: Any,
) -> None:
    store = EtcdMetadataStore([etcd_server.endpoint])
    prefix = f"test-{uuid.uuid4().hex[:12]}/"
    try:
        first = store.put(prefix + "a", b"1")
        store.put(prefix + "a", b"2")
        mark = store.put(prefix + "b", b"3")
        store.compact(mark)
        store.compact(first)  # already compacted: no error
        store.compact(mark)
        errors: list[MetadataStoreError] = []
        try:
            watch = store.watch_prefix(
                prefix, Collector(), start_revision=first, on_error=errors.append
            )
        except RevisionCompacted as exc:
            assert exc.compact_revision >= mark
        else:  # etcd may report it just after creating the watch
            wait_until(lambda: bool(errors), "on_error")
            assert isinstance(errors[0], RevisionCompacted)
            assert errors[0].compact_revision >= mark
            watch.cancel()
        assert store.get(prefix + "a").value == b"2"  # type: ignore[union-attr]
        assert [kv.value for kv in store.get_prefix(prefix)] == [b"2", b"3"]
    finally:
        store.close()


def test_sqlite_compact_leaves_its_own_pruning_alone(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    try:
        first = store.put("k", b"1")
        store.put("k", b"2")
        store.compact(store.revision())  # SQLite keeps its last history_revisions itself
        events = Collector()
        watch = store.watch_prefix("k", events, start_revision=first)
        assert [e.value for e in events.wait_for(1)] == [b"2"]
        watch.cancel()
    finally:
        store.close()
