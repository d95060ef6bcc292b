"""The group state machine on its own: no sockets, no clock (time is an argument). The rig
coordinates every group (one broker owning every __consumer_offsets partition) unless a test
says otherwise."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from kafscale.coordinator.group_coordinator import GroupCoordinator
from kafscale.coordinator.group_model import GroupSettings, GroupState, NotCoordinator
from kafscale.ipc import messages
from kafscale.metadata.records import GroupRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode

SESSION, REBALANCE = 10_000, 30_000
NONE = int(ErrorCode.none)


class MemoryStore:
    def __init__(self) -> None:
        self.groups: dict[str, GroupRecord] = {}
        self.offsets: dict[str, dict[tuple[str, int], OffsetRecord]] = {}
        self.failing = False
        self.fenced = False  # another broker took the groups over

    def _check(self) -> None:
        if self.failing:
            raise OSError("the metadata store is down")
        if self.fenced:
            raise NotCoordinator("the leader key is another broker's")

    def save_group(self, record: GroupRecord) -> None:
        self._check()
        self.groups[record.group_id] = record

    def delete_group(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        self._check()
        self.groups.pop(group_id, None)
        self.offsets.pop(group_id, None)

    def save_offsets(self, group_id: str, offsets: dict[tuple[str, int], OffsetRecord]) -> None:
        self._check()
        self.offsets.setdefault(group_id, {}).update(offsets)

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        self._check()
        for key in partitions:
            self.offsets.get(group_id, {}).pop(key, None)


class Rig:
    def __init__(self, delay: int = 0) -> None:
        self.store = MemoryStore()
        self.answers: dict[str, messages.Message] = {}
        self.ours: set[str] | None = None  # the groups coordinated here; None: every group
        self.coordinator = GroupCoordinator(
            GroupSettings(initial_rebalance_delay_ms=delay),
            self.store,
            self._send,
            lambda group_id: self.ours is None or group_id in self.ours,
        )
        self.now = 1_000

    def _send(self, token: Any, message: messages.Message) -> None:
        assert token not in self.answers, f"{token} answered twice"
        self.answers[token] = message

    def join(
        self,
        token: str,
        member_id: str = "",
        protocols: Iterable[str] = ("range",),
        instance: str | None = None,
        v4: bool = True,
        group: str = "g",
    ) -> messages.Message | None:
        """Send a JoinGroup; its answer if the group answered it at once (else later, in
        ``answers``: see ``take``)."""
        self.coordinator.join(
            token,
            messages.JoinGroup(
                group,
                member_id,
                instance,
                "client",
                "/127.0.0.1",
                SESSION,
                REBALANCE,
                "consumer",
                [(p, p.encode() + token.encode()) for p in protocols],
                v4,
            ),
            self.now,
        )
        return self.answers.pop(token, None)

    def join_new(self, token: str, **kwargs: Any) -> str:
        """A v4+ newcomer: MEMBER_ID_REQUIRED, then the join proper, whose answer (now or
        later) is ``take(token)``."""
        first = self.join(token + "-id", **kwargs)
        assert isinstance(first, messages.JoinGroupResult)
        assert first.error_code == ErrorCode.member_id_required
        answer = self.join(token, first.member_id, **kwargs)
        if answer is not None:
            self.answers[token] = answer
        return first.member_id

    def take(self, token: str) -> Any:
        return self.answers.pop(token, None)

    def sync(
        self,
        token: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
    ) -> messages.Message | None:
        self.coordinator.sync(
            token,
            messages.SyncGroup(
                "g",
                generation,
                member_id,
                None,
                "consumer",
                None,
                list((assignments or {}).items()),
            ),
            self.now,
        )
        return self.answers.pop(token, None)

    def heartbeat(self, member_id: str, generation: int, instance: str | None = None) -> int:
        request = messages.Heartbeat("g", generation, member_id, instance)
        return self.coordinator.heartbeat(request, self.now).error_code

    def tick(self, ms: int) -> None:
        self.now += ms
        self.coordinator.tick(self.now)

    def state(self, group: str = "g") -> GroupState:
        return self.coordinator.groups[group].state


def stable_pair(rig: Rig) -> tuple[str, str, int]:
    """Two members, stable; returns (leader, follower, generation)."""
    a = rig.join_new("a")
    alone = rig.take("a")  # a is alone: its join completes at once
    b = rig.join_new("b")
    assert alone is not None and rig.heartbeat(a, 1) == ErrorCode.rebalance_in_progress
    ja = rig.join("a", a)
    jb = rig.take("b")
    assert isinstance(ja, messages.JoinGroupResult) and isinstance(jb, messages.JoinGroupResult)
    assert ja.error_code == jb.error_code == NONE and ja.generation_id == jb.generation_id
    leader = ja.leader
    follower = b if leader == a else a
    assert rig.sync("sf", follower, ja.generation_id) is None  # waits for the leader
    done = rig.sync("sl", leader, ja.generation_id, {leader: b"L", follower: b"F"})
    assert isinstance(done, messages.SyncGroupResult) and done.assignment == b"L"
    got = rig.answers.pop("sf")
    assert isinstance(got, messages.SyncGroupResult) and got.assignment == b"F"
    assert rig.state() is GroupState.STABLE
    return leader, follower, ja.generation_id


def test_join_sync_gives_each_member_the_leaders_assignment() -> None:
    rig = Rig()
    a = rig.join_new("a")
    # alone in the group, a completes the join at once (no initial delay configured)
    joined = rig.answers.pop("a")
    assert isinstance(joined, messages.JoinGroupResult)
    assert (joined.error_code, joined.generation_id, joined.leader) == (NONE, 1, a)
    assert [m.member_id for m in joined.members] == [a]
    assert joined.protocol_name == "range"
    b = rig.join_new("b")  # a newcomer starts a rebalance; a learns it from its heartbeat
    assert rig.heartbeat(a, 1) == ErrorCode.rebalance_in_progress
    ja, jb = rig.join("a2", a), rig.take("b")  # a's rejoin completes the join for both
    assert isinstance(ja, messages.JoinGroupResult) and isinstance(jb, messages.JoinGroupResult)
    assert ja.generation_id == jb.generation_id == 2 and ja.leader == a
    assert {m.member_id for m in ja.members} == {a, b} and jb.members == []
    assert rig.sync("sb", b, 2) is None
    assert isinstance(rig.sync("sa", a, 2, {a: b"A", b: b"B"}), messages.SyncGroupResult)
    got = rig.answers.pop("sb")
    assert isinstance(got, messages.SyncGroupResult) and got.assignment == b"B"
    saved = rig.store.groups["g"]
    assert saved.generation == 2 and {m.member_id: m.assignment for m in saved.members} == {
        a: b"A",
        b: b"B",
    }
    assert rig.heartbeat(a, 2) == rig.heartbeat(b, 2) == NONE


def test_the_first_rebalance_waits_for_the_initial_delay() -> None:
    rig = Rig(delay=3000)
    rig.join_new("a")
    rig.tick(2000)
    rig.join_new("b")  # extends the wait
    rig.tick(2000)
    assert "a" not in rig.answers
    rig.tick(1000)
    assert {"a", "b"} <= set(rig.answers)


def test_protocol_is_chosen_by_votes_among_those_all_support() -> None:
    rig = Rig()
    rig.join_new("a", protocols=("range", "roundrobin"))
    rig.answers.pop("a")
    rig.join_new("b", protocols=("roundrobin", "range"))
    rig.join_new("c", protocols=("roundrobin", "sticky"))
    refused = rig.join("d", protocols=("sticky",))
    assert isinstance(refused, messages.JoinGroupResult)
    assert refused.error_code == ErrorCode.inconsistent_group_protocol
    a = next(iter(rig.coordinator.groups["g"].members))
    rig.join("a2", a, protocols=("range", "roundrobin"))
    result = rig.answers["b"]
    assert isinstance(result, messages.JoinGroupResult) and result.protocol_name == "roundrobin"


def test_heartbeat_errors() -> None:
    rig = Rig()
    _leader, follower, generation = stable_pair(rig)
    assert rig.heartbeat(follower, generation + 1) == ErrorCode.illegal_generation
    assert rig.heartbeat("nobody", generation) == ErrorCode.unknown_member_id
    assert rig.coordinator.heartbeat(messages.Heartbeat("other", 1, "x"), rig.now).error_code == (
        ErrorCode.unknown_member_id
    )


def test_a_silent_member_is_removed_after_its_session_and_the_rest_rebalance() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    rig.tick(SESSION // 2)
    assert rig.heartbeat(leader, generation) == NONE  # the follower stays silent
    rig.tick(SESSION // 2)
    assert follower not in rig.coordinator.groups["g"].members
    assert rig.state() is GroupState.PREPARING_REBALANCE
    assert rig.heartbeat(leader, generation) == ErrorCode.rebalance_in_progress
    rejoined = rig.join("l2", leader)
    assert isinstance(rejoined, messages.JoinGroupResult)
    assert rejoined.generation_id == generation + 1 and len(rejoined.members) == 1


def test_members_that_do_not_rejoin_in_the_rebalance_timeout_are_dropped() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    rig.join_new("c")  # a rebalance starts; neither old member rejoins, though they heartbeat
    for _ in range(REBALANCE // 5000):
        rig.tick(5000)
        rig.heartbeat(leader, generation)
        rig.heartbeat(follower, generation)
    joined = rig.answers.pop("c")
    assert isinstance(joined, messages.JoinGroupResult) and joined.error_code == NONE
    assert set(rig.coordinator.groups["g"].members) == {joined.member_id}


def test_leaving_rebalances_and_the_last_to_leave_empties_the_group() -> None:
    rig = Rig()
    leader, follower, _generation = stable_pair(rig)
    left = rig.coordinator.leave(
        messages.LeaveGroup("g", [messages.LeavingMember(follower)]), rig.now
    )
    assert left.members == [(follower, None, NONE)]
    assert rig.state() is GroupState.PREPARING_REBALANCE
    rig.coordinator.leave(messages.LeaveGroup("g", [messages.LeavingMember(leader)]), rig.now)
    assert rig.state() is GroupState.EMPTY
    assert rig.store.groups["g"].members == []
    unknown = rig.coordinator.leave(
        messages.LeaveGroup("g", [messages.LeavingMember("ghost")]), rig.now
    )
    assert unknown.members == [("ghost", None, int(ErrorCode.unknown_member_id))]


def test_a_static_member_that_restarts_keeps_its_assignment_without_a_rebalance() -> None:
    rig = Rig()
    first = rig.join("a", instance="i-a")  # static members skip MEMBER_ID_REQUIRED
    assert isinstance(first, messages.JoinGroupResult)
    a = first.member_id
    assert rig.join("b", instance="i-b") is None
    ja, jb = rig.join("a2", a, instance="i-a"), rig.take("b")
    assert isinstance(ja, messages.JoinGroupResult) and isinstance(jb, messages.JoinGroupResult)
    b, generation = jb.member_id, ja.generation_id
    rig.sync("sb", b, generation)
    rig.sync("sa", a, generation, {a: b"A", b: b"B"})
    rig.answers.clear()
    # b restarts: a new process, no member id, the same instance id, within its session
    again = rig.join("b-again", instance="i-b")
    assert isinstance(again, messages.JoinGroupResult)
    assert again.error_code == NONE and again.generation_id == generation
    assert again.member_id != b
    assert rig.state() is GroupState.STABLE
    synced = rig.sync("sb2", again.member_id, generation)
    assert isinstance(synced, messages.SyncGroupResult) and synced.assignment == b"B"
    assert rig.heartbeat(a, generation) == NONE  # the other member saw no rebalance
    assert rig.heartbeat(b, generation, "i-b") == ErrorCode.fenced_instance_id


def test_the_leader_must_sync_within_the_rebalance_timeout() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    rig.join_new("c")
    rig.join("l2", leader)
    rig.join("f2", follower)
    joined = rig.take("c")
    assert isinstance(joined, messages.JoinGroupResult)
    assert rig.sync("sc", joined.member_id, generation + 1) is None
    assert rig.sync("sf", follower, generation + 1) is None
    rig.tick(REBALANCE)  # the leader never sends its assignment: it is removed
    assert leader not in rig.coordinator.groups["g"].members
    for token in ("sc", "sf"):  # the others are told to rejoin
        answer = rig.take(token)
        assert isinstance(answer, messages.SyncGroupResult)
        assert answer.error_code == ErrorCode.rebalance_in_progress
    assert rig.state() is GroupState.PREPARING_REBALANCE


def test_storing_the_assignment_failing_fails_the_sync_retriably() -> None:
    rig = Rig()
    a = rig.join_new("a")
    rig.answers.pop("a")
    rig.store.failing = True
    failed = rig.sync("sa", a, 1, {a: b"A"})
    assert isinstance(failed, messages.SyncGroupResult)
    assert failed.error_code == ErrorCode.coordinator_not_available
    assert rig.state() is not GroupState.STABLE


def test_offsets_commit_fetch_and_member_checks() -> None:
    rig = Rig()

    def commit(generation: int, member: str, *offsets: tuple[str, int, int]) -> list[int]:
        request = messages.OffsetCommit(
            "g", generation, member, None, [messages.PartitionOffset(*o) for o in offsets]
        )
        return rig.coordinator.commit(request, rig.now).error_codes

    # a simple consumer (assign()) commits into a group nobody joined
    assert commit(-1, "", ("t", 0, 5), ("t", 1, 7)) == [NONE, NONE]
    fetched = rig.coordinator.fetch_offsets(
        messages.OffsetFetch([messages.GroupOffsetsQuery("g", [("t", 0), ("t", 2)])])
    )
    assert [(o.partition, o.offset) for o in fetched.groups[0].offsets] == [(0, 5), (2, -1)]
    leader, follower, generation = stable_pair(rig)
    assert commit(generation, leader, ("t", 0, 9)) == [NONE]
    assert commit(generation - 1, leader, ("t", 0, 9)) == [int(ErrorCode.illegal_generation)]
    assert commit(-1, "", ("t", 0, 1)) == [int(ErrorCode.unknown_member_id)]  # group in use
    big = messages.PartitionOffset("t", 3, 1, -1, "x" * 5000)
    request = messages.OffsetCommit("g", generation, leader, None, [big])
    assert rig.coordinator.commit(request, rig.now).error_codes == [
        int(ErrorCode.offset_metadata_too_large)
    ]
    rig.join_new("c")
    rig.join("l2", leader)
    rig.join("f2", follower)  # the join completes: the group is completing its rebalance
    assert commit(generation + 1, leader, ("t", 0, 1)) == [int(ErrorCode.rebalance_in_progress)]
    everything = rig.coordinator.fetch_offsets(
        messages.OffsetFetch([messages.GroupOffsetsQuery("g", None)])
    )
    assert {(o.partition, o.offset) for o in everything.groups[0].offsets} == {(0, 9), (1, 7)}
    assert rig.store.offsets["g"][("t", 0)].offset == 9


def test_groups_and_offsets_survive_a_restart() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    request = messages.OffsetCommit(
        "g", generation, leader, None, [messages.PartitionOffset("t", 0, 42)]
    )
    rig.coordinator.commit(request, rig.now)
    again = Rig()
    again.now = rig.now + 60_000
    again.coordinator.load(rig.store.groups.values(), rig.store.offsets, again.now)
    assert again.state() is GroupState.STABLE
    assert again.heartbeat(follower, generation) == NONE  # no rejoin needed
    synced = again.sync("s", follower, generation)
    assert isinstance(synced, messages.SyncGroupResult) and synced.assignment == b"F"
    fetched = again.coordinator.fetch_offsets(
        messages.OffsetFetch([messages.GroupOffsetsQuery("g", [("t", 0)])])
    )
    assert fetched.groups[0].offsets[0].offset == 42
    again.tick(SESSION)  # the leader never came back: removed after its session
    assert leader not in again.coordinator.groups["g"].members


def test_describe_list_delete() -> None:
    rig = Rig()
    leader, follower, _generation = stable_pair(rig)
    [described] = rig.coordinator.describe(messages.DescribeGroups(["g"])).groups
    assert (described.state, described.protocol, len(described.members)) == ("Stable", "range", 2)
    assert {m.assignment for m in described.members} == {b"L", b"F"}
    [missing] = rig.coordinator.describe(messages.DescribeGroups(["nope"])).groups
    assert missing.state == "Dead"
    listed = rig.coordinator.list_groups(messages.ListGroups(states=["stable"])).groups
    assert [(g.group_id, g.state) for g in listed] == [("g", "Stable")]
    assert rig.coordinator.list_groups(messages.ListGroups(states=["Empty"])).groups == []
    deleted = rig.coordinator.delete(messages.DeleteGroups(["g", "nope"]))
    assert deleted.results == [
        ("g", int(ErrorCode.non_empty_group)),
        ("nope", int(ErrorCode.group_id_not_found)),
    ]
    for member in (leader, follower):
        rig.coordinator.leave(messages.LeaveGroup("g", [messages.LeavingMember(member)]), rig.now)
    assert rig.coordinator.delete(messages.DeleteGroups(["g"])).results == [("g", NONE)]
    assert "g" not in rig.store.groups


@pytest.mark.parametrize("timeout", [1, 10_000_000])
def test_session_timeout_outside_the_bounds_is_refused(timeout: int) -> None:
    rig = Rig()
    rig.coordinator.join(
        "t",
        messages.JoinGroup(
            "g", "", None, "c", "h", timeout, REBALANCE, "consumer", [("r", b"")], True
        ),
        rig.now,
    )
    answer = rig.answers["t"]
    assert isinstance(answer, messages.JoinGroupResult)
    assert answer.error_code == ErrorCode.invalid_session_timeout


NOT_COORDINATOR = int(ErrorCode.not_coordinator)


def test_every_request_for_a_group_coordinated_elsewhere_is_not_coordinator() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    rig.ours = {"other"}  # "g" is another broker's now
    assert rig.join("j") == messages.JoinGroupResult(NOT_COORDINATOR)
    assert rig.sync("s", follower, generation) == messages.SyncGroupResult(NOT_COORDINATOR)
    assert rig.heartbeat(leader, generation) == NOT_COORDINATOR
    left = rig.coordinator.leave(
        messages.LeaveGroup("g", [messages.LeavingMember(follower)]), rig.now
    )
    assert (left.error_code, left.members) == (NOT_COORDINATOR, [(follower, None, NOT_COORDINATOR)])
    commit = messages.OffsetCommit(
        "g", generation, leader, None, [messages.PartitionOffset("t", 0, 5)] * 2
    )
    assert rig.coordinator.commit(commit, rig.now).error_codes == [NOT_COORDINATOR] * 2
    fetched = rig.coordinator.fetch_offsets(
        messages.OffsetFetch(
            [messages.GroupOffsetsQuery("g", None), messages.GroupOffsetsQuery("other", None)]
        )
    )
    assert [(g.group_id, g.error_code) for g in fetched.groups] == [
        ("g", NOT_COORDINATOR),
        ("other", NONE),
    ]
    [described] = rig.coordinator.describe(messages.DescribeGroups(["g"])).groups
    assert described.error_code == NOT_COORDINATOR
    assert rig.coordinator.list_groups(messages.ListGroups()).groups == []
    assert rig.coordinator.delete(messages.DeleteGroups(["g"])).results == [("g", NOT_COORDINATOR)]
    deleted = rig.coordinator.delete_offsets(
        messages.OffsetDelete("g", [("t", 0)]), lambda _: set()
    )
    assert deleted.error_code == NOT_COORDINATOR
    assert "t" not in {t for t, _ in rig.store.offsets.get("g", {})}  # nothing written


def test_forgotten_groups_answer_their_waiting_members_not_coordinator() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    c = rig.join_new("c")  # a rebalance: c waits in JoinGroup
    assert rig.sync("sf", follower, generation) is not None  # answered: rebalance in progress
    rig.join("l2", leader)  # the leader rejoined and waits for the follower
    rig.coordinator.forget(["g", "unknown"])
    assert rig.take("c") == messages.JoinGroupResult(NOT_COORDINATOR, member_id=c)
    joined = rig.take("l2")
    assert isinstance(joined, messages.JoinGroupResult)
    assert joined.error_code == NOT_COORDINATOR
    assert "g" not in rig.coordinator.groups
    rig.tick(REBALANCE)  # nothing left to time out or answer twice
    assert rig.answers == {}


def test_a_fenced_store_refuses_every_write_with_not_coordinator() -> None:
    rig = Rig()
    leader, follower, generation = stable_pair(rig)
    saved = rig.store.groups["g"]
    rig.store.fenced = True
    commit = messages.OffsetCommit(
        "g", generation, leader, None, [messages.PartitionOffset("t", 0, 5)]
    )
    assert rig.coordinator.commit(commit, rig.now).error_codes == [NOT_COORDINATOR]
    fetched = rig.coordinator.fetch_offsets(
        messages.OffsetFetch([messages.GroupOffsetsQuery("g", [("t", 0)])])
    )
    assert fetched.groups[0].offsets[0].offset == -1  # not acknowledged, not remembered
    # a new generation cannot complete: the leader's assignment is not stored
    rig.join("l2", leader)
    joined = rig.join("f2", follower)
    assert isinstance(joined, messages.JoinGroupResult)
    assert rig.sync("sf", follower, joined.generation_id) is None
    failed = rig.sync("sl", leader, joined.generation_id, {leader: b"L2", follower: b"F2"})
    assert failed == messages.SyncGroupResult(NOT_COORDINATOR)
    assert rig.take("sf") == messages.SyncGroupResult(NOT_COORDINATOR)
    assert rig.store.groups["g"] == saved
