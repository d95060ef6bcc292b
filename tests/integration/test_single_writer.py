"""One writer per store where a store cannot be shared; one node id per broker everywhere.

Real `kafscale serve` processes against the embedded backends (one data directory) and against
real etcd + MinIO (one bucket and namespace, which brokers share: docs/design/scale-out.md), with
a real client (confluent-kafka): a second broker on a data directory refuses to start, naming the
first; on etcd + MinIO a second broker with the same node id waits out a crashed holder's
registration and refuses a live one; a broker whose lease is gone kills its children and rejoins
in place; namespaces are separate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.records import Keys, decode_leader
from kafscale.metadata.store import KeyValue

pytestmark = pytest.mark.integration

TOPIC = "single-writer"
FAST_LOCK = {"KAFSCALE_STORE_LOCK_TTL_MS": "3000"}


def produce(bootstrap: str, values: list[bytes]) -> list[int]:
    """The offsets the broker acknowledged (acks=all), in order; fails on any error."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    offsets: list[int] = []
    errors: list[str] = []

    def delivered(err: Any, message: Any) -> None:
        if err is not None:
            errors.append(err.name())
        else:
            offsets.append(message.offset())

    for value in values:
        producer.produce(TOPIC, value, partition=0, on_delivery=delivered)
        producer.flush(60)  # one at a time: offsets in order
    assert errors == [] and len(offsets) == len(values)
    return offsets


def consume(bootstrap: str, count: int) -> list[tuple[int, bytes]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "single-writer", "enable.auto.commit": False}
    )
    found: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                found.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return found


def log_lines(broker: Any) -> list[dict[str, Any]]:
    lines = []
    for line in broker.log_text().splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines


def critical(broker: Any) -> str:
    found = [line["msg"] for line in log_lines(broker) if line.get("level") == "critical"]
    assert found, broker.log_tail()
    return str(found[-1])


def spawned_children(broker: Any) -> int:
    return sum(1 for line in log_lines(broker) if line.get("msg") == "spawned")


def assert_first_unaffected(first: Any, before: list[bytes]) -> None:
    """The first broker still serves: new records follow on, every record reads back once."""
    first.wait_ready(timeout=10)
    after = [b"after-%d" % i for i in range(5)]
    assert produce(first.bootstrap, after) == list(range(len(before), len(before) + len(after)))
    everything = before + after
    assert consume(first.bootstrap, len(everything)) == list(enumerate(everything))


def test_second_broker_on_one_data_dir_refuses_naming_the_first(
    start_broker: Callable[..., Any],
) -> None:
    first = start_broker(ready=True)
    before = [b"before-%d" % i for i in range(5)]
    assert produce(first.bootstrap, before) == list(range(5))
    second = start_broker(env={"KAFSCALE_DATA_DIR": first.env["KAFSCALE_DATA_DIR"]})
    assert second.wait(timeout=60) == 1
    refusal = critical(second)
    assert refusal.startswith("cannot start: the data directory")
    assert f"pid {first.pid} " in refusal
    assert f"Kafka 127.0.0.1:{first.port}" in refusal
    assert f"metrics port {first.metrics_port}" in refusal
    assert "one data directory, one broker" in refusal
    assert spawned_children(second) == 0  # refused before any child booted
    assert_first_unaffected(first, before)


def test_second_broker_with_the_same_id_on_one_namespace_refuses_naming_the_first(
    start_broker: Callable[..., Any],
) -> None:
    first = start_broker(backends="real", env=FAST_LOCK, ready=True)
    before = [b"before-%d" % i for i in range(5)]
    assert produce(first.bootstrap, before) == list(range(5))
    # Its own data directory and ports; the same etcd, bucket, namespace and node id (0).
    second = start_broker(backends="real", env=FAST_LOCK)
    assert second.wait(timeout=90) == 1
    waited = [line for line in log_lines(second) if "waiting up to 5 s" in line["msg"]]
    assert waited and f"127.0.0.1:{first.port}" in waited[0]["msg"]
    refusal = critical(second)
    namespace = first.env["KAFSCALE_S3_NAMESPACE"]
    assert f"broker id 0 is registered at /kafscale/{namespace}/brokers/0" in refusal
    assert f"127.0.0.1:{first.port}" in refusal and "cannot share a node id" in refusal
    assert spawned_children(second) == 0
    assert_first_unaffected(first, before)


def test_sigterm_while_waiting_for_the_lock_stops_the_waiting_broker(
    start_broker: Callable[..., Any],
) -> None:
    first = start_broker(backends="real", ready=True)  # the default TTL: a 12 s wait
    second = start_broker(backends="real")
    deadline = time.monotonic() + 60
    while not any("waiting up to" in line["msg"] for line in log_lines(second)):
        assert second.running and time.monotonic() < deadline, second.log_tail()
        time.sleep(0.1)
    os.kill(second.pid, signal.SIGTERM)
    assert second.wait(timeout=10) == 1
    assert critical(second) == "cannot start: interrupted during start-up"
    assert spawned_children(second) == 0
    first.wait_ready(timeout=10)


def test_after_a_sigkill_a_new_broker_starts_once_the_lease_runs_out(
    start_broker: Callable[..., Any],
) -> None:
    # The default TTL (10 s): the restart surely finds the dead broker's lease still there.
    first = start_broker(backends="real", ready=True)
    acked = [b"acked-%d" % i for i in range(5)]
    assert produce(first.bootstrap, acked) == list(range(5))
    first.kill()  # the whole pod: nothing is released
    second = start_broker(env=first.env)  # same ports, node id, bucket and namespace
    second.wait_ready()
    waited = [line for line in log_lines(second) if "waiting up to 12 s" in line["msg"]]
    assert waited and f"127.0.0.1:{first.port}" in waited[0]["msg"]
    assert any(line["msg"] == "registered" for line in log_lines(second))
    assert consume(second.bootstrap, len(acked)) == list(enumerate(acked))
    assert produce(second.bootstrap, [b"next"]) == [len(acked)]


def test_after_a_sigkill_the_data_dir_is_free_at_once(start_broker: Callable[..., Any]) -> None:
    first = start_broker(ready=True)
    acked = [b"acked-%d" % i for i in range(5)]
    assert produce(first.bootstrap, acked) == list(range(5))
    first.kill()
    second = start_broker(env=first.env)
    second.wait_ready()
    messages = [line["msg"] for line in log_lines(second)]
    assert "took over the store lock of a broker that is gone" in messages
    assert "deleted the registration of a broker that is gone" in messages
    assert not any("waiting up to" in message for message in messages)
    assert consume(second.bootstrap, len(acked)) == list(enumerate(acked))
    assert produce(second.bootstrap, [b"next"]) == [len(acked)]


def test_brokers_of_two_namespaces_share_one_etcd_and_bucket(
    start_broker: Callable[..., Any],
) -> None:
    first = start_broker(backends="real", env=FAST_LOCK, ready=True)
    other = f"{first.env['KAFSCALE_S3_NAMESPACE']}-other"
    second = start_broker(
        backends="real", env={**FAST_LOCK, "KAFSCALE_S3_NAMESPACE": other}, ready=True
    )
    assert first.env["KAFSCALE_S3_BUCKET"] == second.env["KAFSCALE_S3_BUCKET"]
    assert produce(first.bootstrap, [b"first-0", b"first-1"]) == [0, 1]
    assert produce(second.bootstrap, [b"second-0"]) == [0]
    assert consume(first.bootstrap, 2) == [(0, b"first-0"), (1, b"first-1")]
    assert consume(second.bootstrap, 1) == [(0, b"second-0")]


def test_a_broker_whose_lease_is_gone_kills_its_children_and_rejoins_in_place(
    start_broker: Callable[..., Any], etcd_server: Any
) -> None:
    broker = start_broker(backends="real", env=FAST_LOCK, ready=True)
    assert produce(broker.bootstrap, [b"one"]) == [0]
    old_children = set(broker.children())
    # Its lease ends (as when it was paused or cut off from etcd past its TTL): every leader
    # key on it goes, and other brokers may own its partitions at newer epochs by now.
    store = EtcdMetadataStore([etcd_server.endpoint])
    try:
        keys = Keys(broker.env["KAFSCALE_S3_NAMESPACE"])
        leader = store.get(keys.leader(TOPIC, 0))
        assert leader is not None
        registration = _revoke_broker_lease(broker, etcd_server, store)
        assert store.get(keys.leader(TOPIC, 0)) is None
        # It rejoins: a new lease and registration under the same id, new children that claim
        # the partition again at a newer epoch.
        deadline = time.monotonic() + 60
        while True:
            assert broker.running, broker.log_tail()
            again = store.get(keys.broker(0))
            claimed = store.get(keys.leader(TOPIC, 0))
            if again is not None and claimed is not None:
                break
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.2)
        assert again.lease_id not in (0, registration.lease_id)
        assert claimed.lease_id == again.lease_id
        assert decode_leader(claimed.value).epoch > decode_leader(leader.value).epoch
    finally:
        store.close()
    messages = [line.get("msg") for line in log_lines(broker)]
    assert "broker lease lost" in messages
    assert "rejoining the cluster with a new broker lease" in messages
    broker.wait_ready(timeout=60)
    assert not old_children & set(broker.children())  # a new set of children
    assert produce(broker.bootstrap, [b"two"]) == [1]
    assert consume(broker.bootstrap, 2) == [(0, b"one"), (1, b"two")]
    children_stopped = [
        line
        for line in log_lines(broker)
        if line.get("msg") == "stopped" and line.get("process") != "supervisor"
    ]
    assert children_stopped == []  # SIGKILLed, not drained: nothing more was written


def test_a_sigterm_while_a_broker_rejoins_is_a_clean_stop(
    start_broker: Callable[..., Any], etcd_server: Any
) -> None:
    """It held nothing any more (its children were killed with the lease): exit 0, as for any
    stop, not the exit 1 of a start-up that was interrupted."""
    broker = start_broker(backends="real", env=FAST_LOCK, ready=True)
    store = EtcdMetadataStore([etcd_server.endpoint])
    try:
        _revoke_broker_lease(broker, etcd_server, store)
    finally:
        store.close()
    deadline = time.monotonic() + 60
    while "rejoining the cluster with a new broker lease" not in broker.log_text():
        assert broker.running and time.monotonic() < deadline, broker.log_tail()
        time.sleep(0.05)
    assert broker.terminate() == 0  # its new children take seconds to boot: it is rejoining
    messages = [line.get("msg") for line in log_lines(broker)]
    assert "stopped while rejoining the cluster" in messages, broker.log_tail()


def _revoke_broker_lease(broker: Any, etcd_server: Any, store: EtcdMetadataStore) -> KeyValue:
    """End broker 0's lease behind its back (as when it was paused or cut off from etcd past its
    TTL): every key on it goes. Returns the registration it had."""
    registration = store.get(Keys(broker.env["KAFSCALE_S3_NAMESPACE"]).broker(0))
    assert registration is not None and registration.lease_id
    etcdctl = ["etcdctl", f"--endpoints={etcd_server.endpoint}"]
    revoke = [*etcdctl, "lease", "revoke", f"{registration.lease_id:x}"]
    subprocess.run(revoke, check=True, capture_output=True, timeout=30)
    return registration
