"""The outage gate: one call finds a backend down, the calls after it are refused at once, and a
background probe lets calls through again once the backend answers. Also against a real paused
MinIO and etcd (SIGSTOP: the sockets stay open, nothing answers)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.store import MetadataStoreUnavailable
from kafscale.outage import OutageGate
from kafscale.storage.objects import ObjectStoreUnavailable
from kafscale.storage.s3 import S3ObjectStore


class Backend:
    def __init__(self) -> None:
        self.up = threading.Event()
        self.probes = 0

    def probe(self) -> None:
        self.probes += 1
        if not self.up.is_set():
            raise OSError("still down")


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_a_closed_gate_admits_every_call() -> None:
    backend = Backend()
    gate = OutageGate("test", backend.probe, ObjectStoreUnavailable)
    for _ in range(3):
        gate.admit()
    assert not gate.open and backend.probes == 0
    gate.close()


def test_an_open_gate_refuses_with_the_first_error_until_a_probe_succeeds() -> None:
    backend = Backend()
    gate = OutageGate("test", backend.probe, ObjectStoreUnavailable, max_probe_interval_s=0.05)
    gate.failed(ObjectStoreUnavailable("S3 endpoint http://x is unreachable: timed out"))
    assert gate.open
    with pytest.raises(ObjectStoreUnavailable, match="http://x is unreachable: timed out"):
        gate.admit()
    wait_until(lambda: backend.probes >= 3)
    assert gate.open  # probes failed: still refusing
    gate.failed(ObjectStoreUnavailable("a second failure"))  # no second prober, same error
    with pytest.raises(ObjectStoreUnavailable, match="timed out"):
        gate.admit()
    backend.up.set()
    wait_until(lambda: not gate.open)
    gate.admit()
    probes = backend.probes
    time.sleep(0.2)
    assert backend.probes == probes  # no probing while closed
    gate.close()


def test_closing_stops_the_probe() -> None:
    backend = Backend()
    gate = OutageGate("test", backend.probe, MetadataStoreUnavailable, max_probe_interval_s=0.05)
    gate.failed(MetadataStoreUnavailable("etcd at x is unreachable"))
    gate.close()
    probes = backend.probes
    time.sleep(0.3)
    assert backend.probes == probes
    gate.failed(MetadataStoreUnavailable("after close"))  # never reopens or probes
    time.sleep(0.1)
    assert backend.probes == probes


def test_s3_paused_costs_one_timeout_then_fails_fast_and_recovers(s3_server: Any) -> None:
    bucket = s3_server.create_bucket(f"kafscale-outage-{uuid.uuid4().hex[:12]}")
    store = S3ObjectStore(
        bucket,
        s3_server.region,
        s3_server.endpoint_url,
        True,
        s3_server.access_key,
        s3_server.secret_key,
        timeout=1.0,
    )
    try:
        assert store.put_if_absent("ns/a", b"a")
        with s3_server.paused():
            started = time.monotonic()
            with pytest.raises(ObjectStoreUnavailable):
                store.get("ns/a")
            first = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(ObjectStoreUnavailable, match="until it answers again"):
                store.put_if_absent("ns/b", b"b")
            second = time.monotonic() - started
        # Bounded by the timeout (two attempts), not by the pause; then refused without waiting.
        assert first < 2 * 1.0 + 2.0, first
        assert second < first
        wait_until(lambda: not store._gate.open, timeout=30)
        assert store.get("ns/a") == b"a"
        assert store.put_if_absent("ns/b", b"b")
    finally:
        store.close()


def test_etcd_paused_costs_one_deadline_then_fails_fast_and_recovers(etcd_server: Any) -> None:
    store = EtcdMetadataStore([etcd_server.endpoint], timeout=1.0)
    key = f"/outage-test/{uuid.uuid4().hex}"
    try:
        store.put(key, b"v")
        with etcd_server.paused():
            started = time.monotonic()
            with pytest.raises(MetadataStoreUnavailable):
                store.get(key)
            first = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(MetadataStoreUnavailable, match="until it answers again"):
                store.get(key)
            second = time.monotonic() - started
        assert first < 1.0 + 2.0, first
        assert second < first
        wait_until(lambda: not store._gate.open, timeout=30)
        kv = store.get(key)
        assert kv is not None and kv.value == b"v"
    finally:
        store.close()
