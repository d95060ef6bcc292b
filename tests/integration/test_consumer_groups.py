"""Consumer groups of the KIP-848 protocol (`group.protocol=consumer`) on etcd + MinIO: the
coordinator assigns (uniform or range), members split a topic's partitions, a SIGKILLed member's
partitions move after the group's session timeout, members that stop commit and leave, a static
member restarted within its session gets its partitions back without a new group epoch, Kafka's
tools describe and list the group, and an empty classic group's id (and offsets) is taken over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.groups import all_records, wait_for_assignment

from .test_group_clients import committed_offsets, end_offsets, values
from .test_groups import create_topic, produce

pytestmark = pytest.mark.integration

PARTITIONS = 6
# Kafka's consumer-group session (45 s) and heartbeat (5 s) are broker settings here, as
# group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms are in Kafka.
FAST_CONSUMER_GROUPS = {
    "KAFSCALE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
    "KAFSCALE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "1000",
}
FAILOVER_S = 60


def consumer_protocol(assignor: str) -> dict[str, str]:
    return {"group.protocol": "consumer", "group.remote.assignor": assignor}


def describe(bootstrap: str, group: str) -> Any:
    """The group as confluent-kafka's admin client describes it (ConsumerGroupDescribe)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(30)


@pytest.mark.compat("kip848", param="client")
@pytest.mark.parametrize(
    ("client", "assignor"),
    [
        pytest.param("java-4", "uniform", id="java-4-uniform", marks=pytest.mark.java),
        pytest.param("confluent-kafka", "range", id="confluent-kafka-range"),
    ],
)
def test_members_split_partitions_and_take_over_a_killed_members_share(
    start_broker: Callable[..., Any], group_consumers: Any, client: str, assignor: str
) -> None:
    broker = start_broker(env=FAST_CONSUMER_GROUPS, backends="real")
    broker.wait_ready()
    topic, group = "work848", f"kip848-{client}"
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
            auto_offset_reset="earliest",
            configs=consumer_protocol(assignor),
        )
        for _ in range(3)
    ]
    everything = {(topic, p) for p in range(PARTITIONS)}
    shares = wait_for_assignment(members, everything, timeout=FAILOVER_S)
    assert all(len(share) == 2 for share in shares), shares
    described = describe(broker.bootstrap, group)
    assert str(described.type).endswith("CONSUMER"), described
    assert described.partition_assignor == assignor
    assert len(described.members) == 3

    def seen() -> set[bytes]:
        return {(r.value or "").encode() for r in all_records(members)}

    members[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    members[2].kill()  # no leave: its partitions wait out the group's session timeout
    survivors = members[:2]
    wait_for_assignment(survivors, everything, timeout=FAILOVER_S)
    after = values("after", 300)
    asyncio.run(produce(broker.bootstrap, topic, after, PARTITIONS))
    produced += after
    survivors[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    survivors[0].terminate()  # leaves (epoch -1): the last member takes everything at once
    wait_for_assignment(survivors[1:], everything, timeout=FAILOVER_S)
    assert survivors[1].terminate() == 0, survivors[1].report()
    assert set(produced) <= seen()  # at least once: nothing lost
    assert committed_offsets(broker.bootstrap, group, topic, PARTITIONS) == end_offsets(
        broker.bootstrap, topic, PARTITIONS
    )
    assert str(describe(broker.bootstrap, group).state).endswith("EMPTY")


@pytest.mark.compat("kip848", "java-4")
@pytest.mark.java
def test_a_static_member_restarted_within_its_session_keeps_its_partitions(
    start_broker: Callable[..., Any], group_consumers: Any, kafka_tools: Any
) -> None:
    broker = start_broker(env=FAST_CONSUMER_GROUPS)
    broker.wait_ready()
    topic, group = "static848", "statics848"
    asyncio.run(create_topic(broker.bootstrap, topic, 4))
    server = ["--bootstrap-server", broker.bootstrap]
    # this group's session: 30 s instead of the broker's 6 s (a group config, as on Kafka 4)
    group_entity = ["--entity-type", "groups", "--entity-name", group]
    kafka_tools.check(
        "configs",
        *server,
        *group_entity,
        "--alter",
        "--add-config",
        "consumer.session.timeout.ms=30000",
    )
    configs = kafka_tools.check("configs", *server, *group_entity, "--describe")
    assert "consumer.session.timeout.ms=30000" in configs, configs

    def member(instance: str) -> Any:
        return group_consumers.start(
            "java-4",
            broker.bootstrap,
            [topic],
            group,
            timeout=180,
            instance_id=instance,
            configs=consumer_protocol("uniform"),
        )

    a, b = member("static-a"), member("static-b")
    everything = {(topic, p) for p in range(4)}
    before_a, before_b = wait_for_assignment([a, b], everything, timeout=FAILOVER_S)

    def group_epoch() -> str:
        state = kafka_tools.check(
            "consumer-groups", *server, "--describe", "--group", group, "--state", "--verbose"
        )
        header, row = (line.split() for line in state.strip().splitlines()[-2:])
        return dict(zip(header, row, strict=False))["GROUP-EPOCH"]

    epoch = group_epoch()
    events_of_a = len(a.events)
    assert b.terminate() == 0  # a static member leaves with epoch -2: its place is kept
    time.sleep(8)  # past the broker's 6 s session: only the group's 30 s keeps the place
    again = member("static-b")
    again.wait_for(lambda c: c.assignment or None, FAILOVER_S, "the old assignment")
    assert again.assignment == before_b
    asyncio.run(produce(broker.bootstrap, topic, values("x", 40), 4))
    a.wait_for(lambda c: len(c.records) >= 20 or None, 60, "a's records")
    rebalanced = [e.kind for e in a.events[events_of_a:] if e.kind in ("assigned", "revoked")]
    assert rebalanced == [], f"the other member saw a rebalance: {rebalanced}"
    assert a.assignment == before_a
    # kafka-consumer-groups describes it through ConsumerGroupDescribe, and lists it by type
    state = kafka_tools.check("consumer-groups", *server, "--describe", "--group", group, "--state")
    assert "uniform" in state and "Stable" in state, state
    listed = kafka_tools.check("consumer-groups", *server, "--list", "--type", "consumer")
    assert group in listed.split(), listed
    members = kafka_tools.check(
        "consumer-groups", *server, "--describe", "--group", group, "--members", "--verbose"
    )
    assert "static-a" in members and "static-b" in members, members
    assert group_epoch() == epoch, "the restart bumped the group epoch"


def test_a_consumer_group_takes_over_an_empty_classic_groups_id_and_offsets(
    start_broker: Callable[..., Any], group_consumers: Any
) -> None:
    broker = start_broker(env=FAST_CONSUMER_GROUPS)
    broker.wait_ready()
    topic, group = "upgrade848", "upgraded"
    asyncio.run(create_topic(broker.bootstrap, topic, 2))
    asyncio.run(produce(broker.bootstrap, topic, values("first", 20), 2))
    classic = group_consumers.start(
        "confluent-kafka", broker.bootstrap, [topic], group, timeout=120, count=20
    )
    assert classic.wait(120) == 0, classic.report()
    asyncio.run(produce(broker.bootstrap, topic, values("second", 20), 2))
    modern = group_consumers.start(
        "confluent-kafka",
        broker.bootstrap,
        [topic],
        group,
        timeout=120,
        count=20,
        configs=consumer_protocol("uniform"),
    )
    assert modern.wait(120) == 0, modern.report()
    # it started from the classic group's commits: only the second batch
    assert sorted((r.value or "") for r in modern.records) == sorted(
        v.decode() for v in values("second", 20)
    )
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(30)
    types = {g.group_id: str(g.type) for g in listed.valid}
    assert types[group].endswith("CONSUMER"), types
    # a classic member joins the consumer group beside a consumer-protocol member (KIP-848's
    # online migration): they split the topic's two partitions
    holder = group_consumers.start(
        "confluent-kafka",
        broker.bootstrap,
        [topic],
        group,
        timeout=90,
        configs=consumer_protocol("uniform"),
    )
    holder.wait_for(lambda c: c.assignment or None, 60, "an assignment")
    classic_member = group_consumers.start(
        "confluent-kafka", broker.bootstrap, [topic], group, timeout=90
    )
    both = [holder, classic_member]
    wait_for_assignment(both, {(topic, 0), (topic, 1)}, timeout=FAILOVER_S)
    assert str(describe(broker.bootstrap, group).type).endswith("CONSUMER")


@pytest.mark.compat("kip848", "java-4")
@pytest.mark.java
@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_a_live_classic_group_is_upgraded_by_its_first_consumer_protocol_member_and_back(
    start_broker: Callable[..., Any], group_consumers: Any, assignor: str
) -> None:
    """KIP-848's online migration, as a rolling upgrade does it: two Java 4 members of a stable
    classic group (eager range, or cooperative-sticky) keep consuming while a third joins with
    group.protocol=consumer: the group becomes a consumer group, the classic members rejoin to
    give up their share, all three split the partitions, a classic member's crash moves its
    share; when the consumer-protocol member leaves, the group is a classic group again (the
    downgrade) and its last member takes every partition; every record is read and committed."""
    broker = start_broker(env=FAST_CONSUMER_GROUPS, backends="real")
    broker.wait_ready()
    topic, group = "migrate848", f"migrate-{assignor}"
    produced = values("before", 300)
    asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
    asyncio.run(produce(broker.bootstrap, topic, produced, PARTITIONS))
    classic_configs = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    classic = [
        group_consumers.start(
            "java-4",
            broker.bootstrap,
            [topic],
            group,
            timeout=180,
            assignor=assignor,
            configs=classic_configs,
        )
        for _ in range(2)
    ]
    everything = {(topic, p) for p in range(PARTITIONS)}
    wait_for_assignment(classic, everything, timeout=FAILOVER_S)
    modern = group_consumers.start(
        "java-4",
        broker.bootstrap,
        [topic],
        group,
        timeout=180,
        configs=consumer_protocol("uniform"),
    )
    members = [*classic, modern]
    shares = wait_for_assignment(members, everything, timeout=FAILOVER_S)
    assert all(len(share) == 2 for share in shares), shares
    described = describe(broker.bootstrap, group)
    assert str(described.type).endswith("CONSUMER"), described
    assert len(described.members) == 3

    def seen() -> set[bytes]:
        return {(r.value or "").encode() for r in all_records(members)}

    after = values("after", 300)
    asyncio.run(produce(broker.bootstrap, topic, after, PARTITIONS))
    produced += after
    modern.wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    classic[0].kill()  # a classic member's session ends: its share moves to the others
    survivors = [classic[1], modern]
    wait_for_assignment(survivors, everything, timeout=FAILOVER_S)
    last = values("last", 300)
    asyncio.run(produce(broker.bootstrap, topic, last, PARTITIONS))
    produced += last
    modern.wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    # the consumer-protocol member leaves: a classic group again, its member takes everything
    assert modern.terminate() == 0, modern.report()
    wait_for_assignment([classic[1]], everything, timeout=FAILOVER_S)
    assert str(describe(broker.bootstrap, group).type).endswith("CLASSIC")
    final = values("final", 300)
    asyncio.run(produce(broker.bootstrap, topic, final, PARTITIONS))
    produced += final
    classic[1].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    assert classic[1].terminate() == 0, classic[1].report()
    assert set(produced) <= seen()
    assert committed_offsets(broker.bootstrap, group, topic, PARTITIONS) == end_offsets(
        broker.bootstrap, topic, PARTITIONS
    )
