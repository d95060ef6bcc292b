"""Broker registration is put-if-absent: two runs never share a node id (embedded SQLite store)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.coordinator.registry import BrokerIdTaken, BrokerRegistration
from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys
from kafscale.metadata.sqlite import SqliteMetadataStore

KEYS = Keys("ns")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    yield opened
    opened.close()


def broker(run_id: str, port: int = 9092) -> BrokerRecord:
    return BrokerRecord(node_id=0, host="10.0.0.1", port=port, run_id=run_id)


def registered(store: SqliteMetadataStore) -> BrokerRecord | None:
    kv = store.get(KEYS.broker(0))
    return None if kv is None else records.decode_broker(kv.value)


def test_a_registration_needs_a_run_id(store: SqliteMetadataStore) -> None:
    with pytest.raises(ValueError, match="run_id"):
        BrokerRegistration(store, KEYS, broker(""))


def test_another_run_cannot_take_a_registered_id(store: SqliteMetadataStore) -> None:
    first = BrokerRegistration(store, KEYS, broker("run-a"))
    first.register()
    second = BrokerRegistration(store, KEYS, broker("run-b", port=9192))
    with pytest.raises(BrokerIdTaken) as refused:
        second.register()
    message = str(refused.value)
    assert "broker id 0" in message and "10.0.0.1:9092" in message and "run-a" in message
    assert "KAFSCALE_BROKER_ID" in message
    assert registered(store) == broker("run-a")
    assert second.lease is None
    first.deregister()
    assert registered(store) is None
    second.register()  # free again
    assert registered(store) == broker("run-b", port=9192)


def test_a_respawned_coordinator_of_the_same_run_replaces_its_predecessor(
    store: SqliteMetadataStore,
) -> None:
    crashed = BrokerRegistration(store, KEYS, broker("run-a"))
    crashed.register()  # ... and then the coordinator is SIGKILLed: its lease lives on
    assert crashed.lease is not None
    respawned = BrokerRegistration(store, KEYS, broker("run-a"))
    respawned.register()
    assert respawned.lease is not None
    kv = store.get(KEYS.broker(0))
    assert kv is not None and kv.lease_id == respawned.lease.id
    crashed.lease.revoke()  # the old lease ending no longer takes the registration with it
    assert registered(store) == broker("run-a")


def test_boot_waits_out_a_crashed_brokers_registration(store: SqliteMetadataStore) -> None:
    crashed = BrokerRegistration(store, KEYS, broker("run-a"), ttl=1)
    crashed.register()  # never refreshed again: it runs out within a second
    restarted = BrokerRegistration(store, KEYS, broker("run-b"), ttl=1)
    restarted.register(wait=True)
    assert registered(store) == broker("run-b")


def test_boot_gives_up_on_a_live_registration_after_its_ttl(store: SqliteMetadataStore) -> None:
    live = BrokerRegistration(store, KEYS, broker("run-a"), ttl=1)
    live.register()
    assert live.lease is not None
    stop = threading.Event()

    def refresh() -> None:
        assert live.lease is not None
        while not stop.wait(0.2):
            live.lease.refresh()

    refresher = threading.Thread(target=refresh)
    refresher.start()
    try:
        with pytest.raises(BrokerIdTaken, match="run-a"):
            BrokerRegistration(store, KEYS, broker("run-b"), ttl=1).register(wait=True)
    finally:
        stop.set()
        refresher.join()
    assert registered(store) == broker("run-a")


def test_keep_alive_stops_if_another_run_took_the_id_while_the_lease_was_lost(
    store: SqliteMetadataStore,
) -> None:
    mine = BrokerRegistration(store, KEYS, broker("run-a"), ttl=3)
    mine.register()
    assert mine.lease is not None
    mine.lease.revoke()  # lost (say the store was unreachable for longer than the TTL) ...
    BrokerRegistration(store, KEYS, broker("run-b")).register()  # ... and taken meanwhile
    mine._refreshed_at = 0.0  # due now
    mine.keep_alive()  # finds the lease gone
    with pytest.raises(BrokerIdTaken, match="run-b"):
        mine.keep_alive()  # registering again is refused, at once
