"""The Python side of the benchmarks: confluent-kafka (librdkafka) producing, consuming, measuring
end-to-end latency and running a consumer group, the same way against any bootstrap.

Unlike Kafka's perf tools, which report whole milliseconds, latencies here are measured with
time.perf_counter_ns / time.time_ns and reported as fractional milliseconds.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

# confluent_kafka.admin re-exports NewTopic from cimpl without marking it public for mypy.
from confluent_kafka.admin import AdminClient, NewTopic

MIB = 1 << 20
# Timestamp (ns since the epoch) at the front of every end-to-end latency record.
STAMP = struct.Struct(">q")


@dataclass
class Run:
    """Records and bytes moved, the seconds it took, and per-record latencies in ms."""

    records: int
    bytes: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    # Percentiles a tool computed itself (Kafka's tools print no per-record latencies).
    reported_latency_ms: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def mb_per_sec(self) -> float:
        return self.bytes / MIB / self.seconds

    @property
    def records_per_sec(self) -> float:
        return self.records / self.seconds


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 < q < 100), nearest rank on the sorted values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = math.ceil(q / 100 * len(ordered))  # 1-based: the smallest covering q percent
    return ordered[max(0, min(len(ordered), rank) - 1)]


def latency_summary(avg: float, p50: float, p99: float, p999: float) -> dict[str, float]:
    """The latency figures a result carries, in ms."""
    return {"avg": avg, "p50": p50, "p99": p99, "p99.9": p999}


def payload(size: int) -> bytes:
    """Random uppercase letters, as ProducerPerformance sends (compressible about as much)."""
    rng = random.Random(size)
    return bytes(rng.randrange(65, 91) for _ in range(size))


def create_topic(
    bootstrap: str, topic: str, partitions: int, security: dict[str, str] | None = None
) -> None:
    """`security`: the target's client settings (SASL_SSL), as for every function here."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)
    for future in futures.values():
        try:
            future.result(60)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def wait_for_leaders(
    bootstrap: str,
    topic: str,
    partitions: int,
    timeout: float = 60.0,
    security: dict[str, str] | None = None,
) -> None:
    """Until the topic's Metadata names a leader for each of its partitions: KafScale's brokers
    claim a new topic's partitions after it is created (a claim each, in etcd), and a client
    that came first would spend its first requests on LEADER_NOT_AVAILABLE."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
        led = [] if metadata is None else [p for p in metadata.partitions.values() if p.leader >= 0]
        if len(led) == partitions:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: {len(led)} of {partitions} partitions have a leader")
        time.sleep(0.1)


def produce(
    bootstrap: str,
    topic: str,
    *,
    records: int,
    record_size: int,
    config: dict[str, str],
) -> Run:
    """Send `records` records as fast as the producer takes them; latency is send to ack."""
    value = payload(record_size)
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    latencies: list[float] = []
    errors: list[str] = []

    def acked_from(sent: int) -> Callable[[KafkaError | None, Message], None]:
        def acked(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            latencies.append((time.perf_counter_ns() - sent) / 1e6)

        return acked

    started = time.perf_counter()
    for _ in range(records):
        on_delivery = acked_from(time.perf_counter_ns())
        while True:
            try:
                producer.produce(topic, value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records still unacknowledged after 120 s")
    seconds = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} records failed, first: {errors[0]}")
    return Run(records, records * record_size, seconds, latencies)


def _consumer(bootstrap: str, group: str, extra: dict[str, str] | None = None) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(extra or {}),
        }
    )


def consume(
    bootstrap: str,
    topic: str,
    *,
    records: int,
    timeout: float = 300.0,
    security: dict[str, str] | None = None,
) -> Run:
    """Read `records` records from the start of every partition (assigned, no group join)."""
    consumer = _consumer(bootstrap, f"bench-read-{random.getrandbits(32):08x}", security)
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = size = 0
    started = time.perf_counter()
    deadline = started + timeout
    try:
        while seen < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{topic}: read {seen} of {records} records in {timeout} s")
            # Never ask for more than is left: consume(n, t) waits for n records or t seconds.
            for message in consumer.consume(min(1000, records - seen), 1.0):
                if message.error() is not None:
                    raise RuntimeError(f"{topic}: {message.error()}")
                seen += 1
                size += len(message.value() or b"")
    finally:
        consumer.close()
    return Run(seen, size, time.perf_counter() - started)


def end_to_end(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    seconds: float,
    record_size: int,
    consumer_config: dict[str, str] | None = None,
) -> Run:
    """Produce `rate` records a second for `seconds`, each stamped with its send time; a
    consumer reading from the end (with `consumer_config` on top of the driver's) measures
    stamp-to-delivery for each (one clock, one host)."""
    consumer = _consumer(bootstrap, f"bench-e2e-{random.getrandbits(32):08x}", consumer_config)
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    ends = []
    for p in partitions:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        ends.append(TopicPartition(topic, p, high))
    consumer.assign(ends)
    consumer.consume(1, 0.5)  # start fetching before the first record is sent
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
    total = int(rate * seconds)
    filler = payload(record_size - STAMP.size)

    def send() -> None:
        started = time.perf_counter()
        for i in range(total):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            producer.produce(topic, STAMP.pack(time.time_ns()) + filler)
            producer.poll(0)
        producer.flush(60)

    sender = threading.Thread(target=send)
    latencies: list[float] = []
    started = time.perf_counter()
    sender.start()
    deadline = started + seconds + 120
    try:
        while len(latencies) < total and time.perf_counter() < deadline:
            # poll, not consume(n, timeout): that waits for n records or the whole timeout,
            # which would add up to the timeout to every latency at this rate.
            message = consumer.poll(0.2)
            if message is not None and message.error() is None and (value := message.value()):
                (stamp,) = STAMP.unpack_from(value)
                latencies.append((time.time_ns() - stamp) / 1e6)
    finally:
        sender.join()
        consumer.close()
    if len(latencies) < total:
        raise RuntimeError(f"{topic}: {len(latencies)} of {total} records arrived")
    return Run(total, total * record_size, time.perf_counter() - started, latencies)


def _member(index: int, bootstrap: str, topic: str, group: str, done: Any, out: Any) -> None:
    """One group member (a process of its own): reports how much it read until `done` is set."""
    consumer = _consumer(bootstrap, group, {"session.timeout.ms": "10000"})
    consumer.subscribe([topic])
    count = size = 0
    first: float | None = None
    try:
        while not done.is_set():
            for message in consumer.consume(1000, 0.2):
                if message.error() is None:
                    first = first or time.time()
                    count += 1
                    size += len(message.value() or b"")
            out.put((index, count, size, first))
    finally:
        consumer.close()


def group_consume(
    bootstrap: str, topic: str, *, members: int, records: int, timeout: float = 300.0
) -> Run:
    """`members` consumer processes in one new group read the topic's `records` records; the
    time runs from starting them (joins included) to the last record read by any."""
    context = multiprocessing.get_context("spawn")
    done = context.Event()
    out = context.Queue()
    group = f"bench-group-{random.getrandbits(32):08x}"
    started = time.time()
    procs = [
        context.Process(target=_member, args=(i, bootstrap, topic, group, done, out))
        for i in range(members)
    ]
    for proc in procs:
        proc.start()
    latest: dict[int, tuple[int, int, float | None]] = {}
    finished_at = None
    try:
        while time.time() < started + timeout:
            try:
                index, count, size, first = out.get(timeout=1.0)
            except queue.Empty:
                continue
            latest[index] = (count, size, first)
            total = sum(c for c, _, _ in latest.values())
            if total >= records:
                finished_at = time.time()
                break
    finally:
        done.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    if finished_at is None:
        raise RuntimeError(f"{topic}: the group did not read {records} records in {timeout} s")
    firsts = [f for _, _, f in latest.values() if f is not None]
    run = Run(records, sum(s for _, s, _ in latest.values()), finished_at - started)
    run.extra["first_record_seconds"] = min(firsts) - started if firsts else float("nan")
    return run
