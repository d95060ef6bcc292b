"""The operations APIs driven by real admin clients: DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, CreatePartitions, DescribeCluster (and SaslHandshake), with the effect of
each change seen by the requests that follow it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from kafscale.protocol.errors import ErrorCode
from tests.integration.wire import Wire

pytestmark = pytest.mark.integration

# Every topic config Kafka 4.3 defines: KafScale accepts and describes them all.
TOPIC_CONFIGS = {
    "cleanup.policy",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "follower.replication.throttled.replicas",
    "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes",
    "local.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "remote.storage.enable",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
}


@pytest.fixture(params=["embedded", "real"])
def running_broker(request: pytest.FixtureRequest, start_broker: Callable[..., Any]) -> Any:
    broker = start_broker(backends=request.param)
    broker.wait_ready()
    return broker


def error_name(future: Any) -> str | None:
    """None if the admin future succeeded, else the Kafka error's name."""
    try:
        future.result(30)
    except Exception as exc:
        return str(exc.args[0].name())
    return None


def confluent_configs(admin: Any, kind: Any, name: str) -> dict[str, tuple[str | None, str]]:
    """{config: (value, source name)} of a topic or broker."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    resource = ConfigResource(kind, name)
    described = admin.describe_configs([resource], request_timeout=20)[resource].result(30)
    return {k: (v.value, ConfigSource(v.source).name) for k, v in described.items()}


def produce_one(bootstrap: str, topic: str, value: bytes, partition: int = 0) -> str | None:
    """None once the record is acknowledged (acks=all), else the error's name."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.max.bytes": 10_000_000}
    )
    outcome: list[str | None] = []
    producer.produce(
        topic,
        value,
        partition=partition,
        on_delivery=lambda err, _: outcome.append(err.name() if err else None),
    )
    producer.flush(30)
    assert len(outcome) == 1
    return outcome[0]


def consume_partition(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "admin-test", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return [message.value()]
        return []
    finally:
        consumer.close()


# Legacy AlterConfigs is deprecated in clients, but Kafka 4 still serves it (and so do we).
@pytest.mark.compat("admin", "confluent-kafka")
@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_confluent_kafka_configs_and_partitions(running_broker: Any) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
        ResourceType,
    )

    bootstrap = running_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("orders", 2, 1)])["orders"].result(30)
    topic = ResourceType.TOPIC
    described = confluent_configs(admin, topic, "orders")
    assert set(described) == TOPIC_CONFIGS
    assert described["max.message.bytes"] == ("1048588", "DEFAULT_CONFIG")
    broker = confluent_configs(admin, ResourceType.BROKER, "0")
    assert broker["log.segment.bytes"] == ("4194304", "DEFAULT_CONFIG")
    assert broker["kafscale.broker.port"] == (str(running_broker.port), "STATIC_BROKER_CONFIG")

    # Incremental: lower max.message.bytes; a bigger record is then refused.
    lowered = ConfigResource(
        topic,
        "orders",
        incremental_configs=[
            ConfigEntry("max.message.bytes", "10000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    assert error_name(admin.incremental_alter_configs([lowered])[lowered]) is None
    described = confluent_configs(admin, topic, "orders")
    assert described["max.message.bytes"] == ("10000", "DYNAMIC_TOPIC_CONFIG")
    assert described["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert produce_one(bootstrap, "orders", os.urandom(20_000)) == "MSG_SIZE_TOO_LARGE"
    assert produce_one(bootstrap, "orders", b"small") is None

    # Legacy AlterConfigs replaces the whole set: max.message.bytes is back to its default.
    replaced = ConfigResource(topic, "orders", set_config={"retention.bytes": "1000000"})
    assert error_name(admin.alter_configs([replaced])[replaced]) is None
    described = confluent_configs(admin, topic, "orders")
    assert described["max.message.bytes"] == ("1048588", "DEFAULT_CONFIG")
    assert described["retention.ms"] == ("604800000", "DEFAULT_CONFIG")
    assert described["retention.bytes"] == ("1000000", "DYNAMIC_TOPIC_CONFIG")
    assert produce_one(bootstrap, "orders", os.urandom(20_000)) is None

    refused = {
        "broker": ConfigResource(ResourceType.BROKER, "0", set_config={"num.partitions": "3"}),
        "invalid": ConfigResource(topic, "orders", set_config={"segment.ms": "0"}),
        "ghost": ConfigResource(topic, "ghost", set_config={"retention.ms": "1"}),
    }
    assert {name: error_name(admin.alter_configs([r])[r]) for name, r in refused.items()} == {
        "broker": "POLICY_VIOLATION",
        "invalid": "INVALID_CONFIG",
        "ghost": "UNKNOWN_TOPIC_OR_PART",
    }

    # More partitions: Metadata shows them, and the new one takes records at once.
    assert error_name(admin.create_partitions([NewPartitions("orders", 4)])["orders"]) is None
    metadata = admin.list_topics(timeout=20)
    assert sorted(metadata.topics["orders"].partitions) == [0, 1, 2, 3]
    assert produce_one(bootstrap, "orders", b"in partition 3", partition=3) is None
    assert consume_partition(bootstrap, "orders", 3) == [b"in partition 3"]
    fewer = admin.create_partitions([NewPartitions("orders", 3)])["orders"]
    assert error_name(fewer) == "INVALID_PARTITIONS"

    cluster = admin.describe_cluster(request_timeout=20).result(30)
    assert cluster.controller.id == 0
    assert [(n.id, n.port) for n in cluster.nodes] == [(0, running_broker.port)]
    assert cluster.cluster_id


@pytest.mark.compat("admin", "kafka-python", "aiokafka")
def test_kafka_python_and_aiokafka_admin(start_broker: Callable[..., Any]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AioNewPartitions
    from aiokafka.admin.config_resource import ConfigResource as AioResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioType
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic

    broker = start_broker()
    broker.wait_ready()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("events", 1, 1)])
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "events", configs={"retention.ms": "60000"})]
        )
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "events")])
        retention = described["topic"]["events"]["retention.ms"]
        assert (retention["value"], retention["config_source"]) == (
            "60000",
            "DYNAMIC_TOPIC_CONFIG",
        )
        admin.create_partitions({"events": NewPartitions(3)})
        cluster = admin.describe_cluster()
        assert cluster["controller_id"] == 0 and len(cluster["brokers"]) == 1
    finally:
        admin.close()

    async def with_aiokafka() -> tuple[Any, Any]:
        client = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await client.start()
        try:
            topic = AioResource(AioType.TOPIC, "events", configs={"segment.bytes": "2097152"})
            [altered] = await client.alter_configs([topic])
            await client.create_partitions({"events": AioNewPartitions(5)})
            [described] = await client.describe_configs([AioResource(AioType.TOPIC, "events")])
            return altered, described
        finally:
            await client.close()

    altered, described = asyncio.run(with_aiokafka())
    assert altered.resources[0][0] == ErrorCode.none
    [(error, _, _, name, entries)] = described.resources
    assert (error, name) == (ErrorCode.none, "events")
    values = {entry[0]: (entry[1], entry[3]) for entry in entries}
    # aiokafka sends the legacy AlterConfigs: retention.ms returned to its default.
    assert values["segment.bytes"] == ("2097152", 1)
    assert values["retention.ms"] == ("604800000", 5)

    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=20)
    assert len(metadata.topics["events"].partitions) == 5


@pytest.mark.compat("admin", "java-3.9", "java-4")
@pytest.mark.java
def test_java_admin_configs_and_partitions(
    start_broker: Callable[..., Any], java_probe: Any
) -> None:
    broker = start_broker()
    broker.wait_ready()
    bootstrap = ["--bootstrap", broker.bootstrap]
    for version in ("3.9", "4"):
        topic = f"java-{version}"
        java_probe.json(version, "create-topic", *bootstrap, "--topic", topic)
        configs = java_probe.json(version, "describe-configs", *bootstrap, "--topic", topic)
        configs = configs["configs"]
        assert set(configs) == TOPIC_CONFIGS
        assert configs["cleanup.policy"]["type"] == "LIST"
        assert configs["segment.bytes"]["synonyms"] == [
            {"name": "log.segment.bytes", "value": "4194304", "source": "DEFAULT_CONFIG"}
        ]
        java_probe.json(
            version,
            "alter-configs",
            *bootstrap,
            "--topic",
            topic,
            "--set",
            "max.message.bytes=4096,segment.bytes=1048576",
            "--append",
            "cleanup.policy=delete",
        )
        configs = java_probe.json(version, "describe-configs", *bootstrap, "--topic", topic)
        message_bytes = configs["configs"]["max.message.bytes"]
        assert (message_bytes["value"], message_bytes["source"]) == (
            "4096",
            "DYNAMIC_TOPIC_CONFIG",
        )
        assert not message_bytes["readOnly"]
        java_probe.json(
            version, "alter-configs", *bootstrap, "--topic", topic, "--delete", "max.message.bytes"
        )
        configs = java_probe.json(version, "describe-configs", *bootstrap, "--topic", topic)
        assert configs["configs"]["max.message.bytes"]["source"] == "DEFAULT_CONFIG"
        assert configs["configs"]["segment.bytes"]["value"] == "1048576"

        failures = {
            "append to a non-list": ("--topic", topic, "--append", "retention.ms=5"),
            "broker config": ("--broker", "0", "--set", "log.segment.bytes=1048576"),
        }
        for what, args in failures.items():
            result = java_probe(version, "alter-configs", *bootstrap, *args)
            assert result.returncode == 1, what
            error = json.loads(result.stderr.splitlines()[0])
            assert (
                error["error"].rsplit(".", 1)[1]
                == {
                    "append to a non-list": "InvalidConfigurationException",
                    "broker config": "PolicyViolationException",
                }[what]
            )

        broker_configs = java_probe.json(version, "describe-configs", *bootstrap, "--broker", "0")
        segment = broker_configs["configs"]["log.segment.bytes"]
        assert (segment["value"], segment["readOnly"]) == ("4194304", True)

        created = java_probe.json(
            version,
            "create-partitions",
            *bootstrap,
            "--topic",
            topic,
            "--count",
            "3",
            "--assignments",
            "0;0",
        )
        assert created == {"created": {"topic": topic, "count": 3}}
        wrong = java_probe(
            version,
            "create-partitions",
            *bootstrap,
            "--topic",
            topic,
            "--count",
            "4",
            "--assignments",
            "1",
        )
        assert "InvalidReplicaAssignmentException" in wrong.stderr
        same = java_probe(
            version, "create-partitions", *bootstrap, "--topic", topic, "--count", "3"
        )
        assert "InvalidPartitionsException" in same.stderr
        cluster = java_probe.json(version, "describe-cluster", *bootstrap)
        assert cluster["controller"]["id"] == 0
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=20)
    assert {name: len(t.partitions) for name, t in metadata.topics.items()} == {
        "java-3.9": 3,
        "java-4": 3,
    }


def committed_entries(broker: Any, topic: str, partition: int) -> list[records.SegmentRecord]:
    """The partition's log entries (spec segments and chunks) as the metadata store lists them."""
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        prefix = Keys(config.s3_namespace).segments(topic, partition)
        return [records.decode_segment(kv.value) for kv in store.get_prefix(prefix)]
    finally:
        store.close()


def test_a_topics_segment_bytes_sizes_its_segments(start_broker: Callable[..., Any]) -> None:
    """segment.bytes set on a topic takes effect in the compactor: with a broker-wide segment size
    of 64 MiB and chunks compacted for their age only after an hour (the default), only the
    topic's 1 MiB can make (and so commit) a spec segment within the test."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    broker = start_broker(env={"KAFSCALE_SEGMENT_BYTES": "64MiB"})
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("sealed", 1, 1)])["sealed"].result(30)
    resource = ConfigResource(
        ResourceType.TOPIC,
        "sealed",
        incremental_configs=[
            ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    assert error_name(admin.incremental_alter_configs([resource])[resource]) is None
    # One record per chunk (acks=all, each acknowledged before the next is sent): a segment takes
    # the partition's oldest chunks while they fit in segment.bytes, so it ends within one
    # record of 1 MiB (with librdkafka's batching a chunk could hold up to segment.bytes).
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for _ in range(40):  # ~2 MiB that does not compress
        producer.produce("sealed", os.urandom(50_000), partition=0)
        assert producer.flush(30) == 0
    deadline = time.monotonic() + 30
    while not (segments := [e for e in committed_entries(broker, "sealed", 0) if not e.is_chunk]):
        assert time.monotonic() < deadline, "no segment was sealed by size"
        time.sleep(0.2)
    first = segments[0]
    assert first.base_offset == 0
    # about segment.bytes (the .kfs adds a 32-byte header and a 16-byte footer), far below 64 MiB
    assert 1024 * 1024 - 60_000 < first.size <= 1024 * 1024 + 48


def test_sasl_handshake_is_refused_and_the_connection_stays_open(
    start_broker: Callable[..., Any], kcat: str
) -> None:
    from kio.index import load_request_schema, load_response_schema

    from kafscale.protocol import codec

    broker = start_broker()
    broker.wait_ready()
    with Wire(("127.0.0.1", broker.port)) as wire:
        wire.send(codec.build(load_request_schema(17, 1), mechanism="PLAIN"), correlation_id=7)
        correlation_id, response = wire.read_response(load_response_schema(17, 1))
        assert correlation_id == 7
        assert response.error_code == ErrorCode.unsupported_sasl_mechanism
        assert response.mechanisms == ()
        metadata = codec.build(
            load_request_schema(3, 12),
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        wire.send(metadata, correlation_id=8)
        correlation_id, _ = wire.read_response(load_response_schema(3, 12))
        assert correlation_id == 8

    # A client configured for SASL says why it cannot connect.
    result = subprocess.run(
        [
            kcat,
            "-L",
            "-b",
            broker.bootstrap,
            "-m",
            "3",
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            "sasl.username=user",
            "-X",
            "sasl.password=secret",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Unsupported SASL mechanism" in result.stderr
