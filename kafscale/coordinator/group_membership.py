"""The group state machine's membership core: rebalances (the join phase completing, SyncGroup),
heartbeats, members leaving or expiring, and forgetting groups this broker stops coordinating.
JoinGroup and the requests without a membership side build on it in ``groups``.

Invariants: a member waits in at most one JoinGroup and one SyncGroup (``join_token``,
``sync_token``), and every waiting request is answered exactly once -- with its result, or an
error when the member is removed, the rebalance restarts or the group is forgotten. A rebalance's
assignment is stored before any member receives it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kafscale.coordinator.consumer_groups.coordinator import ConsumerGroups
from kafscale.coordinator.consumer_groups.model import ConsumerSettings
from kafscale.coordinator.group_model import (
    Group,
    GroupSettings,
    GroupState,
    GroupStore,
    Member,
    NotCoordinator,
    Send,
    Token,
    member_error,
    store_error,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import GroupMember, JoinGroupResult
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        settings: GroupSettings,
        store: GroupStore,
        send: Send,
        coordinates: Callable[[str], bool],
        consumer: ConsumerGroups | None = None,
    ) -> None:
        """``coordinates(group_id)``: whether this broker coordinates the group now; requests
        for any other group are answered NOT_COORDINATOR. ``consumer``: the consumer (KIP-848)
        groups of the same ids, which the classic requests must not take for theirs."""
        self.consumer = consumer or ConsumerGroups(
            ConsumerSettings(), store, coordinates, lambda: {}
        )
        self.settings = settings
        self.store = store
        self.send = send
        self.coordinates = coordinates
        self.groups: dict[str, Group] = {}
        self.rebalances = 0  # completed join phases, for metrics

    def forget(self, group_ids: Iterable[str]) -> None:
        """This broker no longer coordinates these groups: their waiting members are answered
        NOT_COORDINATOR (they look the coordinator up again) and nothing of them is kept."""
        group_ids = list(group_ids)
        self.consumer.forget(group_ids)
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is not None:
                for member in group.members.values():
                    self._dismiss(member, ErrorCode.not_coordinator)

    # -- rebalancing ---------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now: int, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._fail_syncs(group, ErrorCode.rebalance_in_progress)
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
        self._maybe_complete_join(group, now)

    def _maybe_complete_join(self, group: Group, now: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        deadline = group.join_deadline_ms
        expired = deadline is not None and now >= deadline
        if expired or (group.all_joined() and not group.initial_delay):
            self._complete_join(group, now)

    def _complete_join(self, group: Group, now: int) -> None:
        for member in [m for m in group.members.values() if m.join_token is None]:
            if member.group_instance_id is None:
                self._remove(group, member, "did not rejoin in time")
        group.pending.clear()
        group.join_deadline_ms = None
        group.initial_delay = False
        group.generation += 1
        self.rebalances += 1
        if not group.members:
            group.protocol = None
            group.leader = None
            group.state = GroupState.EMPTY
            self._save_quietly(group)
            return
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
                self.send(token, self._join_result(group, member))

    def _join_result(self, group: Group, member: Member) -> JoinGroupResult:
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
            member_id=member.member_id,
            members=members,
        )

    # -- SyncGroup -----------------------------------------------------------------------------

    def sync(self, token: Token, request: messages.SyncGroup, now: int) -> None:
        if not self.coordinates(request.group_id):
            self.send(token, messages.SyncGroupResult(int(ErrorCode.not_coordinator)))
            return
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
            self.send(token, messages.SyncGroupResult(int(error)))
            return
        assert group is not None
        member = group.members[request.member_id]
        if group.state is GroupState.STABLE:
            member.expires_ms = now + member.session_timeout_ms
            self.send(token, self._sync_result(group, member))
            return
        member.sync_token = token
        if request.member_id != group.leader:
            return
        assignments = dict(request.assignments)
        for each in group.members.values():
            each.assignment = assignments.get(each.member_id, b"")
        try:
            self.store.save_group(group.record())
        except Exception as exc:
            self._fail_syncs(group, self.store_failed(group, "assignment", exc))
            if not isinstance(exc, NotCoordinator):  # else the group is forgotten anyway
                self._prepare_rebalance(group, now, "storing the assignment failed")
            return
        group.state = GroupState.STABLE
        group.sync_deadline_ms = None
        for each in group.members.values():
            each.expires_ms = now + each.session_timeout_ms
            if each.sync_token is not None:
                waiting, each.sync_token = each.sync_token, None
                self.send(waiting, self._sync_result(group, each))

    def _sync_result(self, group: Group, member: Member) -> messages.SyncGroupResult:
        return messages.SyncGroupResult(
            int(ErrorCode.none), group.protocol_type, group.protocol, member.assignment
        )

    def _fail_syncs(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            if member.sync_token is not None:
                waiting, member.sync_token = member.sync_token, None
                self.send(waiting, messages.SyncGroupResult(int(error)))

    # -- Heartbeat and LeaveGroup --------------------------------------------------------------

    def heartbeat(self, request: messages.Heartbeat, now: int) -> messages.GroupError:
        if not self.coordinates(request.group_id):
            return messages.GroupError(int(ErrorCode.not_coordinator))
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
        return messages.GroupError(int(error or ErrorCode.none))

    def leave(self, request: messages.LeaveGroup, now: int) -> messages.LeaveGroupResult:
        if not self.coordinates(request.group_id):
            code = int(ErrorCode.not_coordinator)
            return messages.LeaveGroupResult(
                code, [(m.member_id, m.group_instance_id, code) for m in request.members]
            )
        group = self.groups.get(request.group_id)
        results: list[tuple[str, str | None, int]] = []
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
                self._remove(group, group.members[member_id], leaving.reason or "left the group")
            results.append((member_id, leaving.group_instance_id, int(error)))
        if group is not None:
            self._after_removal(group, now)
        return messages.LeaveGroupResult(int(ErrorCode.none), results)

    # -- members leaving -----------------------------------------------------------------------

    def _remove(self, group: Group, member: Member, reason: str) -> None:
        del group.members[member.member_id]
        if (
            member.group_instance_id
            and group.static.get(member.group_instance_id) == member.member_id
        ):
            del group.static[member.group_instance_id]
        self._dismiss(member, ErrorCode.unknown_member_id)
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)
        log.info(
            "member removed",
            extra={"group": group.group_id, "member": member.member_id, "reason": reason},
        )

    def _dismiss(self, member: Member, error: ErrorCode) -> None:
        """Answer whatever the member is waiting in with ``error``."""
        if member.join_token is not None:
            self.send(member.join_token, JoinGroupResult(int(error), member_id=member.member_id))
        if member.sync_token is not None:
            self.send(member.sync_token, messages.SyncGroupResult(int(error)))
        member.join_token = member.sync_token = None

    def _after_removal(self, group: Group, now: int) -> None:
        """Members left or expired: the rest must rebalance (or the group is empty now)."""
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group, now, "a member left")
            else:
                self._to_empty(group)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now)

    def _to_empty(self, group: Group) -> None:
        self._fail_syncs(group, ErrorCode.rebalance_in_progress)
        group.state = GroupState.EMPTY
        group.generation += 1
        group.protocol = None
        group.leader = None
        group.sync_deadline_ms = None
        self._save_quietly(group)

    def _save_quietly(self, group: Group) -> None:
        try:
            self.store.save_group(group.record())
        except Exception as exc:  # the in-memory state stays right; a restart loses the change
            self.store_failed(group, "group", exc)

    def store_failed(self, group: Group, what: str, exc: Exception) -> ErrorCode:
        """Log a failed write of the group's ``what``; the error code to answer with."""
        code = store_error(exc)
        extra = {"group": group.group_id, "what": what, "error": str(exc)}
        if code is ErrorCode.not_coordinator:
            log.warning("not stored: no longer the group's coordinator", extra=extra)
        else:
            log.error("cannot store group", extra=extra)
        return code

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: int) -> None:
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
                self._remove(group, member, "session timed out")
            changed = bool(expired)
            if (
                group.state is GroupState.COMPLETING_REBALANCE
                and group.sync_deadline_ms is not None
                and now >= group.sync_deadline_ms
            ):
                for member in [m for m in group.members.values() if m.sync_token is None]:
                    self._remove(group, member, "did not sync in time")
                changed = True
            if changed:
                self._after_removal(group, now)
            self._maybe_complete_join(group, now)

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
