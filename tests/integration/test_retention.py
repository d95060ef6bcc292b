"""Topic retention against real processes: segments past retention.bytes / retention.ms leave S3
and the metadata store, the log start moves, and consumers see exactly what is left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.protocol.errors import ErrorCode
from kafscale.storage import open_object_store
from kafscale.storage import segment as segments

from .test_fetch import fetch, metric, produce_sequentially, records_of
from .wire import Wire

pytestmark = pytest.mark.integration

ENV = {"KAFSCALE_SEGMENT_BYTES": "1KiB", "KAFSCALE_RETENTION_CHECK_INTERVAL_MS": "300"}


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low), int(high)
    finally:
        consumer.close()


def stored(broker: Any, topic: str) -> list[tuple[int, int]]:
    """(base offset, size) of the partition's segment objects (``.kfs``), in offset order."""
    config = configuration.load(broker.env)
    objects = open_object_store(config)
    try:
        prefix = segments.segment_prefix(config.s3_namespace, topic, 0)
        return sorted(
            (key.base_offset, info.size)
            for info in objects.list(prefix)
            if (key := segments.parse_segment_key(info.key)) is not None and key.kind == "kfs"
        )
    finally:
        objects.close()


def stored_bases(broker: Any, topic: str) -> list[int]:
    return [base for base, _ in stored(broker, topic)]


def entries(broker: Any, topic: str) -> list[SegmentRecord]:
    """The partition's log entries (spec segments and chunks) in the metadata store, in offset
    order (records only: retention may delete a segment's objects at any moment)."""
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        prefix = Keys(config.s3_namespace).segments(topic, 0)
        return [records.decode_segment(kv.value) for kv in store.get_prefix(prefix)]
    finally:
        store.close()


def create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, config=configs)])[topic].result(20)


def alter(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    changes = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=changes)
    admin.incremental_alter_configs([resource])[resource].result(20)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_retention_bytes_deletes_the_oldest_segments(start_broker: Callable[..., Any]) -> None:
    broker = start_broker(backends="real", env=ENV)
    broker.wait_ready()
    create(broker.bootstrap, "sized", {})
    values = [b"v-%03d-" % i + b"x" * 90 for i in range(200)]  # ~20 segments of ~1 KiB
    produce_sequentially(broker.bootstrap, "sized", values)
    wait_until(lambda: watermarks(broker.bootstrap, "sized")[1] == 200, "the high watermark")

    def compacted_below(offset: int) -> bool:
        """Every entry up to ``offset`` is a spec segment (segment.bytes 1 KiB: chunks are
        compacted as soon as they fill one)."""
        found = entries(broker, "sized")
        upto = [e for e in found if e.base_offset <= offset]
        return bool(upto) and upto[-1].last_offset >= offset and not any(e.is_chunk for e in upto)

    wait_until(lambda: compacted_below(150), "the oldest chunks to be compacted into segments")
    before = stored_bases(broker, "sized")
    alter(broker.bootstrap, "sized", {"retention.bytes": "3000"})
    wait_until(lambda: watermarks(broker.bootstrap, "sized")[0] > 0, "retention")

    def at_the_limit() -> bool:
        left = entries(broker, "sized")
        sizes = [e.size for e in left]
        # what is left reaches retention.bytes, and would not without its oldest entry; the
        # objects of the segments it retired are gone, those of the segments left are not
        return sum(sizes) >= 3000 > sum(sizes[1:]) and stored(broker, "sized") == sorted(
            (e.base_offset, e.size) for e in left if not e.is_chunk
        )

    wait_until(at_the_limit, "the objects of retired segments to be deleted")
    low, high = watermarks(broker.bootstrap, "sized")
    assert 150 < low < high == 200
    assert entries(broker, "sized")[0].base_offset == low  # the log starts at its first entry
    retired = [base for base in before if base < low]
    assert retired and min(stored_bases(broker, "sized"), default=low) >= low
    with Wire(("127.0.0.1", broker.port)) as wire:
        assert fetch(wire, "sized", 0, 0).error_code == ErrorCode.offset_out_of_range
        part = fetch(wire, "sized", 0, low, correlation_id=2)
        assert part.error_code == ErrorCode.none and part.log_start_offset == low
        assert records_of(part.records)[0].value == values[low]
    assert metric(broker.metrics_text(), "kafscale_retention_deleted_segments_total") > 0


def test_retention_ms_deletes_segments_whose_records_are_too_old(
    start_broker: Callable[..., Any],
) -> None:
    from aiokafka import AIOKafkaProducer

    broker = start_broker(env=ENV)
    broker.wait_ready()
    create(broker.bootstrap, "dated", {"retention.ms": "3600000"})
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000

    async def produce(count: int, timestamp_ms: int | None) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        try:
            for i in range(count):
                await producer.send_and_wait(
                    "dated", b"y" * 200 + b"%d" % i, partition=0, timestamp_ms=timestamp_ms
                )
        finally:
            await producer.stop()

    asyncio.run(produce(30, two_hours_ago))
    wait_until(lambda: watermarks(broker.bootstrap, "dated") == (30, 30), "every old record gone")
    # A compaction racing retention may have uploaded a segment of chunks retention deleted
    # meanwhile: its commit is refused and the compactor deletes what it uploaded.
    wait_until(lambda: stored_bases(broker, "dated") == [], "no segment object left")
    asyncio.run(produce(5, None))  # fresh records stay
    wait_until(lambda: watermarks(broker.bootstrap, "dated")[1] == 35, "the new records")
    time.sleep(1)  # a few retention rounds
    assert watermarks(broker.bootstrap, "dated") == (30, 35)
