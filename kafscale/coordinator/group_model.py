"""What the classic group state machine (``groups``) is made of: groups, members, their states,
the settings, the instructions it returns (``Reply``, ``Write``) and the ``GroupStore`` contract
they are carried out on. Plain data and pure helpers, no I/O.

A ``Group`` is the coordinator's memory of one group while this broker coordinates it; what must
outlive that (membership and assignment as of the last rebalance, committed offsets) is in the
store, and ``restore`` builds groups back from it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafscale.ipc import messages
from kafscale.metadata.group_records import ConsumerGroupRecord, ConsumerMemberRecord
from kafscale.metadata.records import GroupRecord, MemberRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode

Token = Any  # what the caller needs to route a late answer (the ZeroMQ request)
Send = Callable[[Token, messages.Message], None]
TopicPartition = tuple[str, int]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class NotCoordinator(Exception):
    """A write refused because this broker does not coordinate the group (any more): it holds
    no leader record of the group's ``__consumer_offsets`` partition, or the fence failed.
    Nothing was written; the request is answered NOT_COORDINATOR."""


class ConsumerGroupStore(Protocol):
    """Where consumer (KIP-848) groups persist (``consumer_groups.coordinator``). Raises
    ``NotCoordinator`` when the write is fenced, anything else when it failed."""

    def save_consumer(
        self,
        group_id: str,
        members: Sequence[ConsumerMemberRecord],
        removed: Iterable[str],
        group: ConsumerGroupRecord | None,
        classic: GroupRecord | None = None,
    ) -> None: ...

    def delete_consumer(self, group_id: str) -> None: ...

    def downgrade_consumer(self, group_id: str, classic: GroupRecord) -> None: ...


class GroupStore(ConsumerGroupStore, Protocol):
    """Where groups and offsets persist. Raises ``NotCoordinator`` when the write is fenced,
    anything else when it failed otherwise; nothing was written then."""

    def save_group(self, record: GroupRecord) -> None: ...

    def delete_group(self, group_id: str, partitions: Iterable[TopicPartition]) -> None: ...

    def save_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None: ...

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None: ...


class ConsumerView(Protocol):
    """What the classic machine reads of the consumer (KIP-848) groups of the same ids
    (``consumer_groups.coordinator.ConsumerGroups``): it never changes them."""

    @property
    def groups(self) -> Mapping[str, Any]: ...

    def commit_error(self, request: messages.OffsetCommit) -> ErrorCode | None: ...

    def fetch_error(self, query: messages.GroupOffsetsQuery) -> ErrorCode | None: ...

    def subscribed_names(self, group_id: str) -> set[str]: ...

    def listings(self, states: set[str]) -> list[messages.GroupListing]: ...


# -- instructions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """Answer the request ``token`` stands for with ``message``."""

    token: Token
    message: messages.Message


@dataclass(frozen=True)
class SaveGroup:
    record: GroupRecord


@dataclass(frozen=True)
class DeleteGroup:
    group_id: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class SaveOffsets:
    group_id: str
    offsets: Mapping[TopicPartition, OffsetRecord]


@dataclass(frozen=True)
class DeleteOffsets:
    group_id: str
    partitions: tuple[TopicPartition, ...]


Change = SaveGroup | DeleteGroup | SaveOffsets | DeleteOffsets


@dataclass(frozen=True)
class Write:
    """Make ``change`` in the store (for the logs: the group's ``what``), then carry out
    ``done()``'s instructions -- or, if the store refused, ``failed(code)``'s, ``code`` being
    the answer the request gets (``store_error``). Nothing that depends on the write is in the
    group or sent before ``done`` runs."""

    group_id: str
    what: str
    change: Change
    done: Callable[[], Instructions] = lambda: []
    failed: Callable[[ErrorCode], Instructions] = lambda code: []


Instruction = Reply | Write
Instructions = list[Instruction]


def store_error(exc: Exception) -> ErrorCode:
    """The answer to a request whose write failed with ``exc``: both are retriable, but
    NOT_COORDINATOR sends the client to look the coordinator up again first."""
    if isinstance(exc, NotCoordinator):
        return ErrorCode.not_coordinator
    return ErrorCode.coordinator_not_available


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
        return choose_protocol(list(self.members.values()))

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidates())

    def all_joined(self) -> bool:
        return not self.pending and all(m.join_token is not None for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)


def choose_protocol(members: Sequence[Member]) -> str:
    """The protocol (assignor) of a group of ``members``: among those every member supports,
    the one most members prefer (ties: the first member's preference)."""
    candidates = set.intersection(*({name for name, _ in m.protocols} for m in members))
    votes: Counter[str] = Counter()
    for member in members:
        votes[next(name for name, _ in member.protocols if name in candidates)] += 1
    return max(votes, key=lambda name: votes[name])


def member_error(group: Group | None, member_id: str, instance_id: str | None) -> ErrorCode | None:
    """Why ``member_id`` (of static instance ``instance_id``) cannot act in ``group``, or None."""
    if group is None or group.state is GroupState.EMPTY:
        return ErrorCode.unknown_member_id
    if group.state is GroupState.DEAD:
        return ErrorCode.coordinator_not_available
    if instance_id and group.static.get(instance_id) not in (None, member_id):
        return ErrorCode.fenced_instance_id
    if member_id not in group.members:
        return ErrorCode.unknown_member_id
    return None


def restore(
    records: Iterable[GroupRecord],
    offsets: dict[str, dict[TopicPartition, OffsetRecord]],
    now: int,
) -> dict[str, Group]:
    """Groups as the store holds them: members carry on in their generation (stable), each with
    a fresh session to prove itself alive; groups with offsets but no record are empty."""
    groups: dict[str, Group] = {}
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
        groups[record.group_id] = group
    for group_id, committed in offsets.items():
        groups.setdefault(group_id, Group(group_id)).offsets.update(committed)
    return groups
