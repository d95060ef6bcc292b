"""Consumer groups against real processes: offset reset for groups without commits, admin views
of groups, and groups that survive a SIGKILLed coordinator and a SIGKILLed broker."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from .test_supervision import roles, wait_for

pytestmark = pytest.mark.integration

FAST_GROUPS = {"KAFSCALE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}


async def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, partition=i % partitions)
            for i, value in enumerate(values)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


def consumer(bootstrap: str, group: str, topic: str, **settings: Any) -> Any:
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        **settings,
    )


async def drain(consumers: list[Any], want: set[bytes], got: list[bytes], timeout: float) -> None:
    """Poll every consumer, committing after each batch, until ``want`` was all seen."""
    deadline = time.monotonic() + timeout
    while not want <= set(got):
        assert time.monotonic() < deadline, f"missing {len(want - set(got))} records"
        for each in consumers:
            batch = await each.getmany(timeout_ms=200)
            for records in batch.values():
                got.extend(r.value for r in records)
            if batch:
                await each.commit()


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_group_without_commits_starts_where_auto_offset_reset_says(
    start_broker: Callable[..., Any], reset: str
) -> None:
    broker = start_broker(env=FAST_GROUPS)
    broker.wait_ready()

    async def run() -> list[bytes]:
        await create_topic(broker.bootstrap, "reset", 1)
        await produce(broker.bootstrap, "reset", [b"old-%d" % i for i in range(5)], 1)
        member = consumer(broker.bootstrap, f"g-{reset}", "reset", auto_offset_reset=reset)
        await member.start()
        try:
            while not member.assignment():
                await member.getmany(timeout_ms=200)
            await member.seek_to_committed()
            await produce(broker.bootstrap, "reset", [b"new"], 1)
            got: list[bytes] = []
            await drain([member], {b"new"}, got, 30)
            return got
        finally:
            await member.stop()

    got = asyncio.run(run())
    expected = [b"old-%d" % i for i in range(5)] + [b"new"] if reset == "earliest" else [b"new"]
    assert got == expected


def test_groups_survive_a_killed_coordinator_and_a_killed_broker(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(backends="real", env=FAST_GROUPS)
    broker.wait_ready()
    topic, group = "durable", "survivors"
    first = [b"a-%d" % i for i in range(300)]
    second = [b"b-%d" % i for i in range(300)]

    async def before_broker_kill() -> list[bytes]:
        await create_topic(broker.bootstrap, topic, 4)
        await produce(broker.bootstrap, topic, first, 4)
        members = [
            consumer(broker.bootstrap, group, topic, auto_offset_reset="earliest") for _ in range(2)
        ]
        for member in members:
            await member.start()
        got: list[bytes] = []
        try:
            await drain(members, set(first), got, 60)
            coordinator = roles(broker)["coordinator-0"]
            os.kill(coordinator, signal.SIGKILL)
            wait_for(
                lambda: roles(broker).get("coordinator-0") not in (None, coordinator),
                30,
                "a new coordinator",
            )
            await produce(broker.bootstrap, topic, second, 4)
            await drain(members, set(second), got, 90)
        finally:
            for member in members:
                await member.stop()
        return got

    got = asyncio.run(before_broker_kill())
    assert set(got) == set(first) | set(second)
    assert len(got) == len(set(got))  # everything committed as consumed: no redelivery needed
    third = [b"c-%d" % i for i in range(100)]
    asyncio.run(produce(broker.bootstrap, topic, third, 4))
    broker.kill()
    broker = start_broker(env=broker.env)
    broker.wait_ready()

    async def after_restart() -> list[bytes]:
        member = consumer(broker.bootstrap, group, topic, auto_offset_reset="earliest")
        await member.start()
        resumed: list[bytes] = []
        try:
            await drain([member], set(third), resumed, 60)
        finally:
            await member.stop()
        return resumed

    resumed = asyncio.run(after_restart())
    assert set(resumed) == set(third)  # from the committed offsets: nothing earlier again


def test_admin_clients_see_groups_offsets_and_lag(start_broker: Callable[..., Any]) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
    from confluent_kafka.admin import AdminClient

    broker = start_broker(env=FAST_GROUPS)
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    async def consume_and_inspect() -> None:
        await create_topic(broker.bootstrap, "seen", 2)
        await produce(broker.bootstrap, "seen", [b"%d" % i for i in range(40)], 2)
        member = consumer(broker.bootstrap, "watched", "seen", auto_offset_reset="earliest")
        await member.start()
        try:
            await drain([member], {b"%d" % i for i in range(40)}, [], 30)
            listed = admin.list_consumer_groups().result(20)
            [found] = [g for g in listed.valid if g.group_id == "watched"]
            assert str(found.state).endswith("STABLE")
            described = admin.describe_consumer_groups(["watched"])["watched"].result(20)
            assert str(described.state).endswith("STABLE")
            assert described.partition_assignor == "roundrobin" or described.partition_assignor
            [only] = described.members
            assert {tp.partition for tp in only.assignment.topic_partitions} == {0, 1}
            request = [ConsumerGroupTopicPartitions("watched")]
            offsets = admin.list_consumer_group_offsets(request)["watched"].result(20)
            assert {(tp.partition, tp.offset) for tp in offsets.topic_partitions} == {
                (0, 20),
                (1, 20),
            }
            deadline = time.monotonic() + 15
            while 'kafscale_consumer_lag{group="watched"' not in broker.metrics_text():
                assert time.monotonic() < deadline, "no consumer lag metric"
                await asyncio.sleep(0.5)
            with pytest.raises(KafkaException, match=r"NON_EMPTY_GROUP|not empty"):
                admin.delete_consumer_groups(["watched"])["watched"].result(20)
        finally:
            await member.stop()

    asyncio.run(consume_and_inspect())
    admin.delete_consumer_groups(["watched"])["watched"].result(20)
    listed = admin.list_consumer_groups().result(20)
    assert "watched" not in {g.group_id for g in listed.valid}
    # one sample per type and state, a zero too (prometheus-client sorts the labels)
    assert 'kafscale_groups{state="Stable",type="classic"}' in broker.metrics_text()


def test_a_group_lookup_shows_consumer_offsets_which_regex_consumers_leave_out(
    start_broker: Callable[..., Any],
) -> None:
    """As on Kafka, the first FindCoordinator creates the internal topic __consumer_offsets
    (franz-go's TestConsumeRegex waits for it); clients list it as internal and a regex
    subscription matching every topic reads nothing from it. librdkafka matches internal topics
    too (as on Kafka: librdkafka issue 3458), so its member is assigned the topic's partitions
    (each names a group coordinator), which hold no records here."""
    from aiokafka import AIOKafkaClient
    from confluent_kafka import Consumer

    broker = start_broker(env=FAST_GROUPS)
    broker.wait_ready()
    asyncio.run(create_topic(broker.bootstrap, "events", 1))
    asyncio.run(produce(broker.bootstrap, "events", [b"one"], 1))
    member = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "everything",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    member.subscribe(["^.*"])
    try:
        got: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + 30
        while not got:
            assert time.monotonic() < deadline, "nothing consumed"
            message = member.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.topic(), message.value()))
        assert got == [("events", b"one")]
        assert {p.topic for p in member.assignment()} <= {"events", "__consumer_offsets"}
        assert member.poll(2) is None  # nothing else to read
    finally:
        member.close()

    async def internal_topics() -> tuple[set[str], set[str]]:
        client = AIOKafkaClient(bootstrap_servers=broker.bootstrap)
        await client.bootstrap()
        try:
            cluster = await client.fetch_all_metadata()
            return cluster.topics(exclude_internal_topics=False), cluster.internal_topics
        finally:
            await client.close()

    assert asyncio.run(internal_topics()) == (
        {"events", "__consumer_offsets"},
        {"__consumer_offsets"},
    )
