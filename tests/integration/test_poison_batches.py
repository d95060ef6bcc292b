"""Poison batches against a running broker (issue 14, items 1 and 2).

- A committed segment holding a batch no broker validated (attributes say snappy, the body is
  plain), written into the store as an older broker would have written it: ListOffsets by
  timestamp answers CORRUPT_MESSAGE for that partition, the other partition of the same request
  and every later request are served, and no child restarts.
- A zstd bomb (32 KiB that would be 1 GiB) produced with Produce v7, acks=all: refused with
  MESSAGE_TOO_LARGE, nothing stored, the shard's peak RSS grows by far less than the bound.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys, PartitionRecord, SegmentRecord
from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.compression import DEFAULT_FACTOR, KAFKA_MAX_MESSAGE_BYTES, Codec
from kafscale.protocol.errors import ErrorCode
from kafscale.storage import open_object_store
from kafscale.storage import segment as segments
from tests.unit.protocol import poison

from .test_produce import produce_request
from .test_supervision import roles
from .wire import Wire

pytestmark = pytest.mark.integration

TOPIC = "poisoned"
T0 = 1_700_000_000_000
LIST_OFFSETS = load_request_schema(2, 7)


def list_offsets(wire: Wire, queries: dict[int, int], correlation_id: int) -> dict[int, Any]:
    """{partition: answer} of one ListOffsets v7 for ``TOPIC``."""
    partitions = tuple(
        codec.build(
            codec.nested(LIST_OFFSETS, "ListOffsetsPartition"),
            partition_index=partition,
            current_leader_epoch=-1,
            timestamp=timestamp,
        )
        for partition, timestamp in queries.items()
    )
    topic = codec.build(
        codec.nested(LIST_OFFSETS, "ListOffsetsTopic"), name=TOPIC, partitions=partitions
    )
    wire.send(
        codec.build(LIST_OFFSETS, replica_id=-1, isolation_level=0, topics=(topic,)),
        correlation_id,
    )
    got, response = wire.read_response(load_response_schema(2, 7))
    assert got == correlation_id
    return {int(p.partition_index): p for p in response.topics[0].partitions}


def write_poison_segment(broker: Any) -> None:
    """Partition 0 gets one committed segment: two good records, then a batch whose attributes
    say snappy over a plain body (its CRC is right), as a broker that never decoded records
    would have stored it -- the .kfs and .index objects, then the coordinator's commit."""
    config = configuration.load(broker.env)
    keys = Keys(config.s3_namespace)
    good = batches.build_batch([(None, b"good-0", (), T0), (None, b"good-1", (), T0 + 1)])
    lie = bytearray(
        poison.batch(
            poison.record(0) + poison.record(1, timestamp_delta=5),
            count=2,
            codec=Codec.SNAPPY,
            base_timestamp=T0 + 10,
            max_timestamp=T0 + 15,
        )
    )
    batches.patch_base_offset(lie, 0, 2)
    kfs, index = segments.build_segment([good, bytes(lie)], 0, T0)
    objects = open_object_store(config)
    store = open_metadata_store(config)
    try:
        objects.put_if_absent(segments.segment_key(config.s3_namespace, TOPIC, 0, 0), kfs)
        objects.put_if_absent(segments.index_key(config.s3_namespace, TOPIC, 0, 0), index)
        topic_kv = store.get(keys.topic(TOPIC))
        assert topic_kv is not None
        topic = records.decode_topic(topic_kv.value)
        segment = SegmentRecord(0, 3, len(kfs), len(index), 4, T0 + 15, T0)
        store.put(keys.segment(TOPIC, 0, 0), records.encode(segment))
        store.put(
            keys.partition(TOPIC, 0),
            records.encode(PartitionRecord(topic_id=topic.topic_id, high_watermark=4)),
        )
    finally:
        store.close()
        objects.close()


def produce_good(bootstrap: str, partition: int, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(count):
        producer.produce(TOPIC, b"p%d-%d" % (partition, i), partition=partition, timestamp=T0 + i)
    assert producer.flush(30) == 0


def peak_and_current_rss(pid: int) -> tuple[int, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024


def test_poison_segment_and_zstd_bomb_are_contained(start_broker: Callable[..., Any]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(env={"KAFSCALE_SHARDS": "1", "KAFSCALE_AUTO_CREATE_TOPICS": "false"})
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
    produce_good(broker.bootstrap, 1, 3)
    assert broker.terminate() == 0
    write_poison_segment(broker)
    broker = start_broker(env=dict(broker.env))
    broker.wait_ready()
    children = roles(broker)

    with Wire(("127.0.0.1", broker.port)) as wire:
        for attempt in range(3):  # a client retrying
            answers = list_offsets(wire, {0: T0 + 12, 1: T0 + 1}, correlation_id=attempt)
            assert answers[0].error_code == ErrorCode.corrupt_message
            assert (answers[1].error_code, answers[1].offset) == (0, 1)
        answers = list_offsets(wire, {0: T0 + 1, 1: -1}, correlation_id=10)
        assert (answers[0].error_code, answers[0].offset) == (0, 1)  # before the poison batch
        assert (answers[1].error_code, answers[1].offset) == (0, 3)
        answers = list_offsets(wire, {0: -1}, correlation_id=11)
        assert (answers[0].error_code, answers[0].offset) == (0, 4)

        # A real client's offsetsForTimes on the healthy partition, and its records.
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False}
        )
        try:
            [found] = consumer.offsets_for_times([TopicPartition(TOPIC, 1, T0 + 2)], timeout=30)
            assert (found.error, found.offset) == (None, 2)
            consumer.assign([TopicPartition(TOPIC, 1, 0)])
            values = []
            deadline = time.monotonic() + 30
            while len(values) < 3 and time.monotonic() < deadline:
                message = consumer.poll(1)
                if message is not None and message.error() is None:
                    values.append(message.value())
            assert values == [b"p1-0", b"p1-1", b"p1-2"]
        finally:
            consumer.close()

        # The zstd bomb, Produce v7 (the first version that allows zstd), acks=all.
        [shard] = [pid for role, pid in children.items() if role.startswith("shard")]
        _, rss_before = peak_and_current_rss(shard)
        bomb = poison.batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD, base_timestamp=0)
        assert len(bomb) < 40_000
        bomb = bytearray(bomb)
        batches.set_max_timestamp(bomb, 0, int(time.time() * 1000))
        request = produce_request(TOPIC, 1, bytes(bomb))
        request = codec.build(
            load_request_schema(0, 7),
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=request.topic_data,
        )
        wire.send(request, correlation_id=20)
        _, response = wire.read_response(load_response_schema(0, 7))
        [result] = response.responses[0].partition_responses
        assert result.error_code == ErrorCode.message_too_large
        peak_after, _ = peak_and_current_rss(shard)
        # Below the bound (64 MiB) by far: a zstd frame that may pass it is counted block by
        # block first, holding one 128 KiB block at a time.
        assert peak_after - rss_before <= min(16 << 20, DEFAULT_FACTOR * KAFKA_MAX_MESSAGE_BYTES)
        answers = list_offsets(wire, {1: -1}, correlation_id=21)
        assert answers[1].offset == 3  # nothing of it stored

    assert roles(broker) == children  # no child restarted
    log = broker.log_text()
    assert log.count("stored data cannot be read; this request gets an error") == 1
    assert "not valid zstd data" not in log and "batch refused" in log
