"""Consumer groups on three brokers (docs/design/scale-out.md, section 7): each group has one
coordinator, the owner of its __consumer_offsets partition; every broker names the same one in
FindCoordinator, the others answer its requests NOT_COORDINATOR and list only their own groups;
and a group whose coordinator hands its partitions over (SIGTERM) carries on at its committed
offsets on the new coordinator."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from tests.harness.cluster import bootstrap, start_cluster

from .wire import Wire

pytestmark = pytest.mark.integration

TOPIC = "grouped"
GROUPS_ENV = {
    "KAFSCALE_OFFSETS_TOPIC_PARTITIONS": "6",
    "KAFSCALE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
}


def ask(broker: Any, api_key: int, version: int, **fields: Any) -> Any:
    request = codec.build(load_request_schema(api_key, version), **fields)
    with Wire(("127.0.0.1", broker.port)) as wire:
        wire.send(request)
        return wire.read_response(load_response_schema(api_key, version))[1]


def coordinator_seen_by(broker: Any, group: str, timeout: float = 60) -> int:
    """The node id ``broker`` names as the group's coordinator, once it names one."""
    deadline = time.monotonic() + timeout
    while True:
        found = ask(broker, 10, 3, key=group, key_type=0)
        if found.error_code == ErrorCode.none:
            return int(found.node_id)
        assert found.error_code == ErrorCode.coordinator_not_available, found
        assert time.monotonic() < deadline, f"no coordinator for {group}"
        time.sleep(0.2)


def offsets_leaders(broker: Any) -> dict[int, int]:
    """__consumer_offsets' partition -> owner from etcd, and -1 -> its partition count."""
    from kafscale.metadata import records
    from kafscale.metadata.etcd import EtcdMetadataStore
    from kafscale.metadata.records import Keys

    store = EtcdMetadataStore(list(broker.env["KAFSCALE_ETCD_ENDPOINTS"].split(",")))
    try:
        keys = Keys(broker.env["KAFSCALE_S3_NAMESPACE"])
        out = {}
        for kv in store.get_prefix(keys.topic_leaders("__consumer_offsets")):
            parsed = keys.parse_leader(kv.key)
            if parsed is not None:
                out[parsed[1]] = records.decode_leader(kv.value).owner
        topic = store.get(keys.topic("__consumer_offsets"))
        out[-1] = records.decode_topic(topic.value).partitions if topic else -1
        return out
    finally:
        store.close()


def offset_fetch_error(broker: Any, group: str) -> int:
    return int(ask(broker, 9, 5, group_id=group, topics=None).error_code)


def listed_by(broker: Any) -> set[str]:
    answer = ask(broker, 16, 4, states_filter=())
    assert answer.error_code == ErrorCode.none
    return {g.group_id for g in answer.groups}


def produce(brokers: list[Any], values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all"})
    for i, data in enumerate(values):
        producer.produce(TOPIC, data, partition=i % 3)
    assert producer.flush(60) == 0


def consume(brokers: list[Any], group: str, count: int, commit: bool) -> list[bytes]:
    """Read ``count`` records as a member of ``group`` (committing them if ``commit``)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([TOPIC])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 90
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count}"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        if commit:
            consumer.commit(asynchronous=False)
        extra = consumer.poll(2)  # nothing beyond what was produced
        assert extra is None or extra.error() is not None
    finally:
        consumer.close()
    return got


def test_every_group_has_one_coordinator_that_every_broker_names(
    start_broker: Callable[..., Any],
) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    brokers = start_cluster(start_broker, 3, GROUPS_ENV)
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(timeout=60)
    groups = [f"app-{i}" for i in range(12)]
    coordinators = {}
    for group in groups:
        seen = {coordinator_seen_by(broker, group) for broker in brokers}
        assert len(seen) == 1, f"{group}: brokers disagree: {seen} {offsets_leaders(brokers[0])}"
        coordinators[group] = seen.pop()
    assert len(set(coordinators.values())) >= 2, coordinators  # 6 partitions over 3 brokers
    for group in groups:  # a simple consumer's commit (generation -1) makes the group
        offsets = [TopicPartition(TOPIC, 0, 1)]
        request = ConsumerGroupTopicPartitions(group, offsets)
        admin.alter_consumer_group_offsets([request])[group].result(timeout=30)
    by_id = {int(b.env["KAFSCALE_BROKER_ID"]): b for b in brokers}
    for group, node in coordinators.items():
        for node_id, broker in by_id.items():
            expected = ErrorCode.none if node_id == node else ErrorCode.not_coordinator
            assert offset_fetch_error(broker, group) == expected, (group, node_id)
    for node_id, broker in by_id.items():
        assert listed_by(broker) == {g for g, n in coordinators.items() if n == node_id}


def test_a_group_carries_on_when_its_coordinator_hands_over(
    start_broker: Callable[..., Any],
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    brokers = start_cluster(start_broker, 3, GROUPS_ENV)
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(timeout=60)
    produce(brokers, [b"first-%d" % i for i in range(30)])
    assert sorted(consume(brokers, "moving", 30, commit=True)) == sorted(
        b"first-%d" % i for i in range(30)
    )
    by_id = {int(b.env["KAFSCALE_BROKER_ID"]): b for b in brokers}
    old = coordinator_seen_by(brokers[0], "moving")
    assert by_id[old].terminate() == 0  # hands every partition over, __consumer_offsets' too
    survivors = [b for node, b in by_id.items() if node != old]
    deadline = time.monotonic() + 60
    while (new := coordinator_seen_by(survivors[0], "moving")) == old:
        assert time.monotonic() < deadline, "the group's partition was not taken over"
        time.sleep(0.2)
    assert new in {int(b.env["KAFSCALE_BROKER_ID"]) for b in survivors}
    produce(survivors, [b"second-%d" % i for i in range(9)])
    # the new coordinator loaded the committed offsets: only the new records are read
    assert sorted(consume(survivors, "moving", 9, commit=True)) == sorted(
        b"second-%d" % i for i in range(9)
    )
