"""Six real Kafka clients producing and consuming exact records, for the round-trip tests.

Every driver has the same two methods:
- `produce(bootstrap, topic, records, codec) -> list[Ack]`: sends `records` (each to its
  partition, in order) compressed with `codec` ("none", "gzip", "snappy", "lz4", "zstd"), waits for
  every acknowledgement (acks=all) and returns the acknowledged (partition, offset) of each
  record, in input order;
- `consume(bootstrap, topics, partitions, start, count, timeout, on_ready=None) -> list[Consumed]`:
  assigns `partitions` of each topic (no consumer group: nothing is committed), positions them at
  `start` -- "earliest", "latest", or a timestamp in ms (the first offset whose timestamp is at or
  after it; a partition without one starts at its end) -- calls `on_ready()` once every position
  is fixed (so whatever it produces is "new" for "latest"), then returns records in the order the
  client delivered them until at least `count` arrived or `timeout` seconds passed (then fewer:
  the caller compares and reports what is missing).

What a client cannot express is refused with ValueError, never dropped silently.

This module holds the record types and the in-process drivers (confluent-kafka, aiokafka,
kafka-python); tests/harness/roundtrip_cli.py the drivers run as subprocesses (kcat, the Java
clients) and `all_clients`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tests.harness.procs import HarnessError

Start = Literal["earliest", "latest"] | int
OnReady = Callable[[], None]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# Producer request / message limit: room for a 1 MiB value plus key, headers and batch overhead.
MAX_REQUEST_BYTES = 3 * 1024 * 1024


@dataclass(frozen=True)
class Record:
    """A record as sent; timestamp None lets the producer stamp it (all kcat can do)."""

    partition: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class Ack:
    partition: int
    offset: int


@dataclass(frozen=True)
class Consumed:
    """A record as a consumer returned it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class Client(Protocol):
    name: str

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]: ...

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]: ...


def _compression(codec: str) -> str | None:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, not {codec!r}")
    return None if codec == "none" else codec


def _missing_acks(name: str, acks: Sequence[Ack | None]) -> list[Ack]:
    if any(ack is None for ack in acks):
        lost = [i for i, ack in enumerate(acks) if ack is None]
        raise HarnessError(f"{name}: {len(lost)} records never acknowledged (first: #{lost[0]})")
    return [ack for ack in acks if ack is not None]


# --- confluent-kafka (librdkafka) ----------------------------------------------------------------


class ConfluentKafka:
    name = "confluent-kafka"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        from confluent_kafka import KafkaError, Message, Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": _compression(codec) or "none",
                "enable.idempotence": True,
                "message.max.bytes": MAX_REQUEST_BYTES,
                "linger.ms": 5,
            }
        )
        acks: list[Ack | None] = [None] * len(records)
        errors: list[str] = []

        def reporter(index: int) -> Callable[[KafkaError | None, Message], None]:
            def report(error: KafkaError | None, message: Message) -> None:
                if error is not None:
                    errors.append(f"#{index}: {error}")
                else:
                    acks[index] = Ack(int(message.partition() or 0), int(message.offset() or 0))

            return report

        for index, record in enumerate(records):
            while True:
                try:
                    producer.produce(
                        topic,
                        value=record.value,
                        key=record.key,
                        partition=record.partition,
                        timestamp=record.timestamp or 0,  # 0: librdkafka stamps "now"
                        headers=list(record.headers),
                        on_delivery=reporter(index),
                    )
                    break
                except BufferError:  # local queue full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(60)
        if errors or left:
            raise HarnessError(f"confluent-kafka: {left} unsent, delivery errors: {errors[:5]}")
        return _missing_acks(self.name, acks)

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError
        from confluent_kafka import TopicPartition as TP

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                # librdkafka wants a group id even for assign(); nothing is ever committed.
                "group.id": "kafscale-roundtrip",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,  # the "latest" handshake: EOF = position fixed
                "auto.offset.reset": "error",
            }
        )
        try:
            wanted = [TP(topic, p) for topic in topics for p in partitions]
            if start == "earliest":
                assignment = [TP(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in wanted]
            elif start == "latest":
                assignment = [TP(tp.topic, tp.partition, OFFSET_END) for tp in wanted]
            else:
                query = [TP(tp.topic, tp.partition, start) for tp in wanted]
                found = consumer.offsets_for_times(query, timeout=30)
                assignment = [
                    TP(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                    for tp in found
                ]
            consumer.assign(assignment)
            waiting = {(tp.topic, tp.partition) for tp in wanted} if on_ready else set()
            received: list[Consumed] = []
            deadline = time.monotonic() + timeout
            while len(received) < count and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=500, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            raise HarnessError(f"confluent-kafka consume: {error}")
                        waiting.discard((message.topic(), message.partition()))
                        continue
                    received.append(_from_librdkafka(message))
                if on_ready is not None and not waiting:
                    on_ready()
                    on_ready = None
            if on_ready is not None:
                raise HarnessError(f"confluent-kafka: no end-of-partition for {sorted(waiting)}")
            return received
        finally:
            consumer.close()


def _from_librdkafka(message: Any) -> Consumed:
    return Consumed(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        key=message.key(),
        value=message.value(),
        headers=tuple(message.headers() or ()),
        timestamp=message.timestamp()[1],
    )


def _from_python_client(m: Any) -> Consumed:
    """aiokafka's and kafka-python's ConsumerRecord (the same attribute names)."""
    return Consumed(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)


# --- aiokafka ------------------------------------------------------------------------------------


class AioKafka:
    name = "aiokafka"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        from aiokafka import AIOKafkaProducer

        async def run() -> list[Ack]:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                compression_type=_compression(codec),
                max_request_size=MAX_REQUEST_BYTES,
                linger_ms=5,
            )
            await producer.start()
            try:
                futures = [
                    await producer.send(
                        topic,
                        record.value,
                        key=record.key,
                        partition=record.partition,
                        timestamp_ms=record.timestamp,
                        headers=list(record.headers),
                    )
                    for record in records
                ]
                return [Ack(m.partition, m.offset) for m in await asyncio.gather(*futures)]
            finally:
                await producer.stop()

        return asyncio.run(run())

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def run() -> list[Consumed]:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="none",
            )
            await consumer.start()
            try:
                wanted = [TopicPartition(topic, p) for topic in topics for p in partitions]
                consumer.assign(wanted)
                if start == "earliest":
                    await consumer.seek_to_beginning(*wanted)
                elif start == "latest":
                    await consumer.seek_to_end(*wanted)
                else:
                    found = await consumer.offsets_for_times({tp: start for tp in wanted})
                    past = [tp for tp, at in found.items() if at is None]
                    for tp, at in found.items():
                        if at is not None:
                            consumer.seek(tp, at.offset)
                    if past:
                        await consumer.seek_to_end(*past)
                for tp in wanted:
                    await consumer.position(tp)  # resolves the seek: the position is fixed
                if on_ready is not None:
                    # In a thread: the callback may run its own event loop (an aiokafka producer).
                    await asyncio.get_running_loop().run_in_executor(None, on_ready)
                received: list[Consumed] = []
                deadline = time.monotonic() + timeout
                while len(received) < count and time.monotonic() < deadline:
                    batches = await consumer.getmany(timeout_ms=200)
                    for messages in batches.values():
                        received.extend(map(_from_python_client, messages))
                return received
            finally:
                await consumer.stop()

        return asyncio.run(run())


# --- kafka-python -------------------------------------------------------------------------------


class KafkaPython:
    name = "kafka-python"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            compression_type=_compression(codec),
            max_request_size=MAX_REQUEST_BYTES,
            linger_ms=5,
        )
        try:
            futures = [
                producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    partition=record.partition,
                    timestamp_ms=record.timestamp,
                )
                for record in records
            ]
            producer.flush(60)
            return [Ack(m.partition, m.offset) for m in (f.get(timeout=30) for f in futures)]
        finally:
            producer.close(10)

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
        )
        try:
            wanted = [TopicPartition(topic, p) for topic in topics for p in partitions]
            consumer.assign(wanted)
            if start == "earliest":
                consumer.seek_to_beginning(*wanted)
            elif start == "latest":
                consumer.seek_to_end(*wanted)
            else:
                found = consumer.offsets_for_times({tp: start for tp in wanted})
                past = [tp for tp, at in found.items() if at is None]
                for tp, at in found.items():
                    if at is not None:
                        consumer.seek(tp, at.offset)
                if past:
                    consumer.seek_to_end(*past)
            for tp in wanted:
                consumer.position(tp)  # resolves the seek: the position is fixed
            if on_ready is not None:
                on_ready()
            received: list[Consumed] = []
            deadline = time.monotonic() + timeout
            while len(received) < count and time.monotonic() < deadline:
                for messages in consumer.poll(timeout_ms=200).values():
                    received.extend(map(_from_python_client, messages))
            return received
        finally:
            consumer.close(autocommit=False)


# --- processes whose output is read while they run (kcat, the Java probe) -------------------------
