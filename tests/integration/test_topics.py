"""Topics created, listed, deleted and re-created by real clients, on both backend sets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "real"])
def running_broker(request: pytest.FixtureRequest, start_broker: Callable[..., Any]) -> Any:
    broker = start_broker(backends=request.param)
    broker.wait_ready()
    return broker


def confluent_create(bootstrap: str, *topics: Any) -> dict[str, str | None]:
    """{name: None if created else the error's name}."""
    from confluent_kafka.admin import AdminClient

    outcome: dict[str, str | None] = {}
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    for name, future in admin.create_topics(list(topics), request_timeout=20).items():
        try:
            future.result(30)
            outcome[name] = None
        except Exception as exc:
            outcome[name] = exc.args[0].name()
    return outcome


def partitions(bootstrap: str) -> dict[str, int]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


@pytest.mark.compat("create", "confluent-kafka")
def test_confluent_kafka_creates_and_deletes_topics(running_broker: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = running_broker.bootstrap
    assert confluent_create(
        bootstrap,
        NewTopic("orders", 6, 1, config={"max.message.bytes": "65536"}),
        NewTopic("logs", 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
        NewTopic("bad name", 1, 1),
        NewTopic("zero", 0, 1),
        NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"}),
    ) == {
        "orders": None,
        "logs": None,
        "bad name": "TOPIC_EXCEPTION",
        "zero": "INVALID_PARTITIONS",
        "compacted": None,
    }
    assert confluent_create(bootstrap, NewTopic("orders", 1, 1)) == {
        "orders": "TOPIC_ALREADY_EXISTS"
    }
    assert partitions(bootstrap) == {"orders": 6, "logs": 1, "compacted": 1}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics(["orders"], request_timeout=20)["orders"].result(30)
    with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PART"):
        admin.delete_topics(["orders"], request_timeout=20)["orders"].result(30)
    assert partitions(bootstrap) == {"logs": 1, "compacted": 1}


@pytest.mark.compat("create", param="client_version", prefix="java-")
@pytest.mark.java
@pytest.mark.parametrize("client_version", ["3.9", "4"])
def test_java_admin_creates_and_deletes_topics(
    running_broker: Any, java_probe: Callable[..., Any], client_version: str
) -> None:
    bootstrap = ["--bootstrap", running_broker.bootstrap]
    result = java_probe(
        client_version,
        "create-topic",
        *bootstrap,
        "--topic",
        "events",
        "--partitions",
        "3",
        "--topic-config",
        "retention.ms=3600000",
    )
    assert result.returncode == 0, result.stderr
    created = json.loads(result.stdout)["created"]
    assert created["partitions"] == 3 and created["replicationFactor"] == 1
    assert created["configs"]["retention.ms"] == "3600000"
    assert created["configs"]["cleanup.policy"] == "delete"
    listed = json.loads(java_probe(client_version, "list-topics", *bootstrap).stdout)
    assert listed["topics"] == [
        {"name": "events", "topicId": created["topicId"], "internal": False}
    ]
    again = java_probe(client_version, "create-topic", *bootstrap, "--topic", "events")
    assert again.returncode != 0 and "TopicExistsException" in again.stderr
    deleted = java_probe(client_version, "delete-topic", *bootstrap, "--topic", "events")
    assert deleted.returncode == 0, deleted.stderr
    recreated = json.loads(
        java_probe(client_version, "create-topic", *bootstrap, "--topic", "events").stdout
    )["created"]
    assert recreated["topicId"] != created["topicId"] and recreated["partitions"] == 1


@pytest.mark.compat("create", "aiokafka", "kafka-python")
def test_aiokafka_and_kafka_python_create_topics(running_broker: Any) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioNewTopic
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    async def aiokafka_create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=running_broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic("from-aiokafka", 2, 1)])
        finally:
            await admin.close()

    asyncio.run(aiokafka_create())
    admin = KafkaAdminClient(bootstrap_servers=running_broker.bootstrap)
    try:
        admin.create_topics([KpNewTopic("from-kafka-python", 3, 1)])
        admin.delete_topics(["from-aiokafka"])
    finally:
        admin.close()
    assert partitions(running_broker.bootstrap) == {"from-kafka-python": 3}


@pytest.mark.compat("create", "confluent-kafka")
def test_metadata_auto_creates_topics(start_broker: Callable[..., Any]) -> None:
    from kafka import KafkaConsumer

    broker = start_broker(env={"KAFSCALE_AUTO_CREATE_PARTITIONS": "4"})
    broker.wait_ready()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert not consumer.partitions_for_topic("wanted")  # consumers do not create
    finally:
        consumer.close()
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.list_topics("made-by-metadata", timeout=20)  # librdkafka allows creation here
    assert partitions(broker.bootstrap) == {"made-by-metadata": 4}


def test_deleting_a_topic_removes_its_objects(
    start_broker: Callable[..., Any], s3_server: Any
) -> None:
    import boto3
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(backends="real")
    broker.wait_ready()
    bucket, namespace = broker.env["KAFSCALE_S3_BUCKET"], broker.env["KAFSCALE_S3_NAMESPACE"]
    assert confluent_create(broker.bootstrap, NewTopic("t", 1, 1)) == {"t": None}
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
    )
    for key in (
        f"{namespace}/t/0/segment-00000000000000000000.kfs",
        f"{namespace}/t/0/segment-00000000000000000000.index",
        f"{namespace}/tt/0/segment-00000000000000000000.kfs",
    ):
        s3.put_object(Bucket=bucket, Key=key, Body=b"segment bytes")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["t"], request_timeout=30)["t"].result(40)
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert left == [f"{namespace}/tt/0/segment-00000000000000000000.kfs"]
