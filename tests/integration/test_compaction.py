"""Compacted topics against real processes, etcd and MinIO, with real clients: the log cleaner
keeps the latest record of every key at its offset, a consumer reading from the start sees just
those (and a key's tombstone), a restarted broker serves the same, the replaced objects are queued
for deletion, and a record without a key is refused
(docs/design/ecosystem.md, section 4)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import GarbageRecord, Keys
from kafscale.storage import open_object_store
from kafscale.storage import segment as segments

from .test_retention import create, entries

pytestmark = pytest.mark.integration

TOPIC = "table"
ENV = {
    # Chunks become segments a second after they are written; the cleaner looks every 300 ms.
    "KAFSCALE_COMPACTION_MAX_AGE_MS": "1000",
    "KAFSCALE_CLEANER_BACKOFF_MS": "300",
}
CONFIGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
KEYS = 20
ROUNDS = 6


def produce(bootstrap: str, rows: list[tuple[bytes | None, bytes | None]]) -> list[Any]:
    """Send ``rows`` (key, value) with acks=all, one flush; the delivery reports' errors."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    for key, value in rows:
        producer.produce(TOPIC, value=value, key=key, partition=0, on_delivery=_report(errors))
    assert producer.flush(30) == 0
    return errors


def _report(errors: list[Any]) -> Callable[[Any, Any], None]:
    def report(error: Any, _: Any) -> None:
        if error is not None:
            errors.append(error)

    return report


def consume_all(bootstrap: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record a consumer reads from the start to the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen: list[tuple[int, bytes | None, bytes | None]] = []
        position = 0
        deadline = time.monotonic() + 60
        while position < high:
            assert time.monotonic() < deadline, f"read up to {position} of {high}: {seen[-3:]}"
            message = consumer.poll(1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            seen.append((message.offset(), message.key(), message.value()))
            position = message.offset() + 1
            # The last records of a compacted log may be gone: the position says where it is.
            position = max(position, consumer.position([TopicPartition(TOPIC, 0)])[0].offset)
        return seen
    finally:
        consumer.close()


def garbage(broker: Any) -> list[GarbageRecord]:
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        prefix = Keys(config.s3_namespace).garbage
        return [records.decode_garbage(kv.value) for kv in store.get_prefix(prefix)]
    finally:
        store.close()


def cleanings(broker: Any) -> float:
    line = 'kafscale_cleanings_total{outcome="committed"} '
    found = [x for x in broker.metrics_text().splitlines() if x.startswith(line)]
    return float(found[0][len(line) :]) if found else 0.0


def stored_keys(broker: Any) -> set[str]:
    config = configuration.load(broker.env)
    objects = open_object_store(config)
    try:
        return {o.key for o in objects.list(segments.segment_prefix(config.s3_namespace, TOPIC, 0))}
    finally:
        objects.close()


def test_a_compacted_topic_keeps_the_latest_record_of_each_key(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(ENV, backends="real", ready=True)
    create(broker.bootstrap, TOPIC, CONFIGS)
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    offset = 0
    for round_ in range(ROUNDS):
        rows: list[tuple[bytes | None, bytes | None]] = [
            (f"k{k}".encode(), f"v{round_}-{k}".encode()) for k in range(KEYS)
        ]
        if round_ == ROUNDS - 1:
            rows.append((b"k0", None))  # a tombstone: kept for delete.retention.ms (a day)
        assert produce(broker.bootstrap, rows) == []
        for key, value in rows:
            assert key is not None
            latest[key] = (offset, value)
            offset += 1
        time.sleep(1.5)  # its own segment: the chunks are compacted after a second
    expected = sorted((at, key, value) for key, (at, value) in latest.items())

    # A record without a key is refused (and nothing is stored for it).
    [refused] = produce(broker.bootstrap, [(None, b"no key")])
    assert refused.name() == "INVALID_RECORD", refused

    deadline = time.monotonic() + 90
    while True:
        log = entries(broker, TOPIC)
        if log and all(e.generation > 0 for e in log) and log[-1].last_offset == offset - 1:
            seen = consume_all(broker.bootstrap)
            if seen == expected:
                break
        assert time.monotonic() < deadline, f"not cleaned: {log}"
        time.sleep(0.5)
    assert cleanings(broker) >= 1
    assert sum(e.records for e in log) == KEYS
    assert log[0].base_offset == 0  # offsets never move: the log still starts at 0

    # A restarted broker serves the same records, from the cleaned segments.
    assert broker.terminate() == 0
    broker = start_broker(env=broker.env, ready=True)
    assert consume_all(broker.bootstrap) == expected

    # The replaced segments are queued for deletion after their grace (the sweep itself:
    # tests/unit/cleaner/test_worker.py); the cleaned ones are in the bucket.
    namespace = broker.env["KAFSCALE_S3_NAMESPACE"]
    live = {segments.segment_key(namespace, TOPIC, 0, e.base_offset, e.generation) for e in log}
    assert live <= stored_keys(broker)
    queued = {o for record in garbage(broker) for o in record.objects if o.endswith(".kfs")}
    assert queued and not queued & live
