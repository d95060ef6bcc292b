"""Consumer groups, the classic protocol: Kafka's group state machine, without I/O or a clock.

``GroupCoordinator`` is the one entry: every group request goes through its methods. It holds
only the groups this broker coordinates (``coordinates(group_id)``, the owner of the group's
``__consumer_offsets`` partition: docs/design/scale-out.md, section 7); a request for any other
group is answered NOT_COORDINATOR, and so is one whose write the store fenced (``NotCoordinator``:
another broker took the group over). Its parts: ``group_model`` (groups, members, the store
contract), ``group_membership`` (rebalances, SyncGroup, heartbeats, leaving, expiry), JoinGroup
here, ``group_offsets`` and ``group_admin``.

Every call takes the time (``now``, ms) as an argument; deadlines fire in ``tick(now)``. Requests
that the protocol answers later (JoinGroup waits for the whole group, SyncGroup for the leader)
carry a ``token``; their answers leave through ``send(token, message)``. What must survive a
restart or a move to another coordinator goes through ``GroupStore`` before the answer that
depends on it is sent.

States (as Kafka's ``ClassicGroupState``)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable --join, leave, expiry--> PreparingRebalance
    any --last member gone--> Empty;  DeleteGroups: Empty --> Dead (forgotten)

Decisions, each as Kafka's broker makes them (GroupCoordinator / ClassicGroup):

- A new dynamic member of JoinGroup v4+ first gets MEMBER_ID_REQUIRED with its new id, and is
  pending until it joins again with it (or its session timeout passes).
- The first rebalance of an empty group waits ``initial_rebalance_delay_ms`` for more members
  (extended per new member, up to the rebalance timeout); later ones complete as soon as every
  member has rejoined, or at the largest rebalance timeout, when the members that did not rejoin
  are removed (static members stay: only their session timeout removes them).
- The protocol (assignor) is chosen among those every member supports, by the members' votes for
  their most preferred one. The leader gets every member's metadata and the assignment it sends
  back is what each member receives: the broker never computes or changes an assignment.
- A static member (``group.instance.id``) that rejoins with a new member id while the group is
  stable, and whose protocols would not change the group's choice, takes its old place and
  assignment without a rebalance (the leader is told to skip assigning, KIP-814); an old member id
  of that instance is fenced (FENCED_INSTANCE_ID).
- A member keeps its session while it waits in JoinGroup or SyncGroup; otherwise each heartbeat
  (or join, sync, commit) extends it by its session timeout. Members that do not send SyncGroup
  within the rebalance timeout after the join phase are removed and the group rebalances.
- Groups loaded from the store (this broker became their coordinator, or restarted) carry on:
  members keep their generation and assignment and get a fresh session to prove themselves alive.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from kafscale.coordinator import group_admin, group_offsets
from kafscale.coordinator.group_membership import Membership
from kafscale.coordinator.group_model import (
    Group,
    GroupSettings,
    GroupState,
    GroupStore,
    Member,
    NotCoordinator,
    Send,
    Token,
    TopicPartition,
    restore,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import JoinGroupResult
from kafscale.metadata.records import GroupRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode

__all__ = [
    "Group",
    "GroupCoordinator",
    "GroupSettings",
    "GroupState",
    "GroupStore",
    "NotCoordinator",
    "Send",
    "Token",
]


class GroupCoordinator(Membership):
    """``GroupCoordinator(settings, store, send, coordinates)``: see ``Membership``."""

    def load(
        self,
        records: Iterable[GroupRecord],
        offsets: dict[str, dict[TopicPartition, OffsetRecord]],
        now: int,
    ) -> None:
        """Take over groups from the store (replacing any in memory of the same ids)."""
        loaded = restore(records, offsets, now)
        self.forget(loaded)
        self.groups.update(loaded)

    # -- JoinGroup -----------------------------------------------------------------------------

    def join(self, token: Token, request: messages.JoinGroup, now: int) -> None:
        error = self._join_error(request)
        if error is not None:
            self.send(token, JoinGroupResult(int(error), member_id=request.member_id))
            return
        if self.consumer.is_active(request.group_id):
            self._join_fail(token, request, ErrorCode.inconsistent_group_protocol)
            return
        dropped = self.consumer.drop_empty(request.group_id)
        if dropped is not None:
            self._join_fail(token, request, dropped)
            return
        group = self.groups.get(request.group_id)
        if group is None:
            if request.member_id:
                self._join_fail(token, request, ErrorCode.unknown_member_id)
                return
            group = self.groups[request.group_id] = Group(request.group_id)
        if group.state is GroupState.DEAD:
            self._join_fail(token, request, ErrorCode.coordinator_not_available)
        elif not group.supports(request.protocol_type, request.protocols):
            self._join_fail(token, request, ErrorCode.inconsistent_group_protocol)
        elif not request.member_id:
            self._join_new(group, token, request, now)
        else:
            self._join_known(group, token, request, now)

    def _join_error(self, request: messages.JoinGroup) -> ErrorCode | None:
        if not request.group_id:
            return ErrorCode.invalid_group_id
        if not self.coordinates(request.group_id):
            return ErrorCode.not_coordinator
        timeout = request.session_timeout_ms
        if (
            not self.settings.min_session_timeout_ms
            <= timeout
            <= self.settings.max_session_timeout_ms
        ):
            return ErrorCode.invalid_session_timeout
        return None

    def _join_fail(self, token: Token, request: messages.JoinGroup, error: ErrorCode) -> None:
        self.send(token, JoinGroupResult(int(error), member_id=request.member_id))

    def _join_new(self, group: Group, token: Token, request: messages.JoinGroup, now: int) -> None:
        member_id = f"{request.client_id}-{uuid.uuid4()}"
        instance = request.group_instance_id
        if instance and instance in group.static:
            self._replace_static(group, token, request, member_id, now)
        elif request.require_known_member_id and not instance:
            group.pending[member_id] = now + request.session_timeout_ms
            self.send(
                token, JoinGroupResult(int(ErrorCode.member_id_required), member_id=member_id)
            )
        else:
            self._add_member(group, token, request, member_id, now)

    def _join_known(
        self, group: Group, token: Token, request: messages.JoinGroup, now: int
    ) -> None:
        member_id = request.member_id
        if member_id in group.pending:
            del group.pending[member_id]
            self._add_member(group, token, request, member_id, now)
            return
        instance = request.group_instance_id
        if instance and group.static.get(instance) not in (None, member_id):
            self._join_fail(token, request, ErrorCode.fenced_instance_id)
            return
        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            self._join_fail(token, request, ErrorCode.unknown_member_id)
            return
        same = member.protocols == list(request.protocols)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member(group, member, token, request, now)
            self._maybe_complete_join(group, now)
        elif group.state is GroupState.COMPLETING_REBALANCE and same:
            # the member lost our first answer: give it again
            self.send(token, self._join_result(group, member))
        elif group.state is GroupState.STABLE and same and member_id != group.leader:
            self.send(token, self._join_result(group, member))
        else:
            self._update_member(group, member, token, request, now)
            self._prepare_rebalance(group, now, f"member {member_id} rejoined")

    def _add_member(
        self, group: Group, token: Token, request: messages.JoinGroup, member_id: str, now: int
    ) -> None:
        member = Member(
            member_id,
            request.group_instance_id,
            request.client_id,
            request.client_host,
            request.session_timeout_ms,
            request.rebalance_timeout_ms,
            request.protocol_type,
            list(request.protocols),
            join_token=token,
        )
        if not group.members:
            group.protocol_type = request.protocol_type
        group.members[member_id] = member
        if member.group_instance_id:
            group.static[member.group_instance_id] = member_id
        if group.leader is None:
            group.leader = member_id
        if group.state is GroupState.PREPARING_REBALANCE:
            if group.initial_delay:  # more members arrive: wait a little longer for the rest
                limit = group.join_started_ms + group.rebalance_timeout_ms()
                group.join_deadline_ms = min(
                    now + self.settings.initial_rebalance_delay_ms, max(limit, now)
                )
            self._maybe_complete_join(group, now)
        else:
            self._prepare_rebalance(group, now, f"member {member_id} joined")

    def _update_member(
        self, group: Group, member: Member, token: Token, request: messages.JoinGroup, now: int
    ) -> None:
        if member.join_token is not None and member.join_token is not token:
            # a second JoinGroup from the same member: the first one will never be read
            self.send(member.join_token, JoinGroupResult(int(ErrorCode.unknown_member_id)))
        member.protocols = list(request.protocols)
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.client_id, member.client_host = request.client_id, request.client_host
        member.join_token = token

    def _replace_static(
        self, group: Group, token: Token, request: messages.JoinGroup, member_id: str, now: int
    ) -> None:
        """A known instance joins with a new member id: it takes over the old member."""
        assert request.group_instance_id is not None
        old = group.members.pop(group.static[request.group_instance_id])
        self._dismiss(old, ErrorCode.fenced_instance_id)
        member = Member(
            member_id,
            request.group_instance_id,
            request.client_id,
            request.client_host,
            request.session_timeout_ms,
            request.rebalance_timeout_ms,
            request.protocol_type,
            list(request.protocols),
            assignment=old.assignment,
        )
        group.members[member_id] = member
        group.static[request.group_instance_id] = member_id
        if group.leader == old.member_id:
            group.leader = member_id
        unchanged = group.protocol is not None and group.select_protocol() == group.protocol
        if group.state is GroupState.STABLE and unchanged:
            try:
                self.store.save_group(group.record())
            except Exception as exc:
                error = self.store_failed(group, "group", exc)
                group.members.pop(member_id)
                group.members[old.member_id] = old
                group.static[request.group_instance_id] = old.member_id
                if group.leader == member_id:
                    group.leader = old.member_id
                self._join_fail(token, request, error)
                return
            member.expires_ms = now + member.session_timeout_ms
            leader = member_id == group.leader
            result = self._join_result(group, member)
            self.send(
                token,
                messages.JoinGroupResult(
                    result.error_code,
                    result.generation_id,
                    result.protocol_type,
                    result.protocol_name,
                    result.leader,
                    skip_assignment=leader,
                    member_id=member_id,
                    members=result.members,
                ),
            )
            return
        member.join_token = token
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now)
        else:
            self._prepare_rebalance(
                group, now, f"static member {request.group_instance_id} rejoined"
            )

    # -- offsets and administration ------------------------------------------------------------

    def commit(self, request: messages.OffsetCommit, now: int) -> messages.OffsetCommitResult:
        return group_offsets.commit(self, request, now)

    def fetch_offsets(self, request: messages.OffsetFetch) -> messages.OffsetFetchResult:
        return group_offsets.fetch(self, request)

    def delete_offsets(
        self, request: messages.OffsetDelete, subscribed: Callable[[Group], set[str]]
    ) -> messages.OffsetsDeleted:
        return group_offsets.delete(self, request, subscribed)

    def describe(self, request: messages.DescribeGroups) -> messages.GroupsDescribed:
        return group_admin.describe(self, request)

    def list_groups(self, request: messages.ListGroups) -> messages.GroupsListed:
        return group_admin.list_groups(self, request)

    def delete(self, request: messages.DeleteGroups) -> messages.GroupsDeleted:
        return group_admin.delete(self, request)
