"""Consumer groups on three brokers (docs/design/scale-out.md, section 7): each group has one
coordinator, the owner of its __consumer_offsets partition; every broker names the same one in
FindCoordinator, the others answer its requests NOT_COORDINATOR and list only their own groups;
a group whose coordinator hands its partitions over (SIGTERM) carries on at its committed
offsets on the new coordinator; and a group of real consumers (librdkafka and kafka-clients)
whose coordinator is SIGKILLed, or SIGSTOPped past its lease, in the middle of a rebalance under
idempotent load converges on a new coordinator with its committed offsets and reads every
acknowledged record."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from tests.harness import cluster as scale_out
from tests.harness.cluster import (
    LoadProducer,
    bootstrap,
    create_topic,
    start_cluster,
    wait_for_leaders,
)
from tests.harness.groups import GroupConsumer, GroupConsumers, wait_for_assignment
from tests.harness.history import History

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


# --- the coordinator killed or paused in the middle of a rebalance -------------------------------

# Short enough that the test does not wait out the defaults (45 s sessions, 5 min rebalances,
# 30-60 s for a request to a paused broker) if a member is lost or a broker stops answering, long
# enough for the coordinator's failover (the lease, 6 s, and a claim).
MEMBER_CONFIGS = {
    "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 1000,
    "max.poll.interval.ms": 10000,
}
REQUEST_TIMEOUT = {"java-4": "request.timeout.ms", "confluent-kafka": "socket.timeout.ms"}


def group_state(broker: Any, group: str) -> str:
    described = ask(broker, 15, 5, groups=(group,), include_authorized_operations=False)
    (found,) = described.groups
    assert found.error_code == ErrorCode.none, found
    return str(found.group_state)


def committed_by_group(broker: Any, group: str) -> dict[int, int]:
    """The group's committed offsets of the topic, as its coordinator ``broker`` answers them."""
    fetched = ask(broker, 9, 5, group_id=group, topics=None)
    assert fetched.error_code == ErrorCode.none, fetched
    return {
        int(p.partition_index): int(p.committed_offset)
        for t in fetched.topics
        if t.name == scale_out.TOPIC
        for p in t.partitions
        if p.error_code == ErrorCode.none and p.committed_offset >= 0
    }


def committed_before(members: list[GroupConsumer], moment: float) -> dict[int, int]:
    """Per partition, the highest offset a member was told it committed before ``moment``."""
    best: dict[int, int] = {}
    for member in members:
        for event in member.of_kind("committed"):
            if event.at < moment:
                for (_, partition), offset in event.offsets.items():
                    best[partition] = max(best.get(partition, -1), offset)
    return best


def restarts_below_commits(members: list[GroupConsumer]) -> list[str]:
    """Each time a member was given a partition, the first record it read of it was at or past
    every offset of it a member had been told was committed before: a lost or rolled-back
    commit shows as a member starting below one. (A member still holding a partition cannot
    commit it once another has it: the generation moved on.) The violations, for a message."""
    wrong = []
    for member in members:
        events = member.events
        for index, event in enumerate(events):
            if event.kind != "assigned":
                continue
            floor = committed_before(members, event.at)
            for _, partition in event.partitions:
                first = next(
                    (e for e in events[index + 1 :] if e.kind == "record" and e.tp[1] == partition),
                    None,
                )
                if first is not None and first.offset < floor.get(partition, -1):
                    wrong.append(f"{member.name} p{partition}: read from {first.offset}, "
                                 f"{floor[partition]} committed before")  # fmt: skip
    return wrong


def wait_until_everything_acked_was_read(
    members: list[GroupConsumer], history: History, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        read = {(r.tp[1], r.offset) for member in members for r in member.records}
        missing = [
            (partition, offset)
            for (_, partition), offset in history.acked.values()
            if (partition, offset) not in read
        ]
        if not missing:
            return
        assert time.monotonic() < deadline, f"{len(missing)} acked records not read: {missing[:5]}"
        time.sleep(0.5)


def timeline(member: GroupConsumer, moment: float) -> str:
    """What a member went through, for the test's log: its rebalances (seconds from
    ``moment``) and, between them, the records it read (per partition: how many, the last
    offset) and how many of its commits failed."""
    steps: list[str] = []
    read: dict[int, tuple[int, int]] = {}
    failed = 0
    for e in [*member.of_kind("assigned", "revoked", "lost", "commit-failed", "record"), None]:
        if e is not None and e.kind == "record":
            read[e.tp[1]] = (read.get(e.tp[1], (0, 0))[0] + 1, e.offset)
        elif e is not None and e.kind == "commit-failed":
            failed += 1
        else:
            steps += [f"p{p}: {n} to {last}" for p, (n, last) in sorted(read.items())]
            steps += [f"{failed} commits failed"] if failed else []
            read, failed = {}, 0
            if e is not None:
                steps.append(f"{e.kind}{sorted(p for _, p in e.partitions)}@{e.at - moment:+.1f}")
    return f"{member.name} (exit {member.returncode}): " + ", ".join(steps)


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


@pytest.mark.java
@pytest.mark.parametrize(
    ("fault", "trigger", "assignor"),
    [
        ("kill", "join", "range"),
        pytest.param("kill", "leave", "range", marks=pytest.mark.long),
        pytest.param("pause", "join", "range", marks=pytest.mark.long),
        pytest.param("kill", "join", "cooperative-sticky", marks=pytest.mark.long),
    ],
)
def test_a_group_converges_when_its_coordinator_fails_during_a_rebalance(
    start_broker: Callable[..., Any],
    group_consumers: GroupConsumers,
    request: pytest.FixtureRequest,
    fault: str,
    trigger: str,
    assignor: str,
) -> None:
    """A member joins (or leaves) a group of librdkafka and kafka-clients members that consume
    under idempotent load; while the rebalance waits for the others, the coordinator is
    SIGKILLed (or SIGSTOPped past its lease, then woken). The group converges on a new
    coordinator that every broker names, keeps every committed offset, and reads every
    acknowledged record (again, at most, after a rebalance: never two values at one offset).
    With the eager protocol (range) members give up their partitions when the rebalance starts;
    with the cooperative one (KIP-429) they keep reading them during it (their commits are
    refused while they rejoin)."""
    brokers = start_cluster(start_broker, 3, GROUPS_ENV)
    create_topic(brokers)
    wait_for_leaders(brokers, {0, 1, 2})
    group, partitions = "rebalancing", {(scale_out.TOPIC, p) for p in range(scale_out.PARTITIONS)}
    by_id = {int(b.env["KAFSCALE_BROKER_ID"]): b for b in brokers}
    old = coordinator_seen_by(brokers[0], group)
    load = LoadProducer(brokers, History(), "p1")
    load.start()

    def member(client: str) -> GroupConsumer:
        return group_consumers.start(
            client, bootstrap(brokers), [scale_out.TOPIC], group,
            assignor=assignor, timeout=150,
            configs={**MEMBER_CONFIGS, REQUEST_TIMEOUT[client]: 10000},
        )  # fmt: skip

    clients = ["confluent-kafka", "java-4"] + (["confluent-kafka"] if trigger == "leave" else [])
    if assignor == "cooperative-sticky":
        clients[:2] = ["java-4", "confluent-kafka"]  # the first member below: see there
    members = [member(client) for client in clients]
    everyone = list(members)  # members that left too: what they read and committed counts
    wait_for_assignment(members, partitions, timeout=60)
    load.wait_acked(500)
    for m in members:
        m.wait_for(lambda c: c.committed, timeout=30, what="a commit")

    # The rebalance waits for a member that cannot answer (paused), so the moment is certain:
    # the coordinator is stopped in PreparingRebalance, with the joiner's JoinGroup parked (or
    # the leaver gone) and the first member rejoining.
    first, slow = members[0], members[1]
    coordinator = by_id[old]
    family = [coordinator.pid, *coordinator.children()]
    # Whatever fails below, nothing stays stopped for the teardown.
    request.addfinalizer(lambda: signal_all([slow.pid, *family], signal.SIGCONT))
    started = time.monotonic()
    signal_all([slow.pid], signal.SIGSTOP)
    if trigger == "join":
        members.append(member("confluent-kafka"))
        everyone.append(members[-1])
    else:
        assert members.pop().terminate() == 0  # commits, leaves the group
    deadline = time.monotonic() + 30
    while (state := group_state(coordinator, group)) != "PreparingRebalance":
        assert time.monotonic() < deadline, f"no rebalance: {state}"
        time.sleep(0.05)
    rebalancing = time.monotonic()
    if assignor == "range":  # eager: it commits and gives its partitions up to rejoin
        first.wait_for(lambda c: any(e.at > started for e in c.of_kind("revoked")), 30, "revoked")
    else:
        # cooperative: it rejoins keeping them and reads on; kafka-clients refuses its commits
        # while it rejoins (RebalanceInProgressException), which says it knows (librdkafka
        # defers them silently, hence Java here).
        first.wait_for(
            lambda c: any(e.at > rebalancing for e in c.of_kind("commit-failed")),
            30,
            "a commit refused during the rebalance",
        )
    state = group_state(coordinator, group)
    assert state == "PreparingRebalance", state
    faulted = time.monotonic()
    try:
        if fault == "kill":
            coordinator.kill()  # no goodbye: the group's state and offsets are in etcd
        else:
            signal_all(family, signal.SIGSTOP)
        signal_all([slow.pid], signal.SIGCONT)
        floor = committed_before(everyone, faulted)
        survivors = [b for node, b in by_id.items() if node != old]

        # Every surviving broker names the same live coordinator.
        deadline = time.monotonic() + 60
        while len(named := {coordinator_seen_by(b, group) for b in survivors}) != 1 or old in named:
            assert time.monotonic() < deadline, f"coordinator still {named} (was {old})"
            time.sleep(0.2)
        new = by_id[named.pop()]
        # The group converges: every partition to exactly one member, each member a share.
        wait_for_assignment(members, partitions, timeout=60)
        converged = time.monotonic()
        kept = committed_by_group(new, group)
        assert all(kept.get(p, -1) >= offset for p, offset in floor.items()), (floor, kept)
        if fault == "pause":
            # Woken, it finds its lease gone; whatever it does then (stop, or rejoin and take
            # partitions back), nothing it still held in memory lands and the group carries on.
            signal_all(family, signal.SIGCONT)

        # Consumption continues on every member: each partition gets 100 new records (counted
        # by acknowledgement time: records stuck at a paused broker are acked in a burst).
        deadline = time.monotonic() + 60
        while min(sum(t > converged for t in load.acked_at[p]) for p in load.acked_at) < 100:
            assert time.monotonic() < deadline, "the load did not carry on"
            time.sleep(0.2)
        load.stop()
        for m in members:
            m.wait_for(lambda c: sum(r.at > converged for r in c.records) >= 50, 60, "50 records")
        wait_until_everything_acked_was_read(everyone, load.history)
        for m in members:
            assert m.terminate() == 0, m.report()
    finally:
        for m in everyone:  # what each member went through, for the log
            print(timeline(m, faulted))
    wrong = restarts_below_commits(everyone)
    assert not wrong, wrong
    for m in everyone:
        for r in m.records:
            assert r.value is not None
            load.history.saw(scale_out.TOPIC, r.tp[1], r.offset, r.value.encode())
    print(load.history.check(), dict(load.errors), f"{fault} in {state}: {floor} -> {kept}")
