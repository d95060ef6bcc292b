"""Real producers write to KafScale; every acknowledged record is read back from the committed log
(the metadata's entries, their batches from the object store) with the project's own reader."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.errors import ErrorCode
from tests.harness.stored import committed_codecs, committed_records

from .wire import Wire

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "real"])
def running_broker(request: pytest.FixtureRequest, start_broker: Callable[..., Any]) -> Any:
    broker = start_broker(backends=request.param)
    broker.wait_ready()
    return broker


def stored_records(broker: Any, topic: str, partition: int) -> list[batches.Record]:
    """Every record the partition has committed, read back through the metadata and the object
    store (segments and write-ahead chunks, every CRC checked), in offset order."""
    return committed_records(broker.env, topic, partition)


def high_watermark(broker: Any, topic: str, partition: int) -> int:
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        kv = store.get(Keys(config.s3_namespace).partition(topic, partition))
        return records.decode_partition(kv.value).high_watermark if kv else 0
    finally:
        store.close()


# Every codec and both backend sets, without the full cross product (CI time).
@pytest.mark.compat("produce", "aiokafka")
@pytest.mark.parametrize(
    ("backends", "compression"),
    [
        ("embedded", None),
        ("embedded", "gzip"),
        ("embedded", "lz4"),
        ("real", "snappy"),
        ("real", "zstd"),
    ],
)
def test_aiokafka_acks_all_every_record_exactly_once(
    start_broker: Callable[..., Any], backends: str, compression: str | None
) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    running_broker = start_broker(backends=backends)
    running_broker.wait_ready()
    count, partitions = 3000, 3

    async def produce() -> list[Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=running_broker.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("events", partitions, 1)])
        await admin.close()
        producer = AIOKafkaProducer(
            bootstrap_servers=running_broker.bootstrap,
            acks="all",
            compression_type=compression,
            enable_idempotence=False,
            linger_ms=5,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    "events", b"value-%d" % i, key=b"key-%d" % i, headers=[("n", str(i).encode())]
                )
                for i in range(count)
            ]
            return list(await asyncio.gather(*futures))
        finally:
            await producer.stop()

    acked = asyncio.run(produce())
    assert len(acked) == count
    seen: dict[bytes, int] = {}
    for partition in range(partitions):
        stored = stored_records(running_broker, "events", partition)
        assert [r.offset for r in stored] == list(range(len(stored)))  # contiguous from 0
        assert high_watermark(running_broker, "events", partition) == len(stored)
        for record in stored:
            assert record.value is not None and record.key is not None
            assert record.key == b"key-" + record.value.removeprefix(b"value-")
            assert record.headers == (("n", record.value.removeprefix(b"value-")),)
            seen[record.value] = seen.get(record.value, 0) + 1
    assert seen == {b"value-%d" % i: 1 for i in range(count)}
    by_partition = {(m.partition, m.offset) for m in acked}
    assert len(by_partition) == count  # every acknowledged offset distinct


def test_acks_1_and_0_reach_s3_after_the_flush_interval(running_broker: Any) -> None:
    from kafka import KafkaProducer

    for acks in (1, 0):
        topic = f"acks-{acks}"
        producer = KafkaProducer(bootstrap_servers=running_broker.bootstrap, acks=acks)
        try:
            for i in range(500):
                producer.send(topic, b"%d" % i)
            producer.flush(30)
        finally:
            producer.close()
        deadline = time.monotonic() + 30
        while high_watermark(running_broker, topic, 0) < 500:
            assert time.monotonic() < deadline, "records never committed"
            time.sleep(0.1)
        assert [r.value for r in stored_records(running_broker, topic, 0)] == [
            b"%d" % i for i in range(500)
        ]


def produce_request(topic: str, partition: int, records_blob: bytes, acks: int = -1) -> Any:
    schema = load_request_schema(0, 9)
    data = codec.nested(schema, "PartitionProduceData")
    topic_data = codec.nested(schema, "TopicProduceData")
    import datetime

    return codec.build(
        schema,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            codec.build(
                topic_data,
                name=topic,
                partition_data=(codec.build(data, index=partition, records=records_blob),),
            ),
        ),
    )


def test_bad_batches_get_kafka_errors_and_store_nothing(start_broker: Callable[..., Any]) -> None:
    broker = start_broker(env={"KAFSCALE_AUTO_CREATE_PARTITIONS": "1"})
    broker.wait_ready()
    good = batches.build_batch([(b"k", b"v", (), 1_700_000_000_000)])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    huge = batches.build_batch([(None, b"x" * 2_000_000, (), 1_700_000_000_000)])
    schema = load_response_schema(0, 9)
    with Wire(("127.0.0.1", broker.port)) as wire:
        cases = [
            (produce_request("bad", 0, bytes(corrupt)), ErrorCode.corrupt_message),
            (produce_request("bad", 0, huge), ErrorCode.message_too_large),
            (produce_request("bad", 7, good), ErrorCode.unknown_topic_or_partition),
            (produce_request("bad", 0, good, acks=2), ErrorCode.invalid_required_acks),
            (produce_request("bad", 0, good + good), ErrorCode.invalid_record),
        ]
        for correlation_id, (request, expected) in enumerate(cases):
            wire.send(request, correlation_id)
            got_id, response = wire.read_response(schema)
            [topic] = response.responses
            [result] = topic.partition_responses
            assert (got_id, result.error_code) == (correlation_id, expected)
        wire.send(produce_request("bad", 0, good), 99)
        _, response = wire.read_response(schema)
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert response.responses[0].partition_responses[0].base_offset == 0
    assert [r.value for r in stored_records(broker, "bad", 0)] == [b"v"]
    assert "batch refused" in broker.log_text()


def assert_exactly_once(
    broker: Any, topic: str, partitions: int, count: int, prefix: bytes
) -> None:
    seen: dict[bytes, int] = {}
    for partition in range(partitions):
        stored = stored_records(broker, topic, partition)
        assert [r.offset for r in stored] == list(range(len(stored)))
        for record in stored:
            assert record.value is not None
            seen[record.value] = seen.get(record.value, 0) + 1
    assert seen == {prefix + b"-%d" % i: 1 for i in range(count)}


@pytest.mark.compat("produce", param="client_version", prefix="java-")
@pytest.mark.java
@pytest.mark.parametrize(("backends", "client_version"), [("embedded", "3.9"), ("real", "4")])
def test_java_producer_with_default_settings(
    start_broker: Callable[..., Any],
    java_probe: Callable[..., Any],
    backends: str,
    client_version: str,
) -> None:
    import json

    running_broker = start_broker(backends=backends)
    running_broker.wait_ready()
    bootstrap = ["--bootstrap", running_broker.bootstrap]
    created = java_probe(
        client_version, "create-topic", *bootstrap, "--topic", "java", "--partitions", "4"
    )
    assert created.returncode == 0, created.stderr
    for codec_name in ("none", "gzip", "snappy", "lz4", "zstd"):
        result = java_probe(
            client_version,
            "produce",
            *bootstrap,
            "--topic",
            "java",
            "--count",
            "2500",
            "--prefix",
            codec_name,
            "--config",
            f"compression.type={codec_name}",
            timeout=180,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["acknowledged"]["count"] == 2500
    seen: dict[bytes, int] = {}
    for partition in range(4):
        stored = stored_records(running_broker, "java", partition)
        assert [r.offset for r in stored] == list(range(len(stored)))
        assert all(r.headers and r.headers[0][0] == "n" for r in stored)
        for record in stored:
            assert record.value is not None
            seen[record.value] = seen.get(record.value, 0) + 1
    expected = {
        f"{name}-{i}".encode(): 1
        for name in ("none", "gzip", "snappy", "lz4", "zstd")
        for i in range(2500)
    }
    assert seen == expected


def test_aiokafka_idempotent_producer(running_broker: Any) -> None:
    from aiokafka import AIOKafkaProducer

    async def produce() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=running_broker.bootstrap,
            enable_idempotence=True,
            compression_type="lz4",
        )
        await producer.start()
        try:
            futures = [
                await producer.send("idempotent", b"aio-%d" % i, key=b"%d" % i) for i in range(2000)
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(produce())
    assert_exactly_once(running_broker, "idempotent", 1, 2000, b"aio")


def test_resent_duplicate_batch_is_acknowledged_once(start_broker: Callable[..., Any]) -> None:
    import datetime

    broker = start_broker()
    broker.wait_ready()
    schema = load_response_schema(0, 9)
    with Wire(("127.0.0.1", broker.port)) as wire:
        wire.send(
            codec.build(
                load_request_schema(22, 4),
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            ),
            1,
        )
        _, init = wire.read_response(load_response_schema(22, 4))
        assert init.error_code == ErrorCode.none
        pid = int(init.producer_id)

        def send(sequence: int, values: list[bytes]) -> tuple[ErrorCode, int]:
            blob = batches.build_batch(
                [(None, v, (), 1_700_000_000_000) for v in values],
                producer_id=pid,
                producer_epoch=0,
                base_sequence=sequence,
            )
            wire.send(produce_request("dups", 0, blob), sequence + 100)
            _, response = wire.read_response(schema)
            result = response.responses[0].partition_responses[0]
            return result.error_code, int(result.base_offset)

        assert send(0, [b"a", b"b"]) == (ErrorCode.none, 0)
        assert send(0, [b"a", b"b"]) == (ErrorCode.none, 0)  # the resend: same offsets
        assert send(2, [b"c"]) == (ErrorCode.none, 2)
        assert send(2, [b"c"]) == (ErrorCode.none, 2)
        assert send(7, [b"gap"])[0] == ErrorCode.out_of_order_sequence_number
    assert [r.value for r in stored_records(broker, "dups", 0)] == [b"a", b"b", b"c"]


def test_recreated_topic_never_shows_old_records(running_broker: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    admin = AdminClient({"bootstrap.servers": running_broker.bootstrap})

    def write(values: list[bytes]) -> None:
        producer = KafkaProducer(bootstrap_servers=running_broker.bootstrap, acks="all")
        try:
            for value in values:
                producer.send("cycle", value)
            producer.flush(30)
        finally:
            producer.close()

    for generation in range(3):
        admin.create_topics([NewTopic("cycle", 1, 1)])["cycle"].result(30)
        values = [b"gen%d-%d" % (generation, i) for i in range(200 + generation)]
        write(values)
        stored = stored_records(running_broker, "cycle", 0)
        assert [r.value for r in stored] == values
        assert [r.offset for r in stored] == list(range(len(values)))
        admin.delete_topics(["cycle"])["cycle"].result(30)
        assert stored_records(running_broker, "cycle", 0) == []


def test_explicit_flush_commits_everything_now(start_broker: Callable[..., Any]) -> None:
    import os
    import subprocess
    import sys

    from kafka import KafkaProducer

    token = "explicit-flush-admin-token"
    # No timer flush; the admin token is what POST /flush requires.
    broker = start_broker(
        env={"KAFSCALE_FLUSH_INTERVAL_MS": "3600000", "KAFSCALE_ADMIN_TOKEN": token}
    )
    broker.wait_ready()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1)
    try:
        for i in range(300):
            producer.send("held", b"%d" % i)
        producer.flush(30)
    finally:
        producer.close()
    assert high_watermark(broker, "held", 0) == 0  # acknowledged at acks=1, still buffered
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafscale",
            "flush",
            "--metrics-url",
            f"http://127.0.0.1:{broker.metrics_port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KAFSCALE_ADMIN_TOKEN": token},
    )
    assert result.returncode == 0, result.stderr
    assert '"flushed": true' in result.stdout
    assert high_watermark(broker, "held", 0) == 300
    assert [r.value for r in stored_records(broker, "held", 0)] == [b"%d" % i for i in range(300)]


def test_log_append_time_topics_stamp_records_with_broker_time(
    start_broker: Callable[..., Any],
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker()
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name, kind in (("appended", "LogAppendTime"), ("created", "CreateTime")):
        config = {"message.timestamp.type": kind}
        admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    sent_at = 1_500_000_000_000  # long ago: a broker-assigned time is clearly different
    blob = batches.build_batch([(None, b"x", (), sent_at), (None, b"y", (), sent_at + 1)])
    schema = load_response_schema(0, 9)
    before = int(time.time() * 1000)
    with Wire(("127.0.0.1", broker.port)) as wire:
        for correlation_id, name in enumerate(("appended", "created")):
            wire.send(produce_request(name, 0, blob), correlation_id)
            _, response = wire.read_response(schema)
            result = response.responses[0].partition_responses[0]
            assert result.error_code == ErrorCode.none
            if name == "appended":
                assert result.log_append_time is not None
                assert result.log_append_time.timestamp() * 1000 >= before
            else:
                assert result.log_append_time is None  # -1 on the wire
    after = int(time.time() * 1000)
    appended = stored_records(broker, "appended", 0)
    assert len({r.timestamp for r in appended}) == 1
    assert before <= appended[0].timestamp <= after
    assert [r.timestamp for r in stored_records(broker, "created", 0)] == [sent_at, sent_at + 1]


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _produce_kcat(kcat: str, bootstrap: str, topic: str, codec_name: str, count: int) -> None:
    import subprocess

    lines = "".join(f"key-{i}:{codec_name}-{i}\n" for i in range(count))
    subprocess.run(
        [kcat, "-P", "-b", bootstrap, "-t", topic, "-K:", "-H", "n=kcat", "-z", codec_name],
        input=lines.encode(),
        check=True,
        timeout=120,
        capture_output=True,
    )


def _produce_confluent(bootstrap: str, topic: str, codec_name: str, count: int) -> None:
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec_name})
    for i in range(count):
        producer.produce(
            topic,
            key=b"key-%d" % i,
            value=f"{codec_name}-{i}".encode(),
            headers=[("n", b"confluent")],
            on_delivery=lambda error, _message: errors.append(error) if error else None,
        )
        producer.poll(0)
    assert producer.flush(120) == 0, "records left unacknowledged"
    assert errors == []


def _produce_kafka_python(bootstrap: str, topic: str, codec_name: str, count: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec_name == "none" else codec_name,
        acks="all",
    )
    try:
        futures = [
            producer.send(
                topic,
                f"{codec_name}-{i}".encode(),
                key=b"key-%d" % i,
                headers=[("n", b"kafka-python")],
            )
            for i in range(count)
        ]
        producer.flush(120)
        for future in futures:
            future.get(timeout=60)
    finally:
        producer.close()


# The librdkafka clients and kafka-python with every codec, 10,000 records each (aiokafka and the
# Java producers have their own tests above); both backend sets between them.
@pytest.mark.compat("produce", param="client")
@pytest.mark.parametrize(
    ("client", "backends"),
    [("kcat", "embedded"), ("confluent-kafka", "real"), ("kafka-python", "real")],
)
def test_client_produces_10000_records_with_every_codec(
    start_broker: Callable[..., Any], kcat: str, client: str, backends: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(backends=backends)
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("codecs", num_partitions=3)])["codecs"].result(30)
    per_codec = 2000
    for codec_name in CODECS:
        if client == "kcat":
            _produce_kcat(kcat, broker.bootstrap, "codecs", codec_name, per_codec)
        elif client == "confluent-kafka":
            _produce_confluent(broker.bootstrap, "codecs", codec_name, per_codec)
        else:
            _produce_kafka_python(broker.bootstrap, "codecs", codec_name, per_codec)
    header = {"kcat": b"kcat", "confluent-kafka": b"confluent", "kafka-python": b"kafka-python"}
    seen: dict[bytes, int] = {}
    codecs_stored: set[int] = set()
    for partition in range(3):
        stored = stored_records(broker, "codecs", partition)
        assert [r.offset for r in stored] == list(range(len(stored)))  # contiguous from 0
        assert high_watermark(broker, "codecs", partition) == len(stored)
        for record in stored:
            assert record.value is not None and record.key is not None
            assert record.key == b"key-" + record.value.split(b"-")[1]
            assert record.headers == (("n", header[client]),)
            seen[record.value] = seen.get(record.value, 0) + 1
        codecs_stored |= committed_codecs(broker.env, "codecs", partition)
    assert seen == {f"{name}-{i}".encode(): 1 for name in CODECS for i in range(per_codec)}
    # The codecs the producers compressed with are in the committed log as sent (1 gzip, 2 snappy,
    # 3 lz4, 4 zstd).
    assert {1, 2, 3, 4} <= codecs_stored


@pytest.mark.compat("produce", "kcat")
def test_librdkafka_compresses_with_lz4(start_broker: Callable[..., Any], kcat: str) -> None:
    """librdkafka enables lz4 only when the broker advertises FindCoordinator (its LZ4 feature
    flag, rdkafka_feature.c); it does since consumer groups are served."""
    # KAFSCALE_COMPRESSION_CODEC=none keeps batches that arrive uncompressed as they are:
    # librdkafka sends a batch uncompressed when lz4 would not shrink it (a lone small record).
    broker = start_broker(env={"KAFSCALE_COMPRESSION_CODEC": "none"})
    broker.wait_ready()
    _produce_kcat(kcat, broker.bootstrap, "lz4", "lz4", 100)
    deadline = time.monotonic() + 30
    while high_watermark(broker, "lz4", 0) < 100:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stored = committed_codecs(broker.env, "lz4", 0)
    assert 3 in stored and stored <= {0, 3}, stored
