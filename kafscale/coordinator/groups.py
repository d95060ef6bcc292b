"""Consumer groups, the classic protocol: Kafka's group state machine, without I/O or a clock.

``ClassicGroups`` is the machine: each request or tick changes its groups in memory and returns
``Instructions`` -- answers and store writes, with what follows each write's success or failure
(``group_model.Write``). ``group_coordinator.GroupCoordinator`` is the one entry the service
calls: it carries the instructions out on a ``GroupStore`` and a ``send``, and does the one thing
the machine cannot: asking the consumer (KIP-848) groups of the same id to make way for a classic
JoinGroup.

The machine holds only the groups this broker coordinates (``coordinates(group_id)``, the owner
of the group's ``__consumer_offsets`` partition: docs/design/scale-out.md, section 7); a request
for any other group is answered NOT_COORDINATOR, and so is one whose write the store fenced
(``NotCoordinator``: another broker took the group over). Its parts: ``group_model`` (groups,
members, instructions, the store contract), ``group_membership`` (rebalances, SyncGroup,
heartbeats, leaving, expiry), JoinGroup here, ``group_offsets`` and ``group_admin``.

Every call takes the time (``now``, ms) as an argument; deadlines fire in ``tick(now)``. Every
request carries a ``token``, and its answer is a ``Reply`` to it -- at once, or later: JoinGroup
waits for the whole group, SyncGroup for the leader. What must survive a restart or a move to
another coordinator is written (``Write``) before the answer that depends on it is sent.

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
from kafscale.coordinator.group_membership import Membership, dismiss, join_result
from kafscale.coordinator.group_model import (
    Group,
    GroupState,
    Instructions,
    Member,
    Reply,
    SaveGroup,
    Token,
    TopicPartition,
    Write,
    choose_protocol,
    restore,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import JoinGroupResult
from kafscale.metadata.records import GroupRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode


class ClassicGroups(Membership):
    """The machine: ``ClassicGroups(settings, coordinates, consumer)``, see ``Membership``."""

    def load(
        self,
        records: Iterable[GroupRecord],
        offsets: dict[str, dict[TopicPartition, OffsetRecord]],
        now: int,
    ) -> Instructions:
        """Take over groups from the store (replacing any in memory of the same ids)."""
        loaded = restore(records, offsets, now)
        out = self.forget(loaded)
        self.groups.update(loaded)
        return out

    # -- JoinGroup -----------------------------------------------------------------------------

    def join_error(self, request: messages.JoinGroup) -> ErrorCode | None:
        """Why the request cannot join (before the group is looked at), or None."""
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

    def join(self, token: Token, request: messages.JoinGroup, now: int) -> Instructions:
        """JoinGroup of a group that is not a consumer group (the caller saw to that)."""
        error = self.join_error(request)
        if error is not None:
            return join_failure(token, request, error)
        group = self.groups.get(request.group_id)
        if group is None:
            if request.member_id:
                return join_failure(token, request, ErrorCode.unknown_member_id)
            group = self.groups[request.group_id] = Group(request.group_id)
        if group.state is GroupState.DEAD:
            return join_failure(token, request, ErrorCode.coordinator_not_available)
        if not group.supports(request.protocol_type, request.protocols):
            return join_failure(token, request, ErrorCode.inconsistent_group_protocol)
        if not request.member_id:
            return self._join_new(group, token, request, now)
        return self._join_known(group, token, request, now)

    def _join_new(
        self, group: Group, token: Token, request: messages.JoinGroup, now: int
    ) -> Instructions:
        member_id = f"{request.client_id}-{uuid.uuid4()}"
        instance = request.group_instance_id
        if instance and instance in group.static:
            return self._replace_static(group, token, request, member_id, now)
        if request.require_known_member_id and not instance:
            group.pending[member_id] = now + request.session_timeout_ms
            required = JoinGroupResult(int(ErrorCode.member_id_required), member_id=member_id)
            return [Reply(token, required)]
        return self._add_member(group, _new_member(token, request, member_id), now)

    def _join_known(
        self, group: Group, token: Token, request: messages.JoinGroup, now: int
    ) -> Instructions:
        member_id = request.member_id
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add_member(group, _new_member(token, request, member_id), now)
        instance = request.group_instance_id
        if instance and group.static.get(instance) not in (None, member_id):
            return join_failure(token, request, ErrorCode.fenced_instance_id)
        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            return join_failure(token, request, ErrorCode.unknown_member_id)
        same = member.protocols == list(request.protocols)
        if group.state is GroupState.PREPARING_REBALANCE:
            out = _update_member(member, token, request)
            return out + self._maybe_complete_join(group, now)
        if group.state is GroupState.COMPLETING_REBALANCE and same:
            return [Reply(token, join_result(group, member))]  # it lost our first answer
        if group.state is GroupState.STABLE and same and member_id != group.leader:
            return [Reply(token, join_result(group, member))]
        out = _update_member(member, token, request)
        return out + self._prepare_rebalance(group, now, f"member {member_id} rejoined")

    def _add_member(self, group: Group, member: Member, now: int) -> Instructions:
        if not group.members:
            group.protocol_type = member.protocol_type
        group.members[member.member_id] = member
        if member.group_instance_id:
            group.static[member.group_instance_id] = member.member_id
        if group.leader is None:
            group.leader = member.member_id
        if group.state is not GroupState.PREPARING_REBALANCE:
            return self._prepare_rebalance(group, now, f"member {member.member_id} joined")
        if group.initial_delay:  # more members arrive: wait a little longer for the rest
            limit = group.join_started_ms + group.rebalance_timeout_ms()
            group.join_deadline_ms = min(
                now + self.settings.initial_rebalance_delay_ms, max(limit, now)
            )
        return self._maybe_complete_join(group, now)

    def _replace_static(
        self, group: Group, token: Token, request: messages.JoinGroup, member_id: str, now: int
    ) -> Instructions:
        """A known instance joins with a new member id: it takes over the old member. In a
        stable group whose protocol it would not change, without a rebalance: once the group
        with the new member id is stored (else the old member stays and the join fails)."""
        instance = request.group_instance_id
        assert instance is not None
        old = group.members[group.static[instance]]
        member = _new_member(None, request, member_id)
        member.assignment = old.assignment
        others = [m for m in group.members.values() if m is not old]

        def take_over() -> Instructions:
            del group.members[old.member_id]
            out = dismiss(old, ErrorCode.fenced_instance_id)
            group.members[member_id] = member
            group.static[instance] = member_id
            if group.leader == old.member_id:
                group.leader = member_id
            return out

        unchanged = group.protocol is not None and group.protocol == choose_protocol(
            [*others, member]
        )
        if group.state is not GroupState.STABLE or not unchanged:
            out = take_over()
            member.join_token = token
            if group.state is GroupState.PREPARING_REBALANCE:
                return out + self._maybe_complete_join(group, now)
            return out + self._prepare_rebalance(group, now, f"static member {instance} rejoined")
        leader = member_id if group.leader == old.member_id else group.leader
        proposed = GroupRecord(
            group.group_id,
            group.protocol_type or "",
            group.protocol,
            group.generation,
            leader,
            [m.record() for m in others] + [member.record()],
        )

        def stored() -> Instructions:
            out = take_over()
            member.expires_ms = now + member.session_timeout_ms
            return [*out, Reply(token, join_result(group, member, member_id == group.leader))]

        return [
            Write(
                group.group_id,
                "group",
                SaveGroup(proposed),
                stored,
                lambda code: join_failure(token, request, code),
            )
        ]

    # -- offsets and administration (group_offsets, group_admin) -------------------------------

    def commit(self, token: Token, request: messages.OffsetCommit, now: int) -> Instructions:
        return group_offsets.commit(self, token, request, now)

    def fetch_offsets(self, token: Token, request: messages.OffsetFetch) -> Instructions:
        return [Reply(token, group_offsets.fetch(self, request))]

    def delete_offsets(
        self,
        token: Token,
        request: messages.OffsetDelete,
        subscribed: Callable[[Group], set[str]],
    ) -> Instructions:
        return group_offsets.delete(self, token, request, subscribed)

    def describe(self, token: Token, request: messages.DescribeGroups) -> Instructions:
        return [Reply(token, group_admin.describe(self, request))]

    def list_groups(self, token: Token, request: messages.ListGroups) -> Instructions:
        return [Reply(token, group_admin.list_groups(self, request))]

    def delete(
        self, token: Token, request: messages.DeleteGroups, consumer: dict[str, ErrorCode | None]
    ) -> Instructions:
        return group_admin.delete(self, token, request, consumer)


def _new_member(token: Token | None, request: messages.JoinGroup, member_id: str) -> Member:
    return Member(
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


def _update_member(member: Member, token: Token, request: messages.JoinGroup) -> Instructions:
    out: Instructions = []
    if member.join_token is not None and member.join_token is not token:
        # a second JoinGroup from the same member: the first one will never be read
        out.append(Reply(member.join_token, JoinGroupResult(int(ErrorCode.unknown_member_id))))
    member.protocols = list(request.protocols)
    member.session_timeout_ms = request.session_timeout_ms
    member.rebalance_timeout_ms = request.rebalance_timeout_ms
    member.client_id, member.client_host = request.client_id, request.client_host
    member.join_token = token
    return out


def join_failure(token: Token, request: messages.JoinGroup, error: ErrorCode) -> Instructions:
    return [Reply(token, JoinGroupResult(int(error), member_id=request.member_id))]
