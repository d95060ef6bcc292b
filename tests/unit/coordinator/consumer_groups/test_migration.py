"""KIP-848's online migration (consumer_groups.migration): a live classic group upgraded by its
first consumer-protocol member, and classic members living on inside the consumer group through
JoinGroup, SyncGroup, Heartbeat and LeaveGroup -- with the subscriptions and assignments as
aiokafka's classic consumer encodes them."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import msgspec
import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.coordinator.consumer_groups import machine, migration
from kafscale.coordinator.consumer_groups.coordinator import ConsumerGroups
from kafscale.coordinator.consumer_groups.machine import HeartbeatError, Step
from kafscale.coordinator.consumer_groups.model import (
    ConsumerGroup,
    ConsumerMember,
    ConsumerSettings,
    GroupState,
    MemberState,
)
from kafscale.coordinator.group_coordinator import GroupCoordinator
from kafscale.coordinator.group_model import Group, GroupSettings, Member
from kafscale.coordinator.group_model import GroupState as ClassicState
from kafscale.ipc import messages
from kafscale.ipc.consumer_groups import ConsumerGroupHeartbeat
from kafscale.metadata.group_records import ConsumerGroupRecord
from kafscale.metadata.records import GroupRecord
from kafscale.protocol.consumer_protocol import decode_assignment
from kafscale.protocol.errors import ErrorCode
from tests.unit.coordinator.consumer_groups.test_machine import Client, Coordinator, request
from tests.unit.coordinator.test_groups import MemoryStore

T1 = "00000000-0000-0000-0000-000000000001"
TOPICS = {"t": (T1, 6)}
SETTINGS = ConsumerSettings(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
NOW = 1_000
SESSION = 10_000


def subscription(topics: list[str]) -> bytes:
    return bytes(ConsumerProtocolMemberMetadata(0, topics, b"").encode())


def assignment(partitions: list[int], user_data: bytes = b"") -> bytes:
    return bytes(ConsumerProtocolMemberAssignment(0, [("t", partitions)], user_data).encode())


def classic_group(generation: int = 5, **changes: object) -> Group:
    """A stable classic group of two aiokafka-style members, three partitions each."""
    group = Group(
        "g",
        ClassicState.STABLE,
        generation,
        "consumer",
        "range",
        "a",
        **changes,  # type: ignore[arg-type]
    )
    for member_id, owned in (("a", [0, 1, 2]), ("b", [3, 4, 5])):
        group.members[member_id] = Member(
            member_id,
            None,
            "client",
            "/127.0.0.1",
            SESSION,
            30_000,
            "consumer",
            [("range", subscription(["t"]))],
            assignment(owned),
        )
    return group


def held(group: ConsumerGroup, member_id: str) -> set[int]:
    return {p for _, p in group.members[member_id].held()}


def join_request(member_id: str) -> messages.JoinGroup:
    return messages.JoinGroup(
        "g",
        member_id,
        None,
        "client",
        "/127.0.0.1",
        SESSION,
        30_000,
        "consumer",
        [("range", subscription(["t"]))],
        True,
    )


def consumer_join(
    member_id: str, epoch: int = 0, owned: list[int] | None = None
) -> ConsumerGroupHeartbeat:
    from kafscale.ipc.consumer_groups import TopicIdPartitions

    return ConsumerGroupHeartbeat(
        1,
        "g",
        member_id,
        epoch,
        None,
        None,
        300_000 if epoch == 0 else -1,
        ["t"] if epoch == 0 else None,
        None,
        None,
        [] if epoch == 0 else ([TopicIdPartitions(T1, owned)] if owned is not None else None),
        "client",
        "/127.0.0.1",
    )


def test_an_upgrade_keeps_every_member_its_id_subscription_and_partitions() -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    assert (group.epoch, group.assignment_epoch) == (5, 5)
    assert set(group.members) == {"a", "b"}
    assert held(group, "a") == {0, 1, 2} and held(group, "b") == {3, 4, 5}
    a = group.members["a"]
    assert a.member_epoch == 5 and a.state is MemberState.STABLE
    assert a.subscribed_topic_names == ("t",)
    assert a.classic is not None and a.classic.session_timeout_ms == SESSION
    assert group.sessions["a"] == NOW + SESSION
    assert group.state() is GroupState.STABLE


@pytest.mark.parametrize(
    ("policy", "changes", "user_data", "error", "reason"),
    [
        ("disabled", {}, b"", ErrorCode.group_id_not_found, "online upgrade is disabled"),
        ("downgrade", {}, b"", ErrorCode.group_id_not_found, "online upgrade is disabled"),
        ("upgrade", {"protocol_type": "connect"}, b"", ErrorCode.group_id_not_found, "embedded"),
        ("upgrade", {}, b"sticky", ErrorCode.group_id_not_found, "custom assignor"),
        ("upgrade", {"members": {}}, b"", ErrorCode.group_id_not_found, "maximum size"),
        (
            "upgrade",
            {"state": ClassicState.COMPLETING_REBALANCE},
            b"",
            ErrorCode.coordinator_load_in_progress,
            "rebalancing",
        ),
    ],
)
def test_an_upgrade_is_refused_as_kafka_refuses_it(
    policy: str, changes: dict[str, object], user_data: bytes, error: ErrorCode, reason: str
) -> None:
    classic = classic_group()
    for name, value in changes.items():
        if name != "members":
            setattr(classic, name, value)
    classic.members["a"].assignment = assignment([0, 1, 2], user_data)
    settings = dataclasses.replace(SETTINGS, max_size=1) if "members" in changes else SETTINGS
    with pytest.raises(HeartbeatError) as raised:
        migration.upgrade(classic, policy, settings, TOPICS, NOW)
    assert raised.value.code is error and reason in raised.value.message


def test_a_malformed_embedded_protocol_is_not_upgraded() -> None:
    classic = classic_group()
    classic.members["b"].protocols = [("range", b"\x00")]
    with pytest.raises(HeartbeatError, match="embedded consumer protocol is malformed"):
        migration.upgrade(classic, "bidirectional", SETTINGS, TOPICS, NOW)


def test_an_assignment_giving_a_partition_twice_is_not_upgraded() -> None:
    classic = classic_group()
    classic.members["b"].assignment = assignment([2, 3, 4, 5])
    with pytest.raises(HeartbeatError, match="the same partition"):
        migration.upgrade(classic, "upgrade", SETTINGS, TOPICS, NOW)


def keep(step: Step) -> ConsumerGroup:
    assert step.group is not None
    return step.group


def test_classic_members_rejoin_to_give_partitions_to_a_consumer_member() -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    # c joins with the consumer protocol: a new epoch, a target giving it two partitions that
    # a and b still hold
    step = machine.heartbeat(group, consumer_join("c"), SETTINGS, TOPICS, NOW)
    group = keep(step)
    assert step.reply is not None and group.epoch == 6 == group.assignment_epoch
    assert group.members["c"].state is MemberState.UNRELEASED_PARTITIONS
    assert held(group, "c") == set()
    # a classic heartbeat at the old generation: rejoin
    step, beat = migration.heartbeat(group, messages.Heartbeat("g", 5, "a"), NOW)
    assert beat.error_code == ErrorCode.rebalance_in_progress
    # a rejoins as an eager consumer does (owning nothing now): it moves to epoch 6 at once
    step, joined = migration.join(keep(step), join_request("a"), SETTINGS, TOPICS, NOW)
    group = keep(step)
    assert joined.error_code == ErrorCode.none and joined.generation_id == 6
    assert joined.leader == "" and joined.protocol_name == "range" and joined.members == []
    assert "a" in step.changed
    step, synced = migration.sync(
        group, messages.SyncGroup("g", 6, "a", None, "consumer", "range", []), TOPICS, NOW
    )
    given = decode_assignment(synced.assignment)
    assert synced.error_code == ErrorCode.none
    assert set(given.partitions["t"]) == held(group, "a")
    assert len(held(group, "a")) == 2
    step, beat = migration.heartbeat(group, messages.Heartbeat("g", 6, "a"), NOW)
    assert beat.error_code == ErrorCode.none
    # b does the same; then c gets everything a and b gave up
    step, joined = migration.join(group, join_request("b"), SETTINGS, TOPICS, NOW)
    group = keep(step)
    c = group.members["c"]
    step = machine.heartbeat(
        group, consumer_join("c", c.member_epoch, owned=[]), SETTINGS, TOPICS, NOW
    )
    group = keep(step)
    assert len(held(group, "c")) == 2
    owners = [p for m in group.members for p in held(group, m)]
    assert sorted(owners) == list(range(6))  # every partition held once
    assert group.state() is GroupState.STABLE


def test_a_classic_member_that_leaves_frees_its_partitions() -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    leave = messages.LeaveGroup("g", [messages.LeavingMember("b"), messages.LeavingMember("x")])
    step, left = migration.leave(group, leave)
    group = keep(step)
    assert left.members == [("b", None, 0), ("x", None, int(ErrorCode.unknown_member_id))]
    assert set(group.members) == {"a"} and group.epoch == 6 and "b" in step.removed


def test_new_classic_members_get_an_id_first_and_wrong_generations_are_refused() -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    step, first = migration.join(group, join_request(""), SETTINGS, TOPICS, NOW)
    assert first.error_code == ErrorCode.member_id_required and first.member_id
    assert not step.writes
    step, joined = migration.join(group, join_request(first.member_id), SETTINGS, TOPICS, NOW)
    assert joined.error_code == ErrorCode.none and joined.member_id == first.member_id
    assert first.member_id in keep(step).members and step.group_changed  # a new epoch
    step, beat = migration.heartbeat(group, messages.Heartbeat("g", 4, "a"), NOW)
    assert beat.error_code == ErrorCode.illegal_generation
    sync = messages.SyncGroup("g", 4, "a", None, "consumer", "range", [])
    assert migration.sync(group, sync, TOPICS, NOW)[1].error_code == ErrorCode.illegal_generation


def test_a_classic_member_is_stored_and_restored_with_its_protocols() -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    a = group.members["a"]
    restored = ConsumerMember.restore(a.record())
    assert restored == a
    again = ConsumerGroup.restore(group.record(), [a.record()], NOW + 7, 45_000)
    assert again.sessions["a"] == NOW + 7 + SESSION  # its own session timeout, not the group's
    plain = dataclasses.replace(a, classic=None)
    assert ConsumerMember.restore(plain.record()).classic is None


class RecordingStore:
    """Takes every consumer-group write (the coordinator's fenced store, without etcd)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, list[str], object, object]] = []
        self.downgrades: list[GroupRecord] = []

    def save_consumer(
        self,
        group_id: str,
        members: Any,
        removed: Any,
        group: Any,
        classic: Any = None,
    ) -> None:
        self.writes.append((group_id, sorted(m.member_id for m in members), group, classic))

    def delete_consumer(self, group_id: str) -> None:
        raise AssertionError("nothing is deleted here")

    def downgrade_consumer(self, group_id: str, classic: GroupRecord) -> None:
        self.downgrades.append(classic)


def test_the_coordinator_stores_an_upgrade_with_the_classic_record_emptied() -> None:
    store = RecordingStore()
    groups = ConsumerGroups(SETTINGS, store, lambda group_id: True, lambda: TOPICS)
    classic = classic_group()
    refused = msgspec.structs.replace(consumer_join("c"), server_assignor="sticky")
    reply = groups.heartbeat(refused, classic, NOW)
    assert reply.error_code == ErrorCode.unsupported_assignor
    assert store.writes == [] and groups.groups == {} and groups.upgraded == []  # nothing upgraded
    reply = groups.heartbeat(consumer_join("c"), classic, NOW)
    assert reply.error_code == ErrorCode.none
    [(group_id, members, record, emptied)] = store.writes
    assert (group_id, members) == ("g", ["a", "b", "c"])
    assert isinstance(record, ConsumerGroupRecord) and record.epoch == 6  # c's join moved it
    assert isinstance(emptied, GroupRecord) and emptied.members == [] and emptied.generation == 5
    assert groups.upgraded == ["g"] and set(groups.groups["g"].members) == {"a", "b", "c"}


def test_the_last_consumer_protocol_member_leaving_turns_the_group_classic_again() -> None:
    store = RecordingStore()
    groups = ConsumerGroups(SETTINGS, store, lambda group_id: True, lambda: TOPICS)
    assert groups.heartbeat(consumer_join("c"), classic_group(), NOW).error_code == 0
    epoch = groups.groups["g"].members["c"].member_epoch
    left = groups.heartbeat(consumer_join("c", -1), None, NOW)
    assert left.error_code == ErrorCode.none
    assert "g" not in groups.groups
    [record] = store.downgrades
    assert groups.downgraded == [record]
    assert (record.protocol_type, record.protocol) == ("consumer", "range")
    assert record.generation == epoch  # the epoch a and b last reconciled to
    assert {m.member_id for m in record.members} == {"a", "b"}
    held = {p for m in record.members for p in decode_assignment(m.assignment).partitions["t"]}
    assert held <= set(range(6))
    # the classic side takes it as a rebalancing group: its members are told to rejoin
    classic = GroupCoordinator(
        GroupSettings(initial_rebalance_delay_ms=0), MemoryStore(), lambda *_: None, bool, groups
    )
    classic.follow_migrations(NOW)
    group = classic.groups["g"]
    assert group.state is ClassicState.PREPARING_REBALANCE and set(group.members) == {"a", "b"}
    beat = classic.heartbeat(messages.Heartbeat("g", epoch, "a"), NOW)
    assert beat.error_code == ErrorCode.rebalance_in_progress


@pytest.mark.parametrize("policy", ["upgrade", "disabled"])
def test_no_downgrade_unless_the_policy_allows_it(policy: str) -> None:
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, NOW)
    assert migration.downgrade_due(group, "bidirectional")
    assert not migration.downgrade_due(group, policy)
    mixed = keep(machine.heartbeat(group, consumer_join("c"), SETTINGS, TOPICS, NOW))
    assert not migration.downgrade_due(mixed, "bidirectional")  # a consumer member is in it


# -- a model: classic members of both kinds beside consumer-protocol members ---------------------


def owned_subscription(owned: set[int]) -> bytes:
    """A v1 ConsumerProtocolSubscription (a cooperative member reports what it owns)."""
    topic = struct.pack(">h", 1) + b"t"
    out = struct.pack(">h", 1) + struct.pack(">i", 1) + topic + struct.pack(">i", -1)
    out += struct.pack(">i", 1) + topic + struct.pack(">i", len(owned))
    return out + b"".join(struct.pack(">i", p) for p in sorted(owned))


@dataclasses.dataclass
class ClassicClient:
    """A classic consumer as Java's behaves inside a consumer group, one request per ``step``
    so that others' requests come in between: told to rebalance, an eager member gives up all
    its partitions and rejoins, a cooperative one rejoins reporting them; from SyncGroup each
    takes its assignment, and a cooperative one that had to give some up rejoins again."""

    member_id: str
    cooperative: bool
    generation: int
    owned: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    state: str = "steady"  # steady, rejoin (JoinGroup next), joined (SyncGroup next)

    def step(self, c: Coordinator) -> None:
        assert c.group is not None
        if self.state == "steady":
            beating = messages.Heartbeat("g", self.generation, self.member_id)
            step, beat = migration.heartbeat(c.group, beating, c.now)
            c.keep(step)
            if beat.error_code == ErrorCode.unknown_member_id:
                self.member_id, self.owned = "", set()
            if beat.error_code != ErrorCode.none:
                self.state = "rejoin"
                if not self.cooperative:
                    self.owned = set()  # eager: everything goes before the JoinGroup
        elif self.state == "rejoin":
            mine = {p for _, p in self.owned}
            metadata = owned_subscription(mine) if self.cooperative else subscription(["t"])
            asked = msgspec.structs.replace(
                join_request(self.member_id), protocols=[("range", metadata)]
            )
            step, joined = migration.join(c.group, asked, SETTINGS, c.topics, c.now)
            c.keep(step)
            self.member_id = joined.member_id
            if joined.error_code == ErrorCode.none:
                self.generation, self.state = joined.generation_id, "joined"
            else:
                assert joined.error_code == ErrorCode.member_id_required, joined
        else:
            sync = messages.SyncGroup("g", self.generation, self.member_id, None, None, None, [])
            step, synced = migration.sync(c.group, sync, c.topics, c.now)
            c.keep(step)
            if synced.error_code != ErrorCode.none:  # the group moved on: join again
                self.state = "rejoin"
                return
            given = {(T1, p) for p in decode_assignment(synced.assignment).partitions.get("t", ())}
            revoked = self.owned - given
            self.owned = given
            self.state = "rejoin" if revoked else "steady"


MODEL_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "beat",
                "beat",
                "classic",
                "classic",
                "lost",
                "join",
                "leave",
                "quit",
                "failover",
                "tick",
            ]
        ),
        st.integers(0, 5),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(st.booleans(), MODEL_ACTIONS)
def test_upgraded_classic_members_never_share_a_partition_with_consumer_members(
    cooperative: bool, actions: list[tuple[str, int]]
) -> None:
    """An upgraded group of two classic members (eager or cooperative) and consumer-protocol
    members coming and going, with failovers and the service's ticks: no partition is ever
    owned by two members as they hold them, every step is stored as kept (``Coordinator``), and
    the group settles balanced."""
    c = Coordinator()
    group = migration.upgrade(classic_group(), "bidirectional", SETTINGS, TOPICS, c.now)
    c.keep(Step(group, set(group.members), set(), True))
    classics = [
        ClassicClient(m, cooperative, 5, {(T1, p) for p in held(group, m)}) for m in ("a", "b")
    ]
    consumers: list[Client] = []
    next_id = 0

    def check_disjoint() -> None:
        seen: dict[tuple[str, int], str] = {}
        for member_id, owned in [(k.member_id, k.owned) for k in classics] + [
            (k.member_id, k.owned) for k in consumers
        ]:
            for tp in owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {member_id}"
                seen[tp] = member_id

    for action, index in actions:
        if action == "join":
            consumers.append(Client(f"m{next_id}"))
            next_id += 1
        elif action in ("beat", "lost") and consumers:
            client = consumers[index % len(consumers)]
            reply = c.beat(client.request())
            if action == "beat":
                client.answer(reply)
            else:
                client.lost()
        elif action == "leave" and consumers and consumers[index % len(consumers)].joined:
            client = consumers.pop(index % len(consumers))
            c.beat(request(client.member_id, -1))
        elif action == "classic" and classics:
            classics[index % len(classics)].step(c)
        elif action == "quit" and len(classics) > 1:
            gone = classics.pop(index % len(classics))
            assert c.group is not None
            step, _ = migration.leave(
                c.group, messages.LeaveGroup("g", [messages.LeavingMember(gone.member_id)])
            )
            c.keep(step)
        elif action == "failover":
            c.failover()
        elif action == "tick":  # the service's tick: a target that is due is computed
            c.tick()
        check_disjoint()
    for _ in range(8 * (len(classics) + len(consumers))):  # quiet: everyone in turn
        c.tick()
        for client in consumers:
            client.answer(c.beat(client.request()))
            check_disjoint()
        for classic in classics:
            classic.step(c)
            check_disjoint()
    assert c.group is not None and c.group.state() is GroupState.STABLE
    owned = [k.owned for k in classics] + [k.owned for k in consumers]
    assert set().union(*owned) == {(T1, p) for p in range(6)}
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
