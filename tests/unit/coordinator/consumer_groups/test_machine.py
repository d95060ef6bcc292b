"""The KIP-848 consumer-group state machine (kafscale.coordinator.consumer_groups.machine): Kafka's
answers to each heartbeat, and a model of members following the protocol as Java's consumer does,
with lost answers and coordinator failovers, checking that no partition is ever owned by two
members as they report it and that the group settles."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.coordinator.consumer_groups import machine
from kafscale.coordinator.consumer_groups.machine import Step
from kafscale.coordinator.consumer_groups.model import (
    ConsumerGroup,
    ConsumerSettings,
    GroupState,
    MemberState,
)
from kafscale.coordinator.consumer_groups.target import preferred_assignor
from kafscale.ipc.consumer_groups import (
    ConsumerGroupHeartbeat,
    ConsumerGroupHeartbeatResult,
    TopicIdPartitions,
)
from kafscale.metadata.group_records import ConsumerGroupRecord, ConsumerMemberRecord
from kafscale.protocol.errors import ErrorCode

T1, T2 = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"
TOPICS = {"t": (T1, 6), "u": (T2, 4)}
SETTINGS = ConsumerSettings(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
TP = tuple[str, int]


def request(
    member_id: str,
    epoch: int,
    *,
    owned: set[TP] | None = None,
    names: list[str] | None = None,
    regex: str | None = None,
    instance_id: str | None = None,
    assignor: str | None = None,
    rebalance_timeout_ms: int = -1,
    group_id: str = "g",
    version: int = 1,
) -> ConsumerGroupHeartbeat:
    if epoch == 0:
        owned = owned if owned is not None else set()
        rebalance_timeout_ms = 300_000 if rebalance_timeout_ms == -1 else rebalance_timeout_ms
        if names is None and regex is None:
            names = ["t"]
    return ConsumerGroupHeartbeat(
        version,
        group_id,
        member_id,
        epoch,
        instance_id,
        None,
        rebalance_timeout_ms,
        names,
        regex,
        assignor,
        _wire(owned) if owned is not None else None,
        "client",
        "/127.0.0.1",
    )


def _wire(owned: set[TP]) -> list[TopicIdPartitions]:
    topics = sorted({t for t, _ in owned})
    return [TopicIdPartitions(t, sorted(p for tt, p in owned if tt == t)) for t in topics]


def partitions(reply: ConsumerGroupHeartbeatResult) -> set[TP] | None:
    if reply.assignment is None:
        return None
    return {(t.topic_id, p) for t in reply.assignment for p in t.partitions}


class Coordinator:
    """The machine with what the service adds: a group kept only once its step is 'stored'."""

    def __init__(self, topics: dict[str, tuple[str, int]] | None = None) -> None:
        self.group: ConsumerGroup | None = None
        self.topics = dict(topics or TOPICS)
        self.now = 1_000
        self.stored_group: ConsumerGroupRecord | None = None
        self.stored_members: dict[str, ConsumerMemberRecord] = {}

    def beat(self, req: ConsumerGroupHeartbeat) -> ConsumerGroupHeartbeatResult:
        step = machine.heartbeat(self.group, req, SETTINGS, self.topics, self.now)
        self.keep(step)
        assert step.reply is not None
        return step.reply

    def keep(self, step: Step | None) -> None:
        if step is None or step.group is None:
            return
        for member_id in step.removed:
            self.stored_members.pop(member_id, None)
        for member_id in step.changed:
            self.stored_members[member_id] = step.group.members[member_id].record()
        if step.group_changed:
            self.stored_group = step.group.record()
        self.group = step.group
        assert self.stored() == self.memory(), "the store lost a change of the state in memory"

    def tick(self, advance_ms: int = 0) -> None:
        self.now += advance_ms
        assert self.group is not None
        self.keep(machine.tick(self.group, SETTINGS, self.topics, self.now))

    def failover(self) -> None:
        """Another coordinator takes over: the group as stored."""
        assert self.stored_group is not None
        self.group = ConsumerGroup.restore(
            self.stored_group,
            list(self.stored_members.values()),
            self.now,
            SETTINGS.session_timeout_ms,
        )

    def memory(self) -> tuple[Any, ...]:
        assert self.group is not None
        g = self.group
        return (
            (g.epoch, g.assignment_epoch, g.metadata_hash),
            {m: member.record() for m, member in g.members.items()},
        )

    def stored(self) -> tuple[Any, ...]:
        g = self.stored_group
        assert g is not None
        return ((g.epoch, g.assignment_epoch, g.metadata_hash), dict(self.stored_members))


# -- Kafka's answers -------------------------------------------------------------------------------


def test_a_first_member_gets_every_partition_at_once() -> None:
    c = Coordinator()
    reply = c.beat(request("m1", 0))
    assert reply.error_code == 0
    assert (reply.member_id, reply.member_epoch, reply.heartbeat_interval_ms) == ("m1", 1, 5_000)
    assert partitions(reply) == {(T1, p) for p in range(6)}
    assert c.group is not None and c.group.state() is GroupState.STABLE


def test_a_second_member_waits_for_the_first_to_revoke() -> None:
    c = Coordinator()
    c.beat(request("m1", 0))
    second = c.beat(request("m2", 0))
    assert second.member_epoch == 2
    assert partitions(second) == set()  # its target is still owned by m1
    assert c.group is not None and c.group.members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    # m1 is told to give up half: its assignment shrinks, its epoch stays until it has.
    first = c.beat(request("m1", 1, owned={(T1, p) for p in range(6)}))
    kept = partitions(first)
    assert first.member_epoch == 1 and kept is not None and len(kept) == 3
    assert c.group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert c.group.state() is GroupState.RECONCILING
    # nothing is given to m2 while m1 still reports owning it
    assert partitions(c.beat(request("m2", 2, owned=set()))) is None
    first = c.beat(request("m1", 1, owned=kept))
    assert first.member_epoch == 2 and partitions(first) is None
    second = c.beat(request("m2", 2, owned=set()))
    got = partitions(second)
    assert got is not None and got == {(T1, p) for p in range(6)} - kept
    assert c.group.state() is GroupState.STABLE


def test_an_answer_lost_on_the_way_is_covered_by_the_previous_epoch() -> None:
    c = Coordinator()
    c.beat(request("m1", 0))
    c.beat(request("m2", 0))
    kept = partitions(c.beat(request("m1", 1, owned={(T1, p) for p in range(6)})))
    assert kept is not None
    c.beat(request("m1", 1, owned=kept))  # moves m1 to epoch 2; say the answer was lost
    again = c.beat(request("m1", 1, owned=kept))
    assert again.error_code == 0 and again.member_epoch == 2


@pytest.mark.parametrize(
    ("epoch", "owned"),
    # ahead of the coordinator; behind, owning more than it has now
    [(5, None), (1, {(T1, p) for p in range(6)})],
)
def test_a_member_at_a_wrong_epoch_is_fenced(epoch: int, owned: set[TP] | None) -> None:
    c = Coordinator()
    c.beat(request("m1", 0))
    c.beat(request("m2", 0))
    c.beat(request("m1", 1, owned={(T1, p) for p in range(6)}))
    c.beat(request("m1", 1, owned=set()))  # m1 at epoch 2, previous 1
    reply = c.beat(request("m1", epoch, owned=owned))
    assert reply.error_code == ErrorCode.fenced_member_epoch
    assert "member epoch" in (reply.error_message or "")


def test_validation_errors_as_kafka_words_them() -> None:
    c = Coordinator()
    cases = [
        (request("", 0), ErrorCode.invalid_request, "MemberId can't be empty."),
        (request("m", 0, group_id=" "), ErrorCode.invalid_request, "GroupId can't be empty."),
        (
            msgspec.structs.replace(request("m", 0), rebalance_timeout_ms=-1),
            ErrorCode.invalid_request,
            "RebalanceTimeoutMs must be provided in first request.",
        ),
        (
            request("m", 0, owned={(T1, 0)}),
            ErrorCode.invalid_request,
            "TopicPartitions must be empty when (re-)joining.",
        ),
        (
            msgspec.structs.replace(request("m", 0), subscribed_topic_names=None),
            ErrorCode.invalid_request,
            "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
            "(re-)joining.",
        ),
        (request("m", -2), ErrorCode.invalid_request, "InstanceId can't be null."),
        (request("m", -3), ErrorCode.invalid_request, "MemberEpoch is invalid."),
        (
            request("m", 0, assignor="sticky"),
            ErrorCode.unsupported_assignor,
            "ServerAssignor sticky is not supported. Supported assignors: uniform, range.",
        ),
        (request("m", 3), ErrorCode.group_id_not_found, "Consumer group g not found."),
        (request("m", -1), ErrorCode.group_id_not_found, "Consumer group g not found."),
    ]
    for req, code, message in cases:
        reply = c.beat(req)
        assert (reply.error_code, reply.error_message) == (code, message), req
    assert c.group is None
    bad_regex = c.beat(request("m", 0, names=None, regex="t("))
    assert bad_regex.error_code == ErrorCode.invalid_regular_expression


def test_v0_members_are_named_by_the_coordinator() -> None:
    c = Coordinator()
    reply = c.beat(request("", 0, version=0))
    assert reply.error_code == 0 and reply.member_id and len(reply.member_id) == 36


def test_unknown_members_and_instances() -> None:
    c = Coordinator()
    c.beat(request("m1", 0, instance_id="i1"))
    assert c.beat(request("m9", 1)).error_code == ErrorCode.unknown_member_id
    assert c.beat(request("m9", 1, instance_id="i9")).error_code == ErrorCode.unknown_member_id
    assert c.beat(request("m9", 1, instance_id="i1")).error_code == ErrorCode.fenced_instance_id
    taken = c.beat(request("m9", 0, instance_id="i1"))
    assert taken.error_code == ErrorCode.unreleased_instance_id


def test_leaving_frees_the_partitions_and_moves_the_epoch() -> None:
    c = Coordinator()
    c.beat(request("m1", 0))
    c.beat(request("m2", 0))
    assert c.group is not None
    epoch = c.group.epoch
    reply = c.beat(request("m2", -1))
    assert (reply.error_code, reply.member_epoch) == (0, -1)
    assert set(c.group.members) == {"m1"} and c.group.epoch == epoch + 1
    assert c.beat(request("m2", -1)).error_code == ErrorCode.unknown_member_id


def test_a_static_member_comes_back_to_its_partitions_without_a_rebalance() -> None:
    c = Coordinator()
    first = c.beat(request("a", 0, instance_id="i1"))
    c.beat(request("b", 0, instance_id="i2"))
    owned = partitions(c.beat(request("a", first.member_epoch, owned=partitions(first))))
    c.beat(request("a", 1, owned=owned))
    assert c.group is not None
    b_owned = partitions(c.beat(request("b", 2, owned=set())))
    assert b_owned
    epoch = c.group.epoch
    left = c.beat(request("b", -2, instance_id="i2"))
    assert (left.error_code, left.member_epoch) == (0, -2)
    assert c.group.epoch == epoch  # no rebalance: its partitions wait for it
    back = c.beat(request("b-restarted", 0, instance_id="i2"))
    assert back.error_code == 0 and partitions(back) == b_owned
    assert c.group.epoch == epoch and "b" not in c.group.members


def test_a_silent_member_is_removed_after_its_session() -> None:
    c = Coordinator()
    c.beat(request("m1", 0))
    c.beat(request("m2", 0))
    c.tick(advance_ms=44_000)
    c.beat(request("m2", 2, owned=set()))
    c.tick(advance_ms=2_000)  # m1 silent for 46 s, m2 for 2 s
    assert c.group is not None and set(c.group.members) == {"m2"}
    reply = c.beat(request("m2", 2, owned=set()))
    assert partitions(reply) == {(T1, p) for p in range(6)}


def test_a_member_keeping_partitions_past_its_rebalance_timeout_is_fenced() -> None:
    c = Coordinator()
    c.beat(request("m1", 0, rebalance_timeout_ms=10_000))
    c.beat(request("m2", 0))
    c.beat(request("m1", 1, owned={(T1, p) for p in range(6)}))  # asked to revoke three
    for _ in range(3):  # it heartbeats, but never lets go
        c.tick(advance_ms=4_000)
        c.beat(request("m1", 1, owned={(T1, p) for p in range(6)}))
    c.tick(advance_ms=1)
    assert c.group is not None and set(c.group.members) == {"m2"}
    assert c.beat(request("m1", 1)).error_code == ErrorCode.unknown_member_id


def test_more_partitions_or_a_new_matching_topic_rebalance_the_group() -> None:
    c = Coordinator()
    first = c.beat(request("m1", 0, names=None, regex="t.*"))
    assert partitions(first) == {(T1, p) for p in range(6)}
    c.topics["t"] = (T1, 8)
    assert c.group is not None
    c.keep(machine.topics_changed(c.group, SETTINGS, c.topics, c.now))
    grown = c.beat(request("m1", 1, owned=partitions(first)))
    assert grown.member_epoch == 2 and partitions(grown) == {(T1, p) for p in range(8)}
    c.topics["tz"] = ("00000000-0000-0000-0000-000000000003", 1)
    c.keep(machine.topics_changed(c.group, SETTINGS, c.topics, c.now))
    more = partitions(c.beat(request("m1", 2, owned=partitions(grown))))
    assert more is not None and ("00000000-0000-0000-0000-000000000003", 0) in more
    assert machine.topics_changed(c.group, SETTINGS, c.topics, c.now) is None  # nothing new


def test_unsubscribing_revokes_a_topic_at_once() -> None:
    c = Coordinator()
    first = c.beat(request("m1", 0, names=["t", "u"]))
    owned = partitions(first)
    assert owned is not None and len(owned) == 10
    reply = c.beat(request("m1", 1, names=["t"], owned=owned))
    assert partitions(reply) == {(T1, p) for p in range(6)}


def test_the_assignor_most_members_name_is_used() -> None:
    c = Coordinator()
    c.beat(request("m1", 0, assignor="range"))
    c.beat(request("m2", 0, assignor="range"))
    c.beat(request("m3", 0))
    assert c.group is not None
    assert preferred_assignor(c.group, SETTINGS) == "range"
    targets = [sorted(m.target[T1]) for m in c.group.members.values()]
    assert sorted(map(len, targets)) == [2, 2, 2]
    assert sorted(p for target in targets for p in target) == list(range(6))


def test_a_full_group_refuses_new_members() -> None:
    c = Coordinator()
    small = dataclasses.replace(SETTINGS, max_size=1)
    c.keep(machine.heartbeat(None, request("m1", 0), small, TOPICS, c.now))
    step = machine.heartbeat(c.group, request("m2", 0), small, TOPICS, c.now)
    assert step.reply is not None and step.reply.error_code == ErrorCode.group_max_size_reached
    assert not step.writes


# -- a model of members following the protocol -----------------------------------------------------


@dataclasses.dataclass
class Client:
    """A member as Java's consumer behaves: it gives up revoked partitions before its next
    heartbeat and reports what it owns; fenced, it drops everything and rejoins."""

    member_id: str
    epoch: int = 0
    owned: set[TP] = dataclasses.field(default_factory=set)
    joined: bool = False
    full: bool = False  # the last answer never came: send every field, get the whole answer

    def request(self) -> ConsumerGroupHeartbeat:
        if not self.joined:
            return request(self.member_id, 0)
        if self.full:
            return request(
                self.member_id,
                self.epoch,
                owned=set(self.owned),
                names=["t"],
                rebalance_timeout_ms=300_000,
            )
        return request(self.member_id, self.epoch, owned=set(self.owned))

    def lost(self) -> None:
        self.full = True

    def answer(self, reply: ConsumerGroupHeartbeatResult) -> None:
        self.full = False
        if reply.error_code in (ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id):
            self.owned, self.epoch, self.joined = set(), 0, False
            return
        assert reply.error_code == 0, reply
        self.joined = True
        self.epoch = reply.member_epoch
        given = partitions(reply)
        if given is not None:
            self.owned = given


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["beat", "beat", "beat", "lost", "join", "leave", "failover", "grow"]),
        st.integers(0, 5),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ACTIONS)
def test_no_partition_is_ever_owned_twice_and_the_group_settles(
    actions: list[tuple[str, int]],
) -> None:
    c = Coordinator()
    clients = [Client(f"m{i}") for i in range(3)]
    next_id = 3

    def check_disjoint() -> None:
        seen: dict[TP, str] = {}
        for client in clients:
            for tp in client.owned:
                assert tp not in seen, f"{tp} owned by {seen[tp]} and {client.member_id}"
                seen[tp] = client.member_id

    for action, index in actions:
        if action == "join":
            clients.append(Client(f"m{next_id}"))
            next_id += 1
        elif not clients:
            continue
        client = clients[index % len(clients)]
        if action in ("beat", "lost"):
            reply = c.beat(client.request())
            if action == "beat":
                client.answer(reply)
            else:
                client.lost()
        elif action == "leave" and client.joined:
            c.beat(request(client.member_id, -1))
            clients.remove(client)
        elif action == "failover" and c.group is not None:
            c.failover()
        elif action == "grow" and c.group is not None:
            topic_id, count = c.topics["t"]
            c.topics["t"] = (topic_id, count + 1)
            c.keep(machine.topics_changed(c.group, SETTINGS, c.topics, c.now))
        check_disjoint()
    for _ in range(8 * max(len(clients), 1)):  # quiet: every member heartbeats in turn
        for client in clients:
            client.answer(c.beat(client.request()))
            check_disjoint()
    if not clients:
        return
    assert c.group is not None and c.group.state() is GroupState.STABLE
    owned = [client.owned for client in clients]
    every = {(T1, p) for p in range(c.topics["t"][1])}
    assert set().union(*owned) == every
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    assert all(client.epoch == c.group.epoch for client in clients)
