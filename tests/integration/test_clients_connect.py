"""Real Kafka clients connect to a real broker and fetch its metadata, on both backend sets."""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec

from .test_fetch import produce_sequentially
from .wire import Wire

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "real"])
def running_broker(request: pytest.FixtureRequest, start_broker: Callable[..., Any]) -> Any:
    broker = start_broker(backends=request.param)
    broker.wait_ready()
    return broker


@pytest.mark.compat("admin", "kcat")
def test_kcat_lists_the_broker(running_broker: Any, kcat: str) -> None:
    result = subprocess.run(
        [kcat, "-L", "-J", "-b", running_broker.bootstrap, "-m", "15"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listing = json.loads(result.stdout)
    assert [(b["id"], b["name"]) for b in listing["brokers"]] == [
        (0, f"127.0.0.1:{running_broker.port}")
    ]
    assert listing["topics"] == []


@pytest.mark.compat("admin", param="client_version", prefix="java-")
@pytest.mark.java
@pytest.mark.parametrize("client_version", ["3.9", "4"])
def test_java_admin_describe_cluster(
    running_broker: Any, java_probe: Callable[..., Any], client_version: str
) -> None:
    result = java_probe(client_version, "describe-cluster", "--bootstrap", running_broker.bootstrap)
    assert result.returncode == 0, result.stderr
    cluster = json.loads(result.stdout)
    assert len(cluster["clusterId"]) == 22
    assert cluster["controller"]["id"] == 0
    assert [(n["id"], n["host"], n["port"]) for n in cluster["nodes"]] == [
        (0, "127.0.0.1", running_broker.port)
    ]


@pytest.mark.compat("admin", "confluent-kafka")
def test_confluent_kafka_lists_topics(running_broker: Any) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": running_broker.bootstrap})
    metadata = admin.list_topics(timeout=20)
    assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {
        0: ("127.0.0.1", running_broker.port)
    }
    assert metadata.controller_id == 0
    assert len(metadata.cluster_id) == 22


@pytest.mark.compat("admin", "aiokafka")
def test_aiokafka_fetches_metadata(running_broker: Any) -> None:
    from aiokafka import AIOKafkaClient

    async def fetch() -> Any:
        client = AIOKafkaClient(bootstrap_servers=running_broker.bootstrap)
        await client.bootstrap()
        try:
            await client.force_metadata_update()
            return client.cluster
        finally:
            await client.close()

    cluster = asyncio.run(fetch())
    assert [(b.nodeId, b.host, b.port) for b in cluster.brokers()] == [
        (0, "127.0.0.1", running_broker.port)
    ]
    assert cluster.controller is not None and cluster.controller.nodeId == 0


@pytest.mark.compat("admin", "kafka-python")
def test_kafka_python_describes_the_cluster(running_broker: Any) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=running_broker.bootstrap, request_timeout_ms=20000)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [
        (0, "127.0.0.1", running_broker.port)
    ]
    assert cluster["controller_id"] == 0


def test_kafka_python_takes_the_broker_for_kafka_4_and_list_offsets_v10_works(
    start_broker: Callable[..., Any],
) -> None:
    # kafka-python infers the broker's release from ApiVersions; for 4.0 it looks for ListOffsets
    # v10 (KIP-1075). Taken for a 3.9 broker, it expects Kafka 3's answers (e.g. DescribeConfigs).
    from kafka import KafkaConsumer

    running_broker = start_broker()
    running_broker.wait_ready()
    consumer = KafkaConsumer(bootstrap_servers=running_broker.bootstrap, api_version=None)
    try:
        assert consumer.config["api_version"] == (4, 0)
    finally:
        consumer.close()

    # v10 adds only TimeoutMs (a bound on remote-storage lookups) to the request.
    produce_sequentially(running_broker.bootstrap, "offsets-v10", [b"a", b"b", b"c"], acks=-1)
    schema = load_request_schema(2, 10)

    def list_offset(wire: Wire, timestamp: int) -> tuple[int, int]:
        partition = codec.build(
            codec.nested(schema, "ListOffsetsPartition"),
            partition_index=0,
            current_leader_epoch=-1,
            timestamp=timestamp,
        )
        topic = codec.build(
            codec.nested(schema, "ListOffsetsTopic"), name="offsets-v10", partitions=(partition,)
        )
        request = codec.build(
            schema,
            replica_id=-1,
            isolation_level=0,
            timeout=datetime.timedelta(seconds=5),
            topics=(topic,),
        )
        wire.send(request, correlation_id=7)
        correlation_id, response = wire.read_response(load_response_schema(2, 10))
        assert correlation_id == 7
        [answer] = response.topics[0].partitions
        return int(answer.error_code), int(answer.offset)

    with Wire(("127.0.0.1", running_broker.port)) as wire:
        assert list_offset(wire, -1) == (0, 3)  # latest
        assert list_offset(wire, -2) == (0, 0)  # earliest
