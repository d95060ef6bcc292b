"""A load test: many producer and consumer workers in parallel against one running broker
(KafScale or Apache Kafka), checking that every record arrives.

Run from the repository root, against a broker a benchmark driver already started:

    .venv/bin/python -m pytest -p no:cacheprovider -n 4 bench/load --rootdir bench/load \\
        --load-bootstrap 127.0.0.1:9092 --load-records 20000 --load-record-size 1024 \\
        --load-run-id abc123 --load-report /tmp/load.json

Options (conftest.py): --load-bootstrap (required: without it every case fails), --load-records
per case (20000), --load-record-size in value bytes (1024, at least 20), --load-partitions per
topic (3), --load-cases (8; `-n` spreads them over xdist workers), --load-timeout seconds a case
may take (300), --load-run-id (names topics and groups; the default, a random hex, keeps reruns
apart: a rerun with the same id finds the earlier records, counted as duplicates) and
--load-report (a JSON file: the cases' measurements, totals and aggregate rates over the
session's wall time, the number of failed cases and of xdist workers).

Each case has its own topic and consumer group, `load-<run id>-<case>`. A consumer in a thread
subscribes before anything is produced; a producer (acks=all, not idempotent) sends `records`
records keyed by their sequence number; the consumer reads until every sequence number arrived or
the deadline passed. Every value begins with a header, `HEADER`, whose CRC covers the rest of the
value. The case fails on a delivery error, a missing sequence number, a corrupt record or a record
of another case; duplicates are counted, not failed (delivery is at least once).

The measurements of a case (seconds from `time.monotonic`; bytes are value bytes):
- produce_seconds: first send until flush() returns (every record acknowledged);
- consume_seconds: consumer thread started (before the group join) until the last new record;
- end_to_end_seconds: first send until the last new record arrived.
On KafScale a record is visible to consumers only once its segment is flushed to storage, and a
group's first join takes a few seconds: nothing here depends on timing except the deadline.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

# confluent_kafka.admin re-exports NewTopic from cimpl without marking it public for mypy.
from confluent_kafka.admin import AdminClient, NewTopic

from .conftest import LoadSettings

# The value's header: magic, case, sequence number, zlib.crc32 of the rest of the value.
# The rest is pseudo-random bytes (random.Random.randbytes, about 3 us per KiB), so compression
# anywhere on the path cannot shrink the measured bytes.
HEADER = struct.Struct(">4sIQI")
MAGIC = b"KSLD"
# A broker that does not answer metadata within this (or the case's timeout) is not there.
CONNECT_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.5
# librdkafka logs to stderr only what is critical: errors reach the error callbacks and, when a
# case fails, its message (a broker that is down would otherwise log every reconnect attempt).
CLIENT_LOG_LEVEL = 2
SHOWN = 10  # missing sequence numbers, errors and corrupt records listed in a failure


class RecordProblem(Exception):
    """A consumed record that is not one this case produced intact."""


class ForeignRecord(RecordProblem):
    """A well-formed record of another case."""


def make_value(case: int, seq: int, body: bytes) -> bytes:
    return HEADER.pack(MAGIC, case, seq, zlib.crc32(body)) + body


def check_record(case: int, records: int, key: bytes | None, value: bytes | None) -> int:
    """The sequence number of an intact record of `case`; raises RecordProblem otherwise."""
    if value is None or len(value) < HEADER.size:
        size = "null" if value is None else f"{len(value)} bytes"
        raise RecordProblem(f"key {key!r}: value of {size}")
    magic, value_case, seq, crc = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise RecordProblem(f"key {key!r}: magic {magic!r}")
    if zlib.crc32(memoryview(value)[HEADER.size :]) != crc:
        raise RecordProblem(f"key {key!r}: seq {seq}: crc mismatch")
    if value_case != case:
        raise ForeignRecord(f"key {key!r}: seq {seq} of case {value_case}")
    if key != b"%d" % seq or seq >= records:
        raise RecordProblem(f"key {key!r}: header seq {seq} (of {records})")
    return int(seq)


@dataclass
class Consumption:
    """What the consumer thread saw; read by the test only after the thread ended."""

    records: int
    started: float  # when the consumer thread started (before the consumer joins its group)
    seen: bytearray = field(init=False)
    unseen: int = field(init=False)
    duplicates: int = 0
    corrupt: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    client_errors: Counter[str] = field(default_factory=Counter)
    last_new: float | None = None  # when the last sequence number not seen before arrived
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        self.seen = bytearray(self.records)
        self.unseen = self.records

    def missing(self) -> list[int]:
        return [seq for seq, count in enumerate(self.seen) if not count]


def consume(
    settings: LoadSettings,
    case: int,
    topic: str,
    deadline: float,
    stop: threading.Event,
    out: Consumption,
) -> None:
    """The consumer thread: reads `topic` in a fresh group until every record arrived, `stop` is
    set or `deadline` passes. Exceptions land in `out.failure`."""
    try:
        consumer = Consumer(
            {
                "bootstrap.servers": settings.bootstrap,
                "group.id": topic,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "error_cb": lambda err: out.client_errors.update([err.str()]),
                "log_level": CLIENT_LOG_LEVEL,
            }
        )
        try:
            consumer.subscribe([topic])
            while out.unseen and not stop.is_set() and time.monotonic() < deadline:
                for message in consumer.consume(1000, POLL_SECONDS):
                    error = message.error()
                    if error is not None:
                        out.client_errors.update([error.str()])
                        if error.fatal():
                            raise KafkaException(error)
                        continue
                    take(case, message.key(), message.value(), out)
        finally:
            consumer.close()
    except BaseException as exc:
        out.failure = exc


def take(case: int, key: bytes | None, value: bytes | None, out: Consumption) -> None:
    try:
        seq = check_record(case, out.records, key, value)
    except ForeignRecord as exc:
        out.foreign.append(str(exc))
        return
    except RecordProblem as exc:
        out.corrupt.append(str(exc))
        return
    if out.seen[seq]:
        out.duplicates += 1
        return
    out.seen[seq] = 1
    out.unseen -= 1
    out.last_new = time.monotonic()


@dataclass
class Delivery:
    """The producer's delivery reports (called from flush() and poll(), in the test's thread)."""

    delivered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)

    def report(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.errors.update([error.str()])


def create_topic(bootstrap: str, settings: LoadSettings, topic: str, deadline: float) -> None:
    """Creates `topic` (an existing one is fine) and waits until metadata shows all partitions, so
    the consumer's subscription finds it on its first metadata request."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": CLIENT_LOG_LEVEL})
    connect_timeout = min(CONNECT_TIMEOUT_SECONDS, settings.timeout)
    failure: KafkaException | None = None
    try:
        admin.list_topics(timeout=connect_timeout)
    except KafkaException as exc:
        failure = exc
    if failure is not None:  # failing outside the except clause keeps the message alone
        pytest.fail(
            f"no broker answered a metadata request on {bootstrap} within "
            f"{connect_timeout:.0f} s: {failure.args[0].str()}",
            pytrace=False,
        )
    new_topic = NewTopic(topic, settings.partitions, 1)
    future = admin.create_topics([new_topic], request_timeout=remaining(deadline))[topic]
    try:
        future.result(timeout=remaining(deadline))
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            failure = exc
    if failure is not None:
        pytest.fail(f"creating {topic} on {bootstrap} failed: {failure}", pytrace=False)
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=remaining(deadline)).topics.get(topic)
        if metadata is not None and metadata.error is None:
            if len(metadata.partitions) == settings.partitions:
                return
            pytest.fail(f"{topic} has {len(metadata.partitions)} partitions", pytrace=False)
        time.sleep(0.1)
    pytest.fail(f"{topic} did not appear in metadata before the deadline", pytrace=False)


def remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


def produce(
    settings: LoadSettings, case: int, topic: str, deadline: float, delivery: Delivery
) -> tuple[float, int]:
    """Sends every record and flushes; returns the first send's time and the records flush()
    left undelivered at the deadline."""
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 5,
            "batch.size": 262144,
            # A record not acknowledged by the deadline is a delivery error, not a silent wait.
            "message.timeout.ms": int(settings.timeout * 1000),
            "on_delivery": delivery.report,
            "error_cb": lambda err: delivery.client_errors.update([err.str()]),
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    rng = random.Random(case)
    body_size = settings.record_size - HEADER.size
    first_send = time.monotonic()
    for seq in range(settings.records):
        value = make_value(case, seq, rng.randbytes(body_size))
        key = b"%d" % seq
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:  # the client's queue is full: serve delivery reports
                if time.monotonic() >= deadline:
                    return first_send, settings.records - seq + len(producer)
                producer.poll(0.05)
        if seq % 1000 == 999:
            producer.poll(0)
    return first_send, producer.flush(remaining(deadline))


def listed(title: str, items: list[Any]) -> str:
    shown = ", ".join(str(item) for item in items[:SHOWN])
    more = f", ... ({len(items)} in all)" if len(items) > SHOWN else ""
    return f"{title}: {shown}{more}"


def counted(title: str, errors: Counter[str]) -> str:
    """The most frequent `errors`, each with its count."""
    shown = "; ".join(f"{text} (x{count})" for text, count in errors.most_common(SHOWN))
    return f"{title}: {shown}"


def problems(
    settings: LoadSettings, delivery: Delivery, undelivered: int, seen: Consumption
) -> list[str]:
    found = []
    if delivery.errors:
        found.append(counted(f"{delivery.errors.total()} delivery errors", delivery.errors))
    if undelivered:
        found.append(f"{undelivered} records unacknowledged when the deadline passed")
    if seen.failure is not None:
        found.append(f"the consumer failed: {seen.failure!r}")
    missing = seen.missing()
    if missing:
        title = f"{len(missing)} of {settings.records} records missing"
        found.append(listed(f"{title} (case timeout {settings.timeout:g} s)", missing))
    if seen.corrupt:
        found.append(listed(f"{len(seen.corrupt)} corrupt records", seen.corrupt))
    if seen.foreign:
        found.append(listed(f"{len(seen.foreign)} records of other cases", seen.foreign))
    client_errors = delivery.client_errors + seen.client_errors
    if found and client_errors:
        found.append(counted("client errors", client_errors))
    return found


def test_every_record_arrives(case: int, load_settings: LoadSettings) -> None:
    settings = load_settings
    bootstrap = settings.bootstrap
    if not bootstrap:
        pytest.fail(
            "--load-bootstrap is required: the bootstrap servers of the broker under test, e.g. "
            "--load-bootstrap 127.0.0.1:9092",
            pytrace=False,
        )
    topic = f"load-{settings.run_id}-{case}"
    deadline = time.monotonic() + settings.timeout
    create_topic(bootstrap, settings, topic, deadline)

    seen = Consumption(settings.records, started=time.monotonic())
    stop = threading.Event()
    consumer = threading.Thread(
        target=consume, args=(settings, case, topic, deadline, stop, seen), daemon=True
    )
    consumer.start()
    delivery = Delivery()
    try:
        first_send, undelivered = produce(settings, case, topic, deadline, delivery)
    except BaseException:
        stop.set()
        consumer.join(CONNECT_TIMEOUT_SECONDS)
        raise
    flushed = time.monotonic()
    if delivery.errors or undelivered:
        stop.set()  # what was not delivered will never arrive: fail now, not at the deadline
    consumer.join(remaining(deadline) + CONNECT_TIMEOUT_SECONDS)
    stop.set()
    if consumer.is_alive():
        pytest.fail(f"the consumer of {topic} did not stop after the deadline", pytrace=False)

    settings.append_report(
        {
            "case": case,
            "worker": settings.worker_id,
            "topic": topic,
            "records": delivery.delivered,
            "bytes": delivery.delivered * settings.record_size,
            "produce_seconds": flushed - first_send,
            "consume_seconds": None if seen.last_new is None else seen.last_new - seen.started,
            "end_to_end_seconds": None if seen.last_new is None else seen.last_new - first_send,
            "received": settings.records - seen.unseen,
            "duplicates": seen.duplicates,
            "missing": seen.unseen,
            "corrupt": len(seen.corrupt),
            "foreign": len(seen.foreign),
            "delivery_errors": delivery.errors.total() + undelivered,
        }
    )
    found = problems(settings, delivery, undelivered, seen)
    if found:
        pytest.fail(f"{topic} on {settings.bootstrap}:\n" + "\n".join(found), pytrace=False)
