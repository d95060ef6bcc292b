"""Consumer groups of every common client: members split a topic's partitions, a crashed member's
partitions move to the others within the session timeout, nothing produced is lost, and what the
members processed is committed when they leave; a static
member that restarts gets its partitions back without a rebalance; Kafka's own admin tools
describe the group (members, assignments, offsets, lag)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.groups import all_records, wait_for_assignment

from .test_groups import FAST_GROUPS, create_topic, produce

pytestmark = pytest.mark.integration

SESSION = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
PARTITIONS = 6
# the session timeout, a rebalance, and CI slack
FAILOVER_S = 60


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    wanted = [TopicPartition(topic, p) for p in range(partitions)]
    request = [ConsumerGroupTopicPartitions(group, wanted)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_group_offsets(request)[group].result(30)
    return [tp.offset for tp in sorted(listed.topic_partitions, key=lambda tp: tp.partition)]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets"})
    try:
        marks = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), 30) for p in range(partitions)
        ]
        return [high for _, high in marks]
    finally:
        consumer.close()


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


@pytest.mark.compat("group", param="client")
@pytest.mark.parametrize(
    ("client", "assignor"),
    [
        pytest.param("aiokafka", "range", id="aiokafka-range"),
        pytest.param("java-3.9", "cooperative-sticky", id="java-3.9", marks=pytest.mark.java),
        pytest.param("java-4", "cooperative-sticky", id="java-4", marks=pytest.mark.java),
        pytest.param("confluent-kafka", "cooperative-sticky", id="confluent-kafka"),
        pytest.param("kafka-python", "roundrobin", id="kafka-python"),
        pytest.param("kcat", "range", id="kcat-range"),
        pytest.param("franz-go", "cooperative-sticky", id="franz-go"),
        pytest.param("kafkajs", "roundrobin", id="kafkajs"),
    ],
)
def test_members_split_partitions_and_take_over_a_crashed_members_share(
    start_broker: Callable[..., Any], group_consumers: Any, client: str, assignor: str
) -> None:
    # Kafka's default initial rebalance delay (3 s), not 0: with 0 a member starting alone forms
    # generation 1 at once, before its client has the topic's metadata, and kafka-python 3.0's
    # leader then sometimes never sends SyncGroup for the next generation (NOTES.md).
    broker = start_broker()
    broker.wait_ready()
    topic, group = "work", f"workers-{client}"
    produced = values("before", 300)
    asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
    asyncio.run(produce(broker.bootstrap, topic, produced, PARTITIONS))
    members = [
        group_consumers.start(
            client,
            broker.bootstrap,
            [topic],
            group,
            timeout=180,
            assignor=assignor,
            auto_offset_reset="earliest",
            configs=SESSION,
        )
        for _ in range(3)
    ]
    everything = {(topic, p) for p in range(PARTITIONS)}
    shares = wait_for_assignment(members, everything, timeout=FAILOVER_S)
    assert all(len(share) == 2 for share in shares), shares
    more = values("during", 300)
    asyncio.run(produce(broker.bootstrap, topic, more, PARTITIONS))
    produced += more

    def seen() -> set[bytes]:
        return {(r.value or "").encode() for r in all_records(members)}

    members[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    victim = members[2]
    victim.kill()  # SIGKILL: no LeaveGroup, its partitions wait out its session
    started = time.monotonic()
    survivors = members[:2]
    wait_for_assignment(survivors, everything, timeout=FAILOVER_S)
    moved_after = time.monotonic() - started
    after = values("after", 300)
    asyncio.run(produce(broker.bootstrap, topic, after, PARTITIONS))
    produced += after
    survivors[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    for member in survivors:
        assert member.terminate() == 0, member.report()
    assert set(produced) <= seen()  # at least once: nothing lost
    # what the survivors processed, they committed before they left: the group is at the end
    assert committed_offsets(broker.bootstrap, group, topic, PARTITIONS) == end_offsets(
        broker.bootstrap, topic, PARTITIONS
    )
    # the crash moved the partitions within the session timeout plus a rebalance
    assert moved_after < FAILOVER_S


@pytest.mark.compat("group", "java-4")
@pytest.mark.java
def test_a_static_member_that_restarts_gets_its_partitions_back_without_a_rebalance(
    start_broker: Callable[..., Any], group_consumers: Any
) -> None:
    broker = start_broker(env=FAST_GROUPS)
    broker.wait_ready()
    topic, group = "static", "statics"
    asyncio.run(create_topic(broker.bootstrap, topic, 4))
    configs = {"session.timeout.ms": 30_000, "heartbeat.interval.ms": 1000}

    def member(instance: str) -> Any:
        return group_consumers.start(
            "java-4",
            broker.bootstrap,
            [topic],
            group,
            timeout=180,
            assignor="range",
            instance_id=instance,
            configs=configs,
        )

    a, b = member("static-a"), member("static-b")
    everything = {(topic, p) for p in range(4)}
    before_a, before_b = wait_for_assignment([a, b], everything, timeout=FAILOVER_S)
    events_of_a = len(a.events)
    b.kill()  # within its 30 s session, a new process with the same instance id replaces it
    again = member("static-b")
    again.wait_for(lambda c: c.assignment or None, FAILOVER_S, "the old assignment")
    assert again.assignment == before_b
    asyncio.run(produce(broker.bootstrap, topic, values("x", 40), 4))
    a.wait_for(lambda c: len(c.records) >= 20 or None, 60, "a's records")
    rebalanced = [e.kind for e in a.events[events_of_a:] if e.kind in ("assigned", "revoked")]
    assert rebalanced == [], f"the other member saw a rebalance: {rebalanced}"
    assert a.assignment == before_a


@pytest.mark.compat("admin", "java-4")
def test_kafka_tools_describe_groups_topics_and_configs(
    start_broker: Callable[..., Any], group_consumers: Any, kafka_tools: Any
) -> None:
    broker = start_broker(env=FAST_GROUPS)
    broker.wait_ready()
    server = ["--bootstrap-server", broker.bootstrap]
    kafka_tools.check("topics", *server, "--create", "--topic", "tools", "--partitions", "2")
    asyncio.run(produce(broker.bootstrap, "tools", values("t", 50), 2))
    member = group_consumers.start(
        "java-4",
        broker.bootstrap,
        ["tools"],
        "toolgroup",
        timeout=120,
        auto_offset_reset="earliest",
    )
    member.wait_for(lambda c: (len(c.records) >= 30 and c.committed) or None, 60, "commits")
    described = kafka_tools.check("consumer-groups", *server, "--describe", "--group", "toolgroup")
    rows = [line.split() for line in described.splitlines() if line.startswith("toolgroup")]
    assert {row[1] for row in rows} == {"tools"}, described
    committed = {int(row[2]): (int(row[3]), int(row[4]), int(row[5])) for row in rows}
    assert sum(current for current, _, _ in committed.values()) >= 30
    for current, end, lag in committed.values():  # CURRENT-OFFSET, LOG-END-OFFSET, LAG
        assert end == 25 and lag == end - current
    members = kafka_tools.check(
        "consumer-groups", *server, "--describe", "--group", "toolgroup", "--members"
    )
    assert re.search(r"toolgroup\s+\S+\s+/127.0.0.1\s+\S+\s+2\b", members), members
    assert member.terminate() == 0
    topic = kafka_tools.check("topics", *server, "--describe", "--topic", "tools")
    assert "PartitionCount: 2" in topic, topic
    kafka_tools.check(
        "configs",
        *server,
        "--alter",
        "--entity-type",
        "topics",
        "--entity-name",
        "tools",
        "--add-config",
        "retention.ms=3600000",
    )
    configs = kafka_tools.check(
        "configs", *server, "--describe", "--entity-type", "topics", "--entity-name", "tools"
    )
    assert "retention.ms=3600000" in configs, configs
    kafka_tools.check("topics", *server, "--alter", "--topic", "tools", "--partitions", "3")
    assert "PartitionCount: 3" in kafka_tools.check(
        "topics", *server, "--describe", "--topic", "tools"
    )
