"""Consumer groups, the classic protocol: Kafka's group state machine, without I/O or a clock.

Every call takes the time (``now``, ms) as an argument; deadlines fire in ``tick(now)``. Requests
that the protocol answers later (JoinGroup waits for the whole group, SyncGroup for the leader)
carry a ``token``; their answers leave through ``send(token, message)``. What must survive a
restart goes through ``GroupStore`` before the answer that depends on it is sent.

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
- OffsetCommit with generation -1 from outside any member is accepted only while the group is empty
  (simple consumers using assign(), and admin tools); otherwise member and generation must match,
  and a group completing its rebalance answers REBALANCE_IN_PROGRESS.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafscale.ipc import messages
from kafscale.ipc.messages import GroupMember, JoinGroupResult, PartitionOffset
from kafscale.metadata.records import GroupRecord, MemberRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

Token = Any  # what the caller needs to route a late answer (the ZeroMQ request)
Send = Callable[[Token, messages.Message], None]
TopicPartition = tuple[str, int]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupStore(Protocol):
    """Where groups and offsets persist; raises on failure (nothing was written then)."""

    def save_group(self, record: GroupRecord) -> None: ...

    def delete_group(self, group_id: str, partitions: Iterable[TopicPartition]) -> None: ...

    def save_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None: ...

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class GroupSettings:
    min_session_timeout_ms: int = 6_000  # Kafka's group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_metadata_bytes: int = 4096  # offset.metadata.max.bytes


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_token: Token | None = None  # waiting in JoinGroup
    sync_token: Token | None = None  # waiting in SyncGroup
    expires_ms: int = 0  # session deadline, while not waiting

    def metadata(self, protocol: str) -> bytes:
        return next(data for name, data in self.protocols if name == protocol)

    def record(self) -> MemberRecord:
        return MemberRecord(
            self.member_id,
            self.group_instance_id,
            self.client_id,
            self.client_host,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            self.protocols,
            self.assignment,
        )


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending: dict[str, int] = field(
        default_factory=dict
    )  # member id -> expiry (MEMBER_ID_REQUIRED)
    join_deadline_ms: int | None = None
    join_started_ms: int = 0
    initial_delay: bool = False
    sync_deadline_ms: int | None = None
    offsets: dict[TopicPartition, OffsetRecord] = field(default_factory=dict)

    def record(self) -> GroupRecord:
        return GroupRecord(
            self.group_id,
            self.protocol_type or "",
            self.protocol,
            self.generation,
            self.leader,
            [member.record() for member in self.members.values()],
        )

    def candidates(self) -> set[str]:
        """Protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        candidates = self.candidates()
        votes: Counter[str] = Counter()
        for member in self.members.values():
            votes[next(name for name, _ in member.protocols if name in candidates)] += 1
        return max(votes, key=lambda name: votes[name])  # ties: the first member's preference

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidates())

    def all_joined(self) -> bool:
        return not self.pending and all(m.join_token is not None for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)


class GroupCoordinator:
    def __init__(self, settings: GroupSettings, store: GroupStore, send: Send) -> None:
        self.settings = settings
        self.store = store
        self.send = send
        self.groups: dict[str, Group] = {}
        self.rebalances = 0  # completed join phases, for metrics

    # -- loading -------------------------------------------------------------------------------

    def load(
        self,
        records: Iterable[GroupRecord],
        offsets: dict[str, dict[TopicPartition, OffsetRecord]],
        now: int,
    ) -> None:
        """Restore groups after a restart: members carry on in their generation (stable), each
        with a fresh session to prove itself alive."""
        for record in records:
            group = Group(
                record.group_id,
                GroupState.STABLE if record.members else GroupState.EMPTY,
                record.generation,
                record.protocol_type or None,
                record.protocol,
                record.leader,
            )
            for saved in record.members:
                member = Member(
                    saved.member_id,
                    saved.group_instance_id,
                    saved.client_id,
                    saved.client_host,
                    saved.session_timeout_ms,
                    saved.rebalance_timeout_ms,
                    record.protocol_type,
                    list(saved.protocols),
                    saved.assignment,
                    expires_ms=now + saved.session_timeout_ms,
                )
                group.members[member.member_id] = member
                if member.group_instance_id:
                    group.static[member.group_instance_id] = member.member_id
            self.groups[record.group_id] = group
        for group_id, committed in offsets.items():
            self.groups.setdefault(group_id, Group(group_id)).offsets.update(committed)

    # -- JoinGroup -----------------------------------------------------------------------------

    def join(self, token: Token, request: messages.JoinGroup, now: int) -> None:
        error = self._join_error(request)
        if error is not None:
            self.send(token, JoinGroupResult(int(error), member_id=request.member_id))
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
                log.error("cannot store group", extra={"group": group.group_id, "error": str(exc)})
                group.members.pop(member_id)
                group.members[old.member_id] = old
                group.static[request.group_instance_id] = old.member_id
                if group.leader == member_id:
                    group.leader = old.member_id
                self._join_fail(token, request, ErrorCode.coordinator_not_available)
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

    # -- SyncGroup -----------------------------------------------------------------------------

    def sync(self, token: Token, request: messages.SyncGroup, now: int) -> None:
        group = self.groups.get(request.group_id)
        error = self._member_error(group, request.member_id, request.group_instance_id)
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
            log.error(
                "cannot store group assignment", extra={"group": group.group_id, "error": str(exc)}
            )
            self._fail_syncs(group, ErrorCode.coordinator_not_available)
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
        group = self.groups.get(request.group_id)
        error = self._member_error(group, request.member_id, request.group_instance_id)
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

    def _member_error(
        self, group: Group | None, member_id: str, instance_id: str | None
    ) -> ErrorCode | None:
        if group is None or group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if instance_id and group.static.get(instance_id) not in (None, member_id):
            return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return None

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
            log.error("cannot store group", extra={"group": group.group_id, "error": str(exc)})

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

    # -- offsets -------------------------------------------------------------------------------

    def commit(self, request: messages.OffsetCommit, now: int) -> messages.OffsetCommitResult:
        group = self.groups.get(request.group_id)
        error: ErrorCode | None = None
        simple = request.generation_id < 0
        if not request.group_id:
            error = ErrorCode.invalid_group_id
        elif group is not None and group.state is GroupState.DEAD:
            error = ErrorCode.coordinator_not_available
        elif simple and (group is None or group.state is GroupState.EMPTY):
            pass
        elif group is None:
            error = ErrorCode.illegal_generation
        elif group.state is GroupState.COMPLETING_REBALANCE:
            error = ErrorCode.rebalance_in_progress
        else:
            error = self._member_error(group, request.member_id, request.group_instance_id)
            if error is None and request.generation_id != group.generation:
                error = ErrorCode.illegal_generation
        if error is not None:
            return messages.OffsetCommitResult([int(error)] * len(request.offsets))
        if group is None:
            group = self.groups[request.group_id] = Group(request.group_id)
        if request.member_id in group.members:
            member = group.members[request.member_id]
            member.expires_ms = max(member.expires_ms, now + member.session_timeout_ms)
        codes: list[int] = []
        accepted: dict[TopicPartition, OffsetRecord] = {}
        for offset in request.offsets:
            metadata = offset.metadata or ""
            if offset.error_code:
                codes.append(offset.error_code)
            elif len(metadata.encode()) > self.settings.max_metadata_bytes:
                codes.append(int(ErrorCode.offset_metadata_too_large))
            else:
                accepted[(offset.topic, offset.partition)] = OffsetRecord(
                    offset.offset, offset.leader_epoch, metadata, now
                )
                codes.append(int(ErrorCode.none))
        if accepted:
            try:
                self.store.save_offsets(group.group_id, accepted)
            except Exception as exc:
                log.error(
                    "cannot store offsets", extra={"group": group.group_id, "error": str(exc)}
                )
                return messages.OffsetCommitResult(
                    [c or int(ErrorCode.coordinator_not_available) for c in codes]
                )
            group.offsets.update(accepted)
        return messages.OffsetCommitResult(codes)

    def fetch_offsets(self, request: messages.OffsetFetch) -> messages.OffsetFetchResult:
        results = []
        for query in request.groups:
            group = self.groups.get(query.group_id)
            committed = group.offsets if group is not None else {}
            wanted = query.partitions if query.partitions is not None else sorted(committed)
            offsets = []
            for topic, partition in wanted:
                saved = committed.get((topic, partition))
                offsets.append(
                    PartitionOffset(topic, partition)
                    if saved is None
                    else PartitionOffset(
                        topic, partition, saved.offset, saved.leader_epoch, saved.metadata
                    )
                )
            results.append(messages.GroupOffsets(query.group_id, int(ErrorCode.none), offsets))
        return messages.OffsetFetchResult(results)

    # -- administration ------------------------------------------------------------------------

    def describe(self, request: messages.DescribeGroups) -> messages.GroupsDescribed:
        described = []
        for group_id in request.group_ids:
            group = self.groups.get(group_id)
            if group is None:
                described.append(
                    messages.GroupDescription(group_id, 0, GroupState.DEAD.value, "", "", [])
                )
                continue
            stable = group.state is GroupState.STABLE and group.protocol is not None
            members = [
                messages.MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(group.protocol) if stable and group.protocol else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            ]
            described.append(
                messages.GroupDescription(
                    group_id,
                    0,
                    group.state.value,
                    group.protocol_type or "",
                    (group.protocol or "") if stable else "",
                    members,
                )
            )
        return messages.GroupsDescribed(described)

    def list_groups(self, request: messages.ListGroups) -> messages.GroupsListed:
        states = {s.lower() for s in request.states}
        if request.types and "classic" not in {t.lower() for t in request.types}:
            return messages.GroupsListed([])  # every group here is a classic group
        listed = [
            messages.GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if not states or g.state.value.lower() in states
        ]
        return messages.GroupsListed(sorted(listed, key=lambda g: g.group_id))

    def delete(self, request: messages.DeleteGroups) -> messages.GroupsDeleted:
        results = []
        for group_id in request.group_ids:
            group = self.groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                results.append((group_id, int(ErrorCode.group_id_not_found)))
            elif group.state is not GroupState.EMPTY:
                results.append((group_id, int(ErrorCode.non_empty_group)))
            else:
                try:
                    self.store.delete_group(group_id, list(group.offsets))
                except Exception as exc:
                    log.error("cannot delete group", extra={"group": group_id, "error": str(exc)})
                    results.append((group_id, int(ErrorCode.coordinator_not_available)))
                    continue
                group.state = GroupState.DEAD
                del self.groups[group_id]
                results.append((group_id, int(ErrorCode.none)))
        return messages.GroupsDeleted(results)

    def delete_offsets(
        self, request: messages.OffsetDelete, subscribed: Callable[[Group], set[str]]
    ) -> messages.OffsetsDeleted:
        """OffsetDelete: ``subscribed(group)`` names the topics its members consume, whose
        offsets cannot be deleted while the group is active."""
        group = self.groups.get(request.group_id)
        if group is None or group.state is GroupState.DEAD:
            return messages.OffsetsDeleted(int(ErrorCode.group_id_not_found))
        busy = subscribed(group) if group.state is not GroupState.EMPTY else set()
        results, doomed = [], []
        for topic, partition in request.partitions:
            if topic in busy:
                results.append((topic, partition, int(ErrorCode.group_subscribed_to_topic)))
            else:
                results.append((topic, partition, int(ErrorCode.none)))
                if (topic, partition) in group.offsets:
                    doomed.append((topic, partition))
        if doomed:
            try:
                self.store.delete_offsets(group.group_id, doomed)
            except Exception as exc:
                log.error(
                    "cannot delete offsets", extra={"group": group.group_id, "error": str(exc)}
                )
                return messages.OffsetsDeleted(int(ErrorCode.coordinator_not_available))
            for key in doomed:
                del group.offsets[key]
        return messages.OffsetsDeleted(int(ErrorCode.none), results)
