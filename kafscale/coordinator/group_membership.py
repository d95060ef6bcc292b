"""The classic group state machine's membership core: rebalances (the join phase completing,
SyncGroup), heartbeats, members leaving or expiring, and forgetting groups this broker stops
coordinating. JoinGroup and the requests without a membership side build on it in ``groups``.

Pure: every method changes the groups in memory and returns the ``Instructions`` that carry the
change out -- answers (``Reply``) and store writes (``Write``), in order; the caller
(``groups.GroupCoordinator``) executes them. A change that must be stored before anyone sees it
is made in a write's ``done`` continuation, so a refused write needs no undoing.

Invariants: a member waits in at most one JoinGroup and one SyncGroup (``join_token``,
``sync_token``), and every waiting request is answered exactly once -- with its result, or an
error when the member is removed, the rebalance restarts or the group is forgotten. A rebalance's
assignment is stored before any member receives it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kafscale.coordinator.group_model import (
    ConsumerView,
    Group,
    GroupSettings,
    GroupState,
    Instructions,
    Member,
    Reply,
    SaveGroup,
    Token,
    Write,
    member_error,
    restore,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import GroupMember, JoinGroupResult
from kafscale.metadata.records import GroupRecord
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        settings: GroupSettings,
        coordinates: Callable[[str], bool],
        consumer: ConsumerView,
    ) -> None:
        """``coordinates(group_id)``: whether this broker coordinates the group now; requests
        for any other group are answered NOT_COORDINATOR. ``consumer``: the consumer (KIP-848)
        groups of the same ids, which the classic requests must not take for theirs."""
        self.settings = settings
        self.coordinates = coordinates
        self.consumer = consumer
        self.groups: dict[str, Group] = {}
        self.rebalances = 0  # completed join phases, for metrics

    def forget(self, group_ids: Iterable[str]) -> Instructions:
        """This broker no longer coordinates these groups: their waiting members are answered
        NOT_COORDINATOR (they look the coordinator up again) and nothing of them is kept."""
        out: Instructions = []
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is not None:
                for member in group.members.values():
                    out += dismiss(member, ErrorCode.not_coordinator)
        return out

    def release(self, group_id: str) -> Instructions:
        """The group became a consumer group with its members (an online upgrade, stored by
        the consumer side): only its offsets stay here; a waiting JoinGroup or SyncGroup is
        answered REBALANCE_IN_PROGRESS (the member joins again, now into the consumer group)."""
        group = self.groups.get(group_id)
        if group is None:
            return []
        out: Instructions = []
        for member in group.members.values():
            out += dismiss(member, ErrorCode.rebalance_in_progress)
        released = Group(group_id, generation=group.generation, offsets=group.offsets)
        self.groups[group_id] = released
        return out

    def adopt(self, record: GroupRecord, now: int) -> Instructions:
        """A consumer group became this classic group (an online downgrade, stored by the
        consumer side): its members carry on from their assignments and rejoin at once, as
        after a restart, in a rebalance; the offsets kept here stay."""
        previous = self.groups.get(record.group_id)
        offsets = {record.group_id: previous.offsets} if previous is not None else {}
        group = restore([record], offsets, now)[record.group_id]
        self.groups[record.group_id] = group
        return self._prepare_rebalance(group, now, "downgraded from a consumer group")

    # -- rebalancing ---------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now: int, reason: str) -> Instructions:
        out: Instructions = []
        if group.state is GroupState.COMPLETING_REBALANCE:
            out += _fail_syncs(group, ErrorCode.rebalance_in_progress)
        was_empty = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        group.sync_deadline_ms = None
        group.join_started_ms = now
        group.initial_delay = was_empty and self.settings.initial_rebalance_delay_ms > 0
        if group.initial_delay:
            group.join_deadline_ms = now + min(
                self.settings.initial_rebalance_delay_ms, group.rebalance_timeout_ms()
            )
        else:
            group.join_deadline_ms = now + group.rebalance_timeout_ms()
        log.info(
            "preparing rebalance",
            extra={"group": group.group_id, "generation": group.generation, "reason": reason},
        )
        return out + self._maybe_complete_join(group, now)

    def _maybe_complete_join(self, group: Group, now: int) -> Instructions:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return []
        deadline = group.join_deadline_ms
        expired = deadline is not None and now >= deadline
        if expired or (group.all_joined() and not group.initial_delay):
            return self._complete_join(group, now)
        return []

    def _complete_join(self, group: Group, now: int) -> Instructions:
        out: Instructions = []
        for member in [m for m in group.members.values() if m.join_token is None]:
            if member.group_instance_id is None:
                out += _remove(group, member, "did not rejoin in time")
        group.pending.clear()
        group.join_deadline_ms = None
        group.initial_delay = False
        group.generation += 1
        self.rebalances += 1
        if not group.members:
            group.protocol = None
            group.leader = None
            group.state = GroupState.EMPTY
            return [*out, _save(group)]
        if group.leader not in group.members or group.members[group.leader].join_token is None:
            joined = [m.member_id for m in group.members.values() if m.join_token is not None]
            group.leader = joined[0] if joined else next(iter(group.members))
        group.protocol = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        group.sync_deadline_ms = now + group.rebalance_timeout_ms()
        log.info(
            "group rebalanced",
            extra={
                "group": group.group_id,
                "generation": group.generation,
                "members": len(group.members),
                "protocol": group.protocol,
            },
        )
        for member in group.members.values():
            member.assignment = b""
            member.expires_ms = now + member.session_timeout_ms
            if member.join_token is not None:
                token, member.join_token = member.join_token, None
                out.append(Reply(token, join_result(group, member)))
        return out

    # -- SyncGroup -----------------------------------------------------------------------------

    def sync(self, token: Token, request: messages.SyncGroup, now: int) -> Instructions:
        if not self.coordinates(request.group_id):
            return [Reply(token, messages.SyncGroupResult(int(ErrorCode.not_coordinator)))]
        group = self.groups.get(request.group_id)
        error = member_error(group, request.member_id, request.group_instance_id)
        if error is None:
            assert group is not None
            if request.generation_id != group.generation:
                error = ErrorCode.illegal_generation
            elif (request.protocol_type and request.protocol_type != group.protocol_type) or (
                request.protocol_name and request.protocol_name != group.protocol
            ):
                error = ErrorCode.inconsistent_group_protocol
            elif group.state is GroupState.PREPARING_REBALANCE:
                error = ErrorCode.rebalance_in_progress
        if error is not None:
            return [Reply(token, messages.SyncGroupResult(int(error)))]
        assert group is not None
        member = group.members[request.member_id]
        if group.state is GroupState.STABLE:
            member.expires_ms = now + member.session_timeout_ms
            return [Reply(token, _sync_result(group, member))]
        member.sync_token = token
        if request.member_id != group.leader:
            return []
        assignments = dict(request.assignments)
        for each in group.members.values():
            each.assignment = assignments.get(each.member_id, b"")
        generation = group.generation

        def stored() -> Instructions:
            if group.generation != generation or group.state is not GroupState.COMPLETING_REBALANCE:
                return []  # another step moved the group on meanwhile
            group.state = GroupState.STABLE
            group.sync_deadline_ms = None
            out: Instructions = []
            for each in group.members.values():
                each.expires_ms = now + each.session_timeout_ms
                if each.sync_token is not None:
                    waiting, each.sync_token = each.sync_token, None
                    out.append(Reply(waiting, _sync_result(group, each)))
            return out

        def refused(code: ErrorCode) -> Instructions:
            out = _fail_syncs(group, code)
            if code is not ErrorCode.not_coordinator:  # else the group is forgotten anyway
                out += self._prepare_rebalance(group, now, "storing the assignment failed")
            return out

        return [Write(group.group_id, "assignment", SaveGroup(group.record()), stored, refused)]

    # -- Heartbeat and LeaveGroup --------------------------------------------------------------

    def heartbeat(self, token: Token, request: messages.Heartbeat, now: int) -> Instructions:
        if not self.coordinates(request.group_id):
            return [Reply(token, messages.GroupError(int(ErrorCode.not_coordinator)))]
        group = self.groups.get(request.group_id)
        error = member_error(group, request.member_id, request.group_instance_id)
        if error is None:
            assert group is not None
            member = group.members[request.member_id]
            if request.generation_id != group.generation:
                error = ErrorCode.illegal_generation
            else:
                member.expires_ms = now + member.session_timeout_ms
                if group.state is GroupState.PREPARING_REBALANCE:
                    error = ErrorCode.rebalance_in_progress
        return [Reply(token, messages.GroupError(int(error or ErrorCode.none)))]

    def leave(self, token: Token, request: messages.LeaveGroup, now: int) -> Instructions:
        if not self.coordinates(request.group_id):
            code = int(ErrorCode.not_coordinator)
            results = [(m.member_id, m.group_instance_id, code) for m in request.members]
            return [Reply(token, messages.LeaveGroupResult(code, results))]
        group = self.groups.get(request.group_id)
        out: Instructions = []
        answers: list[tuple[str, str | None, int]] = []
        for leaving in request.members:
            member_id = leaving.member_id
            if group is not None and not member_id and leaving.group_instance_id:
                member_id = group.static.get(leaving.group_instance_id, "")
            error = ErrorCode.none
            if group is None or group.state is GroupState.DEAD:
                error = ErrorCode.unknown_member_id
            elif member_id in group.pending:
                del group.pending[member_id]
            elif (
                leaving.group_instance_id
                and leaving.member_id
                and group.static.get(leaving.group_instance_id) != leaving.member_id
            ):
                error = ErrorCode.fenced_instance_id
            elif member_id not in group.members:
                error = ErrorCode.unknown_member_id
            else:
                reason = leaving.reason or "left the group"
                out += _remove(group, group.members[member_id], reason)
            answers.append((member_id, leaving.group_instance_id, int(error)))
        if group is not None:
            out += self._after_removal(group, now)
        return [Reply(token, messages.LeaveGroupResult(int(ErrorCode.none), answers)), *out]

    # -- members leaving -----------------------------------------------------------------------

    def _after_removal(self, group: Group, now: int) -> Instructions:
        """Members left or expired: the rest must rebalance (or the group is empty now)."""
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                return self._prepare_rebalance(group, now, "a member left")
            return _to_empty(group)
        if group.state is GroupState.PREPARING_REBALANCE:
            return self._maybe_complete_join(group, now)
        return []

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: int) -> Instructions:
        out: Instructions = []
        for group in list(self.groups.values()):
            for member_id, expires in list(group.pending.items()):
                if now >= expires:
                    del group.pending[member_id]
            expired = [
                m
                for m in group.members.values()
                if m.join_token is None and m.sync_token is None and now >= m.expires_ms
            ]
            for member in expired:
                out += _remove(group, member, "session timed out")
            changed = bool(expired)
            if (
                group.state is GroupState.COMPLETING_REBALANCE
                and group.sync_deadline_ms is not None
                and now >= group.sync_deadline_ms
            ):
                for member in [m for m in group.members.values() if m.sync_token is None]:
                    out += _remove(group, member, "did not sync in time")
                changed = True
            if changed:
                out += self._after_removal(group, now)
            out += self._maybe_complete_join(group, now)
        return out

    def next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for group in self.groups.values():
            deadlines.extend(group.pending.values())
            deadlines.extend(
                m.expires_ms
                for m in group.members.values()
                if m.join_token is None and m.sync_token is None
            )
            for deadline in (group.join_deadline_ms, group.sync_deadline_ms):
                if deadline is not None:
                    deadlines.append(deadline)
        return min(deadlines, default=None)


# -- helpers: pure, on one group ---------------------------------------------------------------


def join_result(group: Group, member: Member, skip_assignment: bool = False) -> JoinGroupResult:
    """The JoinGroup answer of ``member`` in the group's current generation: the leader gets
    every member's metadata for the chosen protocol."""
    assert group.protocol is not None
    members = []
    if member.member_id == group.leader:
        protocol = group.protocol
        members = [
            GroupMember(m.member_id, m.group_instance_id, m.metadata(protocol))
            for m in group.members.values()
        ]
    return JoinGroupResult(
        int(ErrorCode.none),
        group.generation,
        group.protocol_type,
        group.protocol,
        group.leader or "",
        skip_assignment=skip_assignment,
        member_id=member.member_id,
        members=members,
    )


def _sync_result(group: Group, member: Member) -> messages.SyncGroupResult:
    return messages.SyncGroupResult(
        int(ErrorCode.none), group.protocol_type, group.protocol, member.assignment
    )


def _fail_syncs(group: Group, error: ErrorCode) -> Instructions:
    out: Instructions = []
    for member in group.members.values():
        if member.sync_token is not None:
            waiting, member.sync_token = member.sync_token, None
            out.append(Reply(waiting, messages.SyncGroupResult(int(error))))
    return out


def _remove(group: Group, member: Member, reason: str) -> Instructions:
    del group.members[member.member_id]
    if member.group_instance_id and group.static.get(member.group_instance_id) == member.member_id:
        del group.static[member.group_instance_id]
    if group.leader == member.member_id:
        group.leader = next(iter(group.members), None)
    log.info(
        "member removed",
        extra={"group": group.group_id, "member": member.member_id, "reason": reason},
    )
    return dismiss(member, ErrorCode.unknown_member_id)


def dismiss(member: Member, error: ErrorCode) -> Instructions:
    """Answer whatever the member is waiting in with ``error``."""
    out: Instructions = []
    if member.join_token is not None:
        result = JoinGroupResult(int(error), member_id=member.member_id)
        out.append(Reply(member.join_token, result))
    if member.sync_token is not None:
        out.append(Reply(member.sync_token, messages.SyncGroupResult(int(error))))
    member.join_token = member.sync_token = None
    return out


def _to_empty(group: Group) -> Instructions:
    out = _fail_syncs(group, ErrorCode.rebalance_in_progress)
    group.state = GroupState.EMPTY
    group.generation += 1
    group.protocol = None
    group.leader = None
    group.sync_deadline_ms = None
    return [*out, _save(group)]


def _save(group: Group) -> Write:
    """Store the group as it is now. If the store refuses, the memory stays right (the answers
    do not depend on it) and a restart or a new coordinator loses the change."""
    return Write(group.group_id, "group", SaveGroup(group.record()))
