"""The broker lease and registration the supervisor holds (embedded SQLite store)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys, LeaderRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.supervisor.membership import BrokerIdTaken, Membership

KEYS = Keys("ns")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    yield opened
    opened.close()


def broker(run_id: str, node_id: int = 0, port: int = 9092) -> BrokerRecord:
    return BrokerRecord(node_id=node_id, host="10.0.0.1", port=port, run_id=run_id)


def member(store, run_id: str, node_id: int = 0, ttl: int = 10, **kwargs) -> Membership:
    return Membership(store, "ns", broker(run_id, node_id), ttl, **kwargs)


def registered(store: SqliteMetadataStore, node_id: int = 0) -> BrokerRecord | None:
    kv = store.get(KEYS.broker(node_id))
    return None if kv is None else records.decode_broker(kv.value)


def test_a_registration_needs_a_run_id(store):
    with pytest.raises(ValueError, match="run_id"):
        member(store, "")


def test_another_run_cannot_take_a_registered_id_and_can_once_it_left(store):
    first = member(store, "run-a")
    first.join()
    second = Membership(store, "ns", broker("run-b", port=9192), 1)
    started = time.monotonic()
    with pytest.raises(BrokerIdTaken) as refused:
        second.join()  # waits the holder's TTL (1 s) + 2 s, then gives up
    assert time.monotonic() - started >= 1
    message = str(refused.value)
    assert "broker id 0" in message and "10.0.0.1:9092" in message and "run-a" in message
    assert "KAFSCALE_BROKER_ID" in message
    assert registered(store) == broker("run-a")
    first.leave()
    assert registered(store) is None
    second.join()
    assert registered(store) == broker("run-b", port=9192)


def test_joining_waits_out_a_crashed_brokers_registration(store):
    crashed = member(store, "run-a", ttl=1)
    crashed.join()  # never refreshed: it runs out within a second
    restarted = member(store, "run-b", ttl=1)
    restarted.join()
    assert registered(store) == broker("run-b")


def test_auto_takes_the_lowest_free_id(store):
    member(store, "run-a", node_id=0).join()
    member(store, "run-b", node_id=2).join()
    auto = member(store, "run-c", node_id=0, auto_id=True)
    auto.join()
    assert auto.node_id == 1 and registered(store, 1) == broker("run-c", node_id=1)


def test_leaving_deletes_every_key_on_the_lease(store):
    mine = member(store, "run-a")
    mine.join()
    leader = LeaderRecord(owner=0, epoch=3, lease=mine.lease_id, run_id="run-a")
    store.put(KEYS.leader("orders", 0), records.encode(leader), lease_id=mine.lease_id)
    mine.leave()
    assert store.get(KEYS.leader("orders", 0)) is None and registered(store) is None


def test_the_keeper_refreshes_and_reports_a_lost_lease_once(store):
    mine = member(store, "run-a", ttl=1)
    mine.join()
    lost: list[str] = []
    reported = threading.Event()
    mine.keep(lambda reason: (lost.append(reason), reported.set()))
    time.sleep(2.5)  # more than the TTL: only the keeper's refreshes keep it
    assert registered(store) == broker("run-a") and not lost
    assert mine.lease is not None
    mine.lease.revoke()  # as if it had expired (the supervisor was paused past its TTL)
    assert reported.wait(5)
    assert len(lost) == 1 and "expired" in lost[0]
    mine.leave()


def test_draining_is_announced_on_the_same_lease(store):
    mine = member(store, "run-a")
    mine.join()
    assert mine.set_draining()
    kv = store.get(KEYS.broker(0))
    assert kv is not None and kv.lease_id == mine.lease_id
    assert records.decode_broker(kv.value).draining
    mine.leave()
    assert registered(store) is None


def test_a_broker_registers_booting_and_says_when_it_is_ready(store):
    booting = BrokerRecord(node_id=0, host="10.0.0.1", port=9092, run_id="run-a", ready=False)
    mine = Membership(store, "ns", booting, 10)
    mine.join()
    found = registered(store)
    assert found is not None and not found.ready
    assert mine.set_ready()
    found = registered(store)
    assert found is not None and found.ready and not found.draining
    assert mine.set_draining()  # keeps ready
    found = registered(store)
    assert found is not None and found.ready and found.draining
    mine.leave()


def test_the_keeper_retries_ready_when_the_store_refused_it(store):
    booting = BrokerRecord(node_id=0, host="10.0.0.1", port=9092, run_id="run-a", ready=False)
    mine = Membership(store, "ns", booting, 1)
    mine.join()
    # Someone rewrote our registration meanwhile (as a store hiccup would make the write fail).
    assert mine.lease is not None
    store.put(KEYS.broker(0), records.encode(booting) + b" ", mine.lease.id)
    assert not mine.set_ready()
    store.put(KEYS.broker(0), records.encode(booting), mine.lease.id)
    mine.keep(lambda reason: None)
    deadline = time.monotonic() + 5
    while not (registered(store) or booting).ready:
        assert time.monotonic() < deadline, "the keeper did not mark the broker ready"
        time.sleep(0.05)
    mine.leave()
