"""The classic group machine (``groups.ClassicGroups``) on its own: each step's instructions, in
order, with the store writes as data -- what is sent, what is written, and what waits for the
write (test_groups.py drives the same machine through ``GroupCoordinator``, with a store)."""

from __future__ import annotations

from collections import deque
from typing import Any

from kafscale.coordinator.group_coordinator import GroupCoordinator
from kafscale.coordinator.group_model import (
    DeleteGroup,
    GroupSettings,
    GroupState,
    Instructions,
    Reply,
    SaveGroup,
    SaveOffsets,
    Write,
)
from kafscale.coordinator.groups import ClassicGroups
from kafscale.ipc import messages
from kafscale.metadata.records import GroupRecord
from kafscale.protocol.errors import ErrorCode

SESSION, REBALANCE = 10_000, 30_000
NOW = 1_000


class NoConsumerGroups:
    """No consumer (KIP-848) group exists: the classic machine is on its own."""

    groups: dict[str, Any] = {}

    def commit_error(self, request: messages.OffsetCommit) -> ErrorCode | None:
        return None

    def fetch_error(self, query: messages.GroupOffsetsQuery) -> ErrorCode | None:
        return None

    def subscribed_names(self, group_id: str) -> set[str]:
        return set()

    def listings(self, states: set[str]) -> list[messages.GroupListing]:
        return []


def machine() -> ClassicGroups:
    return ClassicGroups(
        GroupSettings(initial_rebalance_delay_ms=0), lambda group_id: True, NoConsumerGroups()
    )


def join(token: str, member_id: str = "", instance: str | None = None) -> messages.JoinGroup:
    return messages.JoinGroup(
        "g",
        member_id,
        instance,
        "client",
        "/127.0.0.1",
        SESSION,
        REBALANCE,
        "consumer",
        [("range", token.encode())],
        False,
    )


def only_reply(instructions: Instructions) -> Any:
    [reply] = instructions
    assert isinstance(reply, Reply)
    return reply.message


def succeed(instructions: Instructions) -> Instructions:
    """Carry out every write as if the store took it: the replies, in order."""
    replies: Instructions = []
    queue = deque(instructions)
    while queue:
        step = queue.popleft()
        if isinstance(step, Write):
            queue.extendleft(reversed(step.done()))
        else:
            replies.append(step)
    return replies


def sync(member_id: str, generation: int, assignments: dict[str, bytes]) -> messages.SyncGroup:
    return messages.SyncGroup(
        "g", generation, member_id, None, None, None, list(assignments.items())
    )


def stable(groups: ClassicGroups) -> tuple[str, str]:
    """A stable group of two static members (instances i-a, i-b): their member ids, the
    leader's first; each is assigned its instance id."""
    first = only_reply(succeed(groups.join("a", join("a", instance="i-a"), NOW)))
    assert succeed(groups.join("b", join("b", instance="i-b"), NOW)) == []  # waits for a
    replies = succeed(groups.join("a2", join("a2", first.member_id, "i-a"), NOW))
    joined = {r.message.member_id: r.message for r in replies if isinstance(r, Reply)}
    assert len(joined) == 2
    group = groups.groups["g"]
    assert group.leader is not None
    leader, follower = group.leader, next(m for m in joined if m != group.leader)
    instance = {m.member_id: m.group_instance_id or "" for m in group.members.values()}
    assert succeed(groups.sync("sf", sync(follower, group.generation, {}), NOW)) == []
    assignments = {m: instance[m].encode() for m in joined}
    assert len(succeed(groups.sync("sl", sync(leader, group.generation, assignments), NOW))) == 2
    assert group.state is GroupState.STABLE
    return leader, follower


def test_the_assignment_is_written_before_any_member_hears_of_it() -> None:
    groups = machine()
    leader, follower = stable(groups)
    group = groups.groups["g"]
    # a rebalance: both rejoin, both sync; the leader's SyncGroup brings the assignment
    succeed(groups.join("jl", join("jl", leader, "i-a"), NOW))
    assert len(succeed(groups.join("jf", join("jf", follower, "i-b"), NOW))) == 2
    generation = group.generation
    assert groups.sync("sf", sync(follower, generation, {}), NOW) == []
    [write] = groups.sync("sl", sync(leader, generation, {leader: b"L", follower: b"F"}), NOW)
    assert isinstance(write, Write) and isinstance(write.change, SaveGroup)
    saved = {m.member_id: m.assignment for m in write.change.record.members}
    assert saved == {leader: b"L", follower: b"F"}
    assert group.state is GroupState.COMPLETING_REBALANCE  # nothing is stable before the write
    replies = write.done()
    assert {r.token: r.message.assignment for r in replies if isinstance(r, Reply)} == {
        "sf": b"F",
        "sl": b"L",
    }
    assert group.state is GroupState.STABLE


def test_a_refused_assignment_fails_the_syncs_and_rebalances_unless_fenced() -> None:
    for code, rebalances in (
        (ErrorCode.coordinator_not_available, True),
        (ErrorCode.not_coordinator, False),
    ):
        groups = machine()
        a = only_reply(succeed(groups.join("a", join("a", instance="i-a"), NOW))).member_id
        [write] = groups.sync("s", sync(a, 1, {a: b"A"}), NOW)
        assert isinstance(write, Write)
        replies = write.failed(code)
        sync_errors = [
            r.message.error_code
            for r in replies
            if isinstance(r, Reply) and isinstance(r.message, messages.SyncGroupResult)
        ]
        assert sync_errors == [int(code)]
        state = groups.groups["g"].state
        # the member must join again (fenced: the group is forgotten here anyway)
        assert (state is GroupState.PREPARING_REBALANCE) is rebalances
        assert state is not GroupState.STABLE


def test_a_static_member_takes_its_place_only_once_the_group_with_it_is_written() -> None:
    groups = machine()
    a, b = stable(groups)
    group = groups.groups["g"]
    if group.static["i-b"] != b:
        a, b = b, a
    [write] = groups.join("b2", join("b2", instance="i-b"), NOW)
    assert isinstance(write, Write) and isinstance(write.change, SaveGroup)
    new_id = next(m.member_id for m in write.change.record.members if m.member_id not in (a, b))
    assert set(group.members) == {a, b}  # memory unchanged while the write is out
    assert [m.assignment for m in write.change.record.members if m.member_id == new_id] == [b"i-b"]
    # refused: the old member stays, the newcomer is told to retry
    refused = only_reply(write.failed(ErrorCode.coordinator_not_available))
    assert refused.error_code == ErrorCode.coordinator_not_available
    assert set(group.members) == {a, b} and group.static["i-b"] == b
    # taken: the new id replaces the old one, without a rebalance
    [write] = groups.join("b3", join("b3", instance="i-b"), NOW)
    assert isinstance(write, Write)
    answer = only_reply(write.done())
    assert answer.error_code == ErrorCode.none and answer.member_id in group.members
    assert b not in group.members and group.state is GroupState.STABLE


def test_offsets_are_in_memory_and_acknowledged_only_after_their_write() -> None:
    groups = machine()
    commit = messages.OffsetCommit(
        "g", -1, "", None, [messages.PartitionOffset("t", 0, 42, -1, "")]
    )
    [write] = groups.commit("c", commit, NOW)
    assert isinstance(write, Write) and isinstance(write.change, SaveOffsets)
    assert groups.groups["g"].offsets == {}
    assert only_reply(write.failed(ErrorCode.not_coordinator)).error_codes == [
        int(ErrorCode.not_coordinator)
    ]
    assert groups.groups["g"].offsets == {}
    [write] = groups.commit("c", commit, NOW)
    assert isinstance(write, Write)
    assert only_reply(write.done()).error_codes == [0]
    assert groups.groups["g"].offsets[("t", 0)].offset == 42


def test_delete_groups_writes_one_group_after_the_other_and_answers_once() -> None:
    groups = machine()
    for group_id in ("x", "y"):
        commit = messages.OffsetCommit(
            group_id, -1, "", None, [messages.PartitionOffset("t", 0, 1, -1, "")]
        )
        succeed(groups.commit("c", commit, NOW))
    request = messages.DeleteGroups(["x", "missing", "y"])
    [first] = groups.delete("d", request, {})
    assert isinstance(first, Write) and first.change == DeleteGroup("x", (("t", 0),))
    [second] = first.failed(ErrorCode.coordinator_not_available)  # x stays; y is still tried
    assert isinstance(second, Write) and second.change == DeleteGroup("y", (("t", 0),))
    answer = only_reply(second.done())
    assert answer.results == [
        ("x", int(ErrorCode.coordinator_not_available)),
        ("missing", int(ErrorCode.group_id_not_found)),
        ("y", int(ErrorCode.none)),
    ]
    assert set(groups.groups) == {"x"}


class RecordingStore:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def save_group(self, record: Any) -> None:
        self.writes.append("group " + record.group_id)

    def save_offsets(self, group_id: str, offsets: Any) -> None:
        self.writes.append("offsets " + group_id)

    def delete_group(self, group_id: str, partitions: Any) -> None:
        raise OSError("the metadata store is down")

    def delete_offsets(self, group_id: str, partitions: Any) -> None:
        self.writes.append("offset deletion " + group_id)

    def save_consumer(self, *args: Any) -> None:
        raise AssertionError("no consumer group here")

    def delete_consumer(self, group_id: str) -> None:
        raise AssertionError("no consumer group here")


def test_the_coordinator_runs_each_continuation_before_the_rest_of_the_list() -> None:
    sent: list[tuple[Any, Any]] = []
    store = RecordingStore()
    coordinator = GroupCoordinator(
        GroupSettings(), store, lambda token, message: sent.append((token, message)), bool
    )

    def reply(token: str) -> Reply:
        return Reply(token, messages.GroupError(0))

    empty = GroupRecord("g", "consumer", None, 0, None, [])
    done_first = Write("g", "group", SaveGroup(empty), lambda: [reply("1")])
    refused = Write(
        "g",
        "deletion",
        DeleteGroup("g", ()),
        failed=lambda code: [reply(f"2:{code.name}")],
    )
    assert coordinator.run([done_first, refused, reply("3")]) is None
    assert [token for token, _ in sent] == ["1", "2:coordinator_not_available", "3"]
    assert store.writes == ["group g"]
