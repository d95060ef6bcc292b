"""SIGKILL a shard while acks=1 producers write: its successor adopts the buffers it left in shared
memory, so every acknowledged record is read back at the offset it was acknowledged with.

acks=1 is answered once the batch is in the shard's buffer, before any upload: without adoption
the records acknowledged since the last commit die with the shard and their offsets are handed
out again to other records. The producer is confluent-kafka (librdkafka) without idempotence (it
requires acks=all), writing to every partition; the kill waits until the victim holds thousands
of acknowledged, unflushed records, and the load goes on through the restart.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.ipc.routing import shard_for
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from tests.harness.procs import wait_until

from .test_produce import high_watermark
from .test_supervision import roles

pytestmark = pytest.mark.integration

TOPIC = "acks1-crash"
PARTITIONS = 6
SHARDS = 2
VICTIM = 0
UNFLUSHED_AT_KILL = 2000  # acknowledged records above the victim's high watermarks
AFTER_RESTART = 3000  # acknowledged records on the victim's partitions after the restart


class Load:
    """One acks=1 producer on a thread, writing unique values round-robin over the partitions,
    recording what each acknowledgement said: value -> (partition, offset)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": 1,
                "enable.idempotence": False,
                "linger.ms": 5,
                "batch.size": 16384,
                "message.timeout.ms": 120_000,
                "request.timeout.ms": 10_000,
                "retry.backoff.ms": 100,
            }
        )
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="acks1-load", daemon=True)

    def _run(self) -> None:
        for n in itertools.count():
            if self.stop.is_set():
                break
            value = f"record-{n:08d}".encode()
            self.producer.produce(
                TOPIC, value, partition=n % PARTITIONS, on_delivery=self._delivered
            )
            # Bound what is in flight, so acknowledgements keep pace with what is produced.
            while len(self.producer) > 2000 and not self.stop.is_set():
                self.producer.poll(0.05)
            self.producer.poll(0)
        self.producer.flush(120)

    def _delivered(self, error: Any, message: Any) -> None:
        with self.lock:
            if error is not None:
                self.failed.append(error.name())
            else:
                self.acked[message.value()] = (message.partition(), message.offset())

    def snapshot(self) -> dict[bytes, tuple[int, int]]:
        with self.lock:
            return dict(self.acked)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(180)
        assert not self.thread.is_alive(), "the producer did not finish"


def topic_id(broker: Any) -> str:
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        kv = store.get(Keys(config.s3_namespace).topic(TOPIC))
        assert kv is not None
        return records.decode_topic(kv.value).topic_id
    finally:
        store.close()


def consume_all(bootstrap: str, ends: dict[int, int]) -> dict[int, dict[int, bytes]]:
    """{partition: {offset: value}} of every record below ``ends[partition]``; an offset seen
    twice with different values fails."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "shard-crash-check",
            "enable.auto.commit": False,
            "fetch.max.bytes": 4 << 20,
        }
    )
    found: dict[int, dict[int, bytes]] = defaultdict(dict)
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])

        def complete() -> bool | None:
            for message in consumer.consume(num_messages=5000, timeout=0.5):
                assert message.error() is None, message.error()
                partition, offset = message.partition(), message.offset()
                seen = found[partition].setdefault(offset, message.value())
                assert seen == message.value(), f"two records at {partition}/{offset}"
            if all(len(found[p]) >= ends[p] for p in range(PARTITIONS)):
                return True
            return None

        wait_until(complete, timeout=120, what="the consumer to read every committed record")
    finally:
        consumer.close()
    return found


def test_sigkilled_shard_keeps_every_acks_1_record(start_broker: Callable[..., Any]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(
        backends="real",
        env={
            "KAFSCALE_SHARDS": str(SHARDS),
            # Long enough that the victim holds seconds of acknowledged, unflushed records.
            "KAFSCALE_FLUSH_INTERVAL_MS": "3000",
        },
    )
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
    tid = topic_id(broker)
    victims = [p for p in range(PARTITIONS) if shard_for(tid, p, SHARDS) == VICTIM]
    assert victims and len(victims) < PARTITIONS, "the topic should span both shards"

    def unflushed(acked: dict[bytes, tuple[int, int]]) -> int:
        ends = {p: high_watermark(broker, TOPIC, p) for p in victims}
        return sum(1 for p, offset in acked.values() if p in victims and offset >= ends[p])

    with Load(broker.bootstrap) as load:
        wait_until(
            lambda: True if unflushed(load.snapshot()) >= UNFLUSHED_AT_KILL else None,
            timeout=120,
            what="acknowledged records waiting in the victim's buffers",
            abort=lambda: f"delivery failed: {load.failed[:5]}" if load.failed else None,
        )
        old_pid = roles(broker)[f"shard-{VICTIM}"]
        os.kill(old_pid, signal.SIGKILL)
        at_kill = load.snapshot()
        exposed = unflushed(at_kill)  # read after the kill: nothing of it can be flushed now
        assert exposed >= UNFLUSHED_AT_KILL

        def restarted() -> int | None:
            pid = roles(broker).get(f"shard-{VICTIM}")
            return pid if pid is not None and pid != old_pid else None

        wait_until(restarted, timeout=60, what="the shard to be respawned")

        def victims_acked() -> int:
            return sum(1 for p, _ in load.snapshot().values() if p in victims)

        goal = victims_acked() + AFTER_RESTART
        wait_until(
            lambda: True if victims_acked() >= goal else None,
            timeout=120,
            what="acknowledgements from the restarted shard",
        )
    assert load.failed == [], f"deliveries failed: {load.failed[:10]}"
    acked = load.snapshot()

    ends: dict[int, int] = {}
    for partition in range(PARTITIONS):
        last = max(offset for p, offset in acked.values() if p == partition)
        ends[partition] = wait_until(
            lambda p=partition, last=last: (
                hw if (hw := high_watermark(broker, TOPIC, p)) > last else None
            ),
            timeout=60,
            what=f"partition {partition} to be committed past offset {last}",
        )
    stored = consume_all(broker.bootstrap, ends)

    for partition in range(PARTITIONS):
        assert sorted(stored[partition]) == list(range(ends[partition])), "offsets not contiguous"
    wrong = {
        value: (partition, offset, stored[partition].get(offset))
        for value, (partition, offset) in acked.items()
        if stored[partition].get(offset) != value
    }
    some = list(wrong.items())[:5]
    assert not wrong, f"{len(wrong)} acknowledged records are not at their offsets, e.g. {some}"
    # What survived only because the successor adopted the buffers (the old shard deleted them).
    assert exposed >= UNFLUSHED_AT_KILL
    assert "adopted the buffers of a previous incarnation" in broker.log_text()
    # At-least-once: a batch appended just before the kill whose reply was lost is stored again
    # when the producer resends it; such copies were never acknowledged where they first landed.
    copies: dict[bytes, int] = defaultdict(int)
    for partition_records in stored.values():
        for value in partition_records.values():
            copies[value] += 1
    print(
        f"{exposed} acknowledged records were only in the killed shard's buffers; "
        f"{sum(n > 1 for n in copies.values())} values stored twice (resent after the kill)"
    )
