"""The group service on the embedded store: it coordinates the groups of the __consumer_offsets
partitions it owns, loads them from the store when a partition opens, forgets them when it closes,
and every write it makes is fenced on the partition's leader key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.group_model import GroupSettings
from kafscale.coordinator.group_service import GroupService
from kafscale.ipc import messages
from kafscale.ipc.messages import CreateTopics, TopicSpec
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.group_partition import group_partition
from kafscale.metadata.records import GroupRecord, Keys, MemberRecord, OffsetRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.local import LocalObjectStore
from tests.unit.leaders import ClaimedLeaders

PARTITIONS = 4
NONE, NOT_COORDINATOR = int(ErrorCode.none), int(ErrorCode.not_coordinator)
KEYS = Keys("ns")


def groups_on(partition: int, count: int = 2) -> list[str]:
    """``count`` group ids whose offsets partition is ``partition``."""
    found = [
        g for g in (f"group-{i}" for i in range(200)) if group_partition(g, PARTITIONS) == partition
    ]
    return found[:count]


G, H = groups_on(1)  # two groups on offsets partition 1
OTHER = groups_on(2, 1)[0]  # a group on partition 2


class Replies:
    def __init__(self) -> None:
        self.sent: dict[bytes, messages.Message] = {}

    def reply(self, incoming: Incoming, message: messages.Message) -> None:
        assert incoming.request_id not in self.sent, "answered twice"
        self.sent[incoming.request_id] = message


class Rig:
    def __init__(self, store: SqliteMetadataStore) -> None:
        self.store = store
        self.leaders = ClaimedLeaders(store, "ns")
        self.replies = Replies()
        self.service = GroupService(
            store,
            "ns",
            self.replies,
            GroupSettings(initial_rebalance_delay_ms=0),
            {},
            self.leaders,
        )
        self.handlers = self.service.handlers()
        self.requests = 0

    def ask(self, message: messages.Message) -> messages.Message | None:
        """The answer, at once or (JoinGroup, SyncGroup) once sent; None while it waits."""
        self.requests += 1
        request_id = str(self.requests).encode()
        answer = self.handlers[type(message)](Incoming(b"client", request_id, message))
        return answer if answer is not None else self.replies.sent.get(request_id)

    def heartbeat(self, group: str, member: str, generation: int) -> int:
        answer = self.ask(messages.Heartbeat(group, generation, member))
        assert isinstance(answer, messages.GroupError)
        return answer.error_code

    def commit(self, group: str, offset: int) -> list[int]:
        answer = self.ask(
            messages.OffsetCommit(group, -1, "", None, [messages.PartitionOffset("t", 0, offset)])
        )
        assert isinstance(answer, messages.OffsetCommitResult)
        return answer.error_codes

    def fetch(self, group: str) -> tuple[int, dict[tuple[str, int], int]]:
        answer = self.ask(messages.OffsetFetch([messages.GroupOffsetsQuery(group, None)]))
        assert isinstance(answer, messages.OffsetFetchResult)
        [result] = answer.groups
        return result.error_code, {(o.topic, o.partition): o.offset for o in result.offsets}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    admin = TopicAdmin(
        store, LocalObjectStore(str(tmp_path / "objects")), "ns", 1, offsets_partitions=PARTITIONS
    )
    created = admin.create(CreateTopics([TopicSpec(OFFSETS_TOPIC, partitions=-1)]))
    assert created.results[0].partitions == PARTITIONS
    yield store
    store.close()


def written_by_another_broker(store: SqliteMetadataStore, group: str, generation: int) -> None:
    """A stable group of one member and an offset, as the previous coordinator left them."""
    member = MemberRecord(
        "m1", None, "client", "/10.0.0.9", 10_000, 30_000, [("range", b"s")], b"A"
    )
    record = GroupRecord(group, "consumer", "range", generation, "m1", [member])
    store.put(KEYS.group(group), records.encode(record))
    store.put(KEYS.offset(group, "t", 0), records.encode(OffsetRecord(40 + generation)))


def test_an_opened_partition_serves_its_groups_as_the_store_holds_them(
    store: SqliteMetadataStore,
) -> None:
    written_by_another_broker(store, G, 7)
    written_by_another_broker(store, OTHER, 3)
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1])
    assert rig.heartbeat(G, "m1", 7) == NONE  # the member carries on in its generation
    assert rig.heartbeat(G, "m1", 6) == int(ErrorCode.illegal_generation)
    assert rig.fetch(G) == (NONE, {("t", 0): 47})
    described = rig.ask(messages.DescribeGroups([G, OTHER]))
    assert isinstance(described, messages.GroupsDescribed)
    ours, theirs = described.groups
    assert (ours.error_code, ours.state, [m.assignment for m in ours.members]) == (
        NONE,
        "Stable",
        [b"A"],
    )
    assert theirs.error_code == NOT_COORDINATOR
    # partition 2 is not ours: every request for its group is refused, nothing is written
    assert rig.heartbeat(OTHER, "m1", 3) == NOT_COORDINATOR
    assert rig.commit(OTHER, 99) == [NOT_COORDINATOR]
    assert rig.fetch(OTHER) == (NOT_COORDINATOR, {})
    assert records.decode_offset(store.get(KEYS.offset(OTHER, "t", 0)).value).offset == 43  # type: ignore[union-attr]
    listed = rig.ask(messages.ListGroups())
    assert isinstance(listed, messages.GroupsListed)
    assert [g.group_id for g in listed.groups] == [G]  # only what this broker coordinates


def test_a_partition_opened_again_is_loaded_again(store: SqliteMetadataStore) -> None:
    written_by_another_broker(store, G, 7)
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1])
    assert rig.heartbeat(G, "m1", 7) == NONE
    rig.leaders.close(OFFSETS_TOPIC, 1)  # handed over...
    assert rig.heartbeat(G, "m1", 7) == NOT_COORDINATOR
    store.delete(KEYS.leader(OFFSETS_TOPIC, 1))
    written_by_another_broker(store, G, 8)  # ...the other coordinator rebalanced the group...
    rig.leaders.claim(OFFSETS_TOPIC, [1])  # ...and we own it again
    assert rig.heartbeat(G, "m1", 7) == int(ErrorCode.illegal_generation)
    assert rig.heartbeat(G, "m1", 8) == NONE
    assert rig.fetch(G) == (NONE, {("t", 0): 48})


def test_a_closed_partition_forgets_its_groups_and_answers_waiting_members(
    store: SqliteMetadataStore,
) -> None:
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1, 2])
    join = messages.JoinGroup(
        G, "", None, "c", "/h", 10_000, 30_000, "consumer", [("range", b"")], False
    )
    first = rig.ask(join)
    assert isinstance(first, messages.JoinGroupResult) and first.error_code == NONE
    waiting = rig.ask(  # a second member: the first must rejoin, so this one waits
        messages.JoinGroup(
            G, "", None, "c", "/h", 10_000, 30_000, "consumer", [("range", b"")], False
        )
    )
    assert waiting is None
    waiting_id = str(rig.requests).encode()
    assert rig.commit(OTHER, 5) == [NONE]
    rig.leaders.close(OFFSETS_TOPIC, 1)
    answered = rig.replies.sent[waiting_id]
    assert isinstance(answered, messages.JoinGroupResult)
    assert answered.error_code == NOT_COORDINATOR
    assert rig.heartbeat(G, first.member_id, first.generation_id) == NOT_COORDINATOR
    listed = rig.ask(messages.ListGroups())
    assert isinstance(listed, messages.GroupsListed)
    assert [g.group_id for g in listed.groups] == [OTHER]  # partition 2 is still ours
    rig.service.tick()  # nothing waits any more: no answer twice


@pytest.mark.parametrize("how", ["deleted", "claimed by another broker"])
def test_a_fenced_write_writes_nothing_and_answers_not_coordinator(
    store: SqliteMetadataStore, how: str
) -> None:
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1])
    assert rig.commit(G, 10) == [NONE]
    epoch = rig.leaders.held[(OFFSETS_TOPIC, 1)].epoch
    rig.leaders.lose(OFFSETS_TOPIC, 1)  # we are not told: the fence finds out
    if how != "deleted":
        ClaimedLeaders(store, "ns", broker=2).claim(OFFSETS_TOPIC, [1])
    assert rig.commit(G, 11) == [NOT_COORDINATOR]
    assert records.decode_offset(store.get(KEYS.offset(G, "t", 0)).value).offset == 10  # type: ignore[union-attr]
    assert rig.leaders.fences == [(OFFSETS_TOPIC, 1, epoch)]  # reported: the partition closes
    assert rig.fetch(G) == (NOT_COORDINATOR, {})
    assert rig.commit(H, 12) == [NOT_COORDINATOR]
    assert store.get(KEYS.offset(H, "t", 0)) is None


def test_a_fenced_assignment_does_not_complete_the_rebalance(store: SqliteMetadataStore) -> None:
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1])
    join = messages.JoinGroup(
        G, "", None, "c", "/h", 10_000, 30_000, "consumer", [("range", b"")], False
    )
    joined = rig.ask(join)
    assert isinstance(joined, messages.JoinGroupResult) and joined.error_code == NONE
    before = store.get(KEYS.group(G))
    rig.leaders.lose(OFFSETS_TOPIC, 1)
    sync = messages.SyncGroup(
        G,
        joined.generation_id,
        joined.member_id,
        None,
        "consumer",
        "range",
        [(joined.member_id, b"A")],
    )
    assert rig.ask(sync) == messages.SyncGroupResult(NOT_COORDINATOR)
    assert store.get(KEYS.group(G)) == before  # the assignment was never stored
    assert rig.heartbeat(G, joined.member_id, joined.generation_id) == NOT_COORDINATOR


def test_offsets_of_topics_an_active_classic_group_subscribes_to_cannot_be_deleted(
    store: SqliteMetadataStore,
) -> None:
    """OffsetDelete reads the members' ConsumerProtocolSubscription (here as aiokafka writes
    it): their topics are GROUP_SUBSCRIBED_TO_TOPIC, any other topic's offsets go."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    subscription = ConsumerProtocolMemberMetadata(0, ["orders"], b"").encode()
    member = MemberRecord(
        "m1", None, "client", "/10.0.0.9", 10_000, 30_000, [("range", subscription)], b""
    )
    store.put(KEYS.group(G), records.encode(GroupRecord(G, "consumer", "range", 3, "m1", [member])))
    for topic in ("orders", "t"):
        store.put(KEYS.offset(G, topic, 0), records.encode(OffsetRecord(5)))
    rig = Rig(store)
    rig.leaders.claim(OFFSETS_TOPIC, [1])
    answer = rig.ask(messages.OffsetDelete(G, [("orders", 0), ("t", 0)]))
    assert answer == messages.OffsetsDeleted(
        NONE, [("orders", 0, int(ErrorCode.group_subscribed_to_topic)), ("t", 0, NONE)]
    )
    assert rig.fetch(G) == (NONE, {("orders", 0): 5})
