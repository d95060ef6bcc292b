"""The read path against real processes: long polling at the tail, cold ranged reads after a
restart, many segments without listings, and S3 outages."""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.errors import ErrorCode
from tests.harness.stored import StoredEntry, committed_entries

from .test_produce import high_watermark
from .wire import Wire

pytestmark = pytest.mark.integration

FETCH_VERSION = 12
FETCH_RESPONSE = load_response_schema(1, FETCH_VERSION)


def fetch(
    wire: Wire,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_bytes: int = 1024 * 1024,
    max_wait_ms: int = 0,
    correlation_id: int = 1,
) -> Any:
    """One partition's part of a Fetch v12 response."""
    request = fetch_request(topic, partition, offset, max_bytes, max_wait_ms)
    wire.send(request, correlation_id)
    got_id, response = wire.read_response(FETCH_RESPONSE)
    assert got_id == correlation_id
    return response.responses[0].partitions[0]


def fetch_request(topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int) -> Any:
    schema = load_request_schema(1, FETCH_VERSION)
    return codec.build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            codec.build(
                codec.nested(schema, "FetchTopic"),
                topic=topic,
                partitions=(
                    codec.build(
                        codec.nested(schema, "FetchPartition"),
                        partition=partition,
                        fetch_offset=offset,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def records_of(blob: bytes | None) -> list[batches.Record]:
    found: list[batches.Record] = []
    view = memoryview(blob or b"")
    position = 0
    while position < len(view):
        header = batches.read_header(view, position)
        found.extend(batches.iter_records(view[position : position + header.size]))
        position += header.size
    return found


def metric(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples (optionally those whose labels contain ``labels``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line):
            match = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
            if match:
                total += float(match.group(2))
    return total


def wait_committed(broker: Any, topic: str, partition: int, count: int) -> None:
    deadline = time.monotonic() + 60
    while high_watermark(broker, topic, partition) < count:
        assert time.monotonic() < deadline, "records never committed"
        time.sleep(0.1)


def broker_cpu_seconds(broker: Any) -> float:
    ticks = 0
    for pid in [broker.pid, *broker.children()]:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def produce_sequentially(bootstrap: str, topic: str, values: list[bytes], acks: int = 1) -> None:
    """One record per batch (send and wait each), so batches and offsets line up."""
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks, linger_ms=0)
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value, partition=0)
        finally:
            await producer.stop()

    asyncio.run(run())


def test_tail_consumer_gets_new_records_promptly_and_idles_cheaply(
    start_broker: Callable[..., Any],
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    broker = start_broker()
    broker.wait_ready()
    flush_interval_s = 0.5  # the default KAFSCALE_FLUSH_INTERVAL_MS

    async def run() -> tuple[float, float, list[float]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks=1)
        await producer.start()
        await producer.send_and_wait("tail", b"before")
        wait_committed(broker, "tail", 0, 1)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=500)
        await consumer.start()
        partition = TopicPartition("tail", 0)
        consumer.assign([partition])
        await consumer.seek_to_end(partition)
        assert await consumer.position(partition) == 1
        # Idle: the consumer long-polls at the end while nothing is produced.
        cpu_before, started = broker_cpu_seconds(broker), time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.getone(), 10)
        idle_cpu, idle_window = broker_cpu_seconds(broker) - cpu_before, time.monotonic() - started
        latencies = []
        for i in range(3):
            sent = time.monotonic()
            await producer.send_and_wait("tail", b"new-%d" % i)
            message = await asyncio.wait_for(consumer.getone(), 10)
            latencies.append(time.monotonic() - sent)
            assert (message.offset, message.value) == (1 + i, b"new-%d" % i)
        await consumer.stop()
        await producer.stop()
        return idle_cpu, idle_window, latencies

    idle_cpu, idle_window, latencies = asyncio.run(run())
    # the bounds: delivered within flush interval + 1 s; idle is a small fraction of
    # one core summed over every broker process (measured ~2%)
    assert max(latencies) < flush_interval_s + 1.0, latencies
    assert idle_cpu < 0.1 * idle_window, f"{idle_cpu:.2f} CPU-s in {idle_window:.1f} s idle"
    assert "kafscale_fetch_wait_seconds_count" in broker.metrics_text()


def test_a_parked_fetch_is_abandoned_when_its_client_goes_away(
    start_broker: Callable[..., Any],
) -> None:
    """Kafka drops the in-flight work of a closed connection: a long poll whose client is gone
    must not be served out to its max wait (holding a task, and a shutdown, for up to that)."""
    from aiokafka import AIOKafkaProducer

    broker = start_broker()
    broker.wait_ready()

    async def produce_one() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks=1)
        await producer.start()
        await producer.send_and_wait("parked", b"only")
        await producer.stop()

    asyncio.run(produce_one())
    wait_committed(broker, "parked", 0, 1)
    address = ("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1]))
    with Wire(address) as wire:
        # at the end of the log, waiting up to 2 minutes for one byte
        wire.send(fetch_request("parked", 0, 1, 1024, max_wait_ms=120_000))
        deadline = time.monotonic() + 30
        while metric(broker.metrics_text(), "kafscale_fetches_waiting") < 1:
            assert time.monotonic() < deadline, "the fetch never parked"
            time.sleep(0.1)
    # the client is gone: the frontend cancels the fetch long before its 2 minutes
    deadline = time.monotonic() + 30
    while metric(broker.metrics_text(), "kafscale_requests_abandoned_total") < 1:
        assert time.monotonic() < deadline, "the parked fetch was not abandoned"
        time.sleep(0.2)
    # and other clients are served as before
    with Wire(address) as wire:
        part = fetch(wire, "parked", 0, 0)
        assert [r.value for r in records_of(part.records)] == [b"only"]


def stored(broker: Any) -> list[StoredEntry]:
    return committed_entries(broker.env, "cold", 0)


def test_cold_read_from_the_middle_of_a_segment_is_a_ranged_get(
    start_broker: Callable[..., Any],
) -> None:
    env = {
        "KAFSCALE_FLUSH_INTERVAL_MS": "60000",
        "KAFSCALE_SEGMENT_BYTES": "4MiB",
        "KAFSCALE_COMPACTION_MAX_AGE_MS": "1000",
    }
    broker = start_broker(backends="real", env=env)
    broker.wait_ready()
    values = [b"%05d-" % i + os.urandom(1000) for i in range(3000)]  # ~3.1 MB, one segment
    produce_sequentially(broker.bootstrap, "cold", values)
    with Wire(("127.0.0.1", broker.port)):
        pass
    assert broker.terminate() == 0  # drains: the buffer becomes one committed chunk
    broker = start_broker(env=broker.env)
    broker.wait_ready()
    # a second old, the chunk is compacted into one spec segment (with its .index)
    deadline = time.monotonic() + 60
    while [(e.is_chunk, e.record.base_offset, e.record.last_offset) for e in stored(broker)] != [
        (False, 0, 2999)
    ]:
        assert time.monotonic() < deadline, "the chunk was never compacted into one segment"
        time.sleep(0.5)
    assert broker.terminate() == 0
    broker = start_broker(env=broker.env)  # caches empty
    broker.wait_ready()
    wait_committed(broker, "cold", 0, 3000)
    before = broker.metrics_text()
    with Wire(("127.0.0.1", broker.port)) as wire:
        part = fetch(wire, "cold", 0, 1717, max_bytes=1)
    assert part.error_code == ErrorCode.none
    found = records_of(part.records)
    assert [(r.offset, r.value) for r in found] == [(1717, values[1717])]  # one whole batch
    after = broker.metrics_text()
    read = metric(after, "kafscale_s3_get_bytes_total") - metric(
        before, "kafscale_s3_get_bytes_total"
    )
    segment_size = sum(len(v) + 70 for v in values)
    assert 0 < read < segment_size / 10, (
        f"{read} bytes read for one record of a {segment_size} B segment"
    )
    # the same fetch again is served from the cache: no further object-store reads
    with Wire(("127.0.0.1", broker.port)) as wire:
        assert records_of(fetch(wire, "cold", 0, 1717, max_bytes=1).records)[0].offset == 1717
    again = broker.metrics_text()
    assert metric(again, "kafscale_s3_requests_total", 'operation="get"') == metric(
        after, "kafscale_s3_requests_total", 'operation="get"'
    )
    assert metric(again, "kafscale_cache_lookups_total", 'result="hit"') > 0


def test_hundreds_of_segments_random_offsets_without_listing(
    start_broker: Callable[..., Any],
) -> None:
    env = {"KAFSCALE_SEGMENT_BYTES": "1KiB", "KAFSCALE_CACHE_SIZE": "0"}
    broker = start_broker(backends="real", env=env)
    broker.wait_ready()
    values = [b"record-%04d-" % i + b"x" * 90 for i in range(2000)]  # ~10 records a segment
    produce_sequentially(broker.bootstrap, "many", values)
    wait_committed(broker, "many", 0, len(values))
    before = broker.metrics_text()
    segments = metric(before, "kafscale_flushes_total")
    assert segments >= 150, f"only {segments} segments"
    rng = random.Random(7)
    with Wire(("127.0.0.1", broker.port)) as wire:
        for correlation_id, offset in enumerate(rng.sample(range(len(values)), 150)):
            part = fetch(wire, "many", 0, offset, max_bytes=1, correlation_id=correlation_id)
            assert part.error_code == ErrorCode.none
            first = records_of(part.records)[0]
            assert (first.offset, first.value) == (offset, values[offset])
        # reading the whole partition in order crosses every segment boundary
        offset, seen = 0, []
        while offset < len(values):
            part = fetch(wire, "many", 0, offset, max_bytes=64 * 1024)
            found = records_of(part.records)
            assert found and found[0].offset == offset
            seen.extend(found)
            offset = found[-1].offset + 1
    assert [r.value for r in seen] == values
    after = broker.metrics_text()
    lists = 'operation="list"'
    assert metric(after, "kafscale_s3_requests_total", lists) == metric(
        before, "kafscale_s3_requests_total", lists
    )


def test_s3_outage_fails_fetches_fast_and_the_consumer_resumes_without_gaps(
    start_broker: Callable[..., Any], s3_server: Any
) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    env = {"KAFSCALE_SEGMENT_BYTES": "8KiB", "KAFSCALE_CACHE_SIZE": "0"}
    broker = start_broker(backends="real", env=env)
    broker.wait_ready()
    values = [b"value-%04d-" % i + b"y" * 200 for i in range(600)]
    produce_sequentially(broker.bootstrap, "outage", values)
    wait_committed(broker, "outage", 0, len(values))
    s3_server.stop()
    try:
        with Wire(("127.0.0.1", broker.port), timeout=30) as wire:
            started = time.monotonic()
            part = fetch(wire, "outage", 0, 0)
            first_failure = time.monotonic() - started
            assert part.error_code == ErrorCode.kafka_storage_error  # retriable
            started = time.monotonic()
            for correlation_id in range(2, 7):
                part = fetch(wire, "outage", 0, 100, correlation_id=correlation_id)
                assert part.error_code == ErrorCode.kafka_storage_error
            refused = (time.monotonic() - started) / 5
        assert first_failure < 15 and refused < 1.0, (first_failure, refused)

        async def consume_through_the_outage() -> list[Any]:
            consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
            await consumer.start()
            partition = TopicPartition("outage", 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            got: list[Any] = []
            try:
                restarted = False
                deadline = time.monotonic() + 90
                while len(got) < len(values) and time.monotonic() < deadline:
                    batch = await consumer.getmany(partition, timeout_ms=500)
                    got.extend(batch.get(partition, []))
                    if not restarted:
                        assert got == []  # nothing can be read while S3 is down
                        await asyncio.sleep(2)
                        s3_server.start()
                        restarted = True
            finally:
                await consumer.stop()
            return got

        got = asyncio.run(consume_through_the_outage())
    finally:
        if not s3_server.running:
            s3_server.start()
    assert [m.offset for m in got] == list(range(len(values))), broker.log_tail(
        40
    )  # no gap, no duplicate
    assert [m.value for m in got] == values
    assert "object store reads succeed again" in broker.log_text()
