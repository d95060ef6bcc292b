"""What a KIP-848 consumer group is made of in the coordinator's memory: members, the group, the
settings, and their stored form (``metadata.group_records``). Plain data, no I/O.

Members are frozen: a step of the state machine (``machine``) builds changed members and a new
``ConsumerGroup`` (``evolve``: its own dicts, the members shared) and the service keeps it only
once the store took what changed, so a refused write leaves the group as it was.

Three epochs, as Kafka's: the group ``epoch`` grows when the assignment must change (a member
joins, leaves or changes its subscription; a subscribed topic changes), ``assignment_epoch`` is
the group epoch the members' targets were computed at, and each member's ``member_epoch`` the
target epoch it has reconciled to. ``owners`` maps each partition a member holds (assigned or
still to revoke) to that member: a partition is given to a member only when nobody holds it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kafscale.metadata.group_records import (
    ConsumerGroupRecord,
    ConsumerMemberRecord,
    StoredPartitions,
)

TopicId = str
Partitions = dict[TopicId, frozenset[int]]  # never mutated once built
TopicPartition = tuple[TopicId, int]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # waits for the member to give some up
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # waits for others to give some up


class GroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


@dataclass(frozen=True)
class ConsumerSettings:
    """Kafka's ``group.consumer.*`` broker configs."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    assignment_interval_ms: int = 0
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = ("uniform", "range")
    migration_policy: str = "bidirectional"  # group.consumer.migration.policy


@dataclass(frozen=True)
class ClassicProtocols:
    """What a classic-protocol member of a consumer group (online migration) joined with: its
    session timeout and its protocols (assignor name -> ConsumerProtocolSubscription bytes), in
    its order of preference."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]

    def first(self) -> str:
        return self.protocols[0][0]


@dataclass(frozen=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = 300_000
    server_assignor: str | None = None
    state: MemberState = MemberState.STABLE
    member_epoch: int = 0
    previous_member_epoch: int = 0
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    target: Partitions = field(default_factory=dict)
    target_epoch: int = 0
    classic: ClassicProtocols | None = None  # a classic-protocol member (online migration)

    def held(self) -> set[TopicPartition]:
        """What it holds: assigned, and not yet revoked."""
        return {
            (topic, p)
            for held in (self.assigned, self.pending_revocation)
            for topic, partitions in held.items()
            for p in partitions
        }

    def record(self) -> ConsumerMemberRecord:
        return ConsumerMemberRecord(
            self.member_id,
            self.instance_id,
            self.rack_id,
            self.client_id,
            self.client_host,
            list(self.subscribed_topic_names),
            self.subscribed_topic_regex,
            self.rebalance_timeout_ms,
            self.server_assignor,
            self.state.value,
            self.member_epoch,
            self.previous_member_epoch,
            _stored(self.assigned),
            _stored(self.pending_revocation),
            _stored(self.target),
            self.target_epoch,
            self.classic.session_timeout_ms if self.classic is not None else None,
            list(self.classic.protocols) if self.classic is not None else None,
        )

    def session_ms(self, consumer_session_ms: int) -> int:
        """Its session timeout: its own JoinGroup's for a classic member."""
        return self.classic.session_timeout_ms if self.classic is not None else consumer_session_ms

    @classmethod
    def restore(cls, record: ConsumerMemberRecord) -> ConsumerMember:
        return cls(
            record.member_id,
            record.instance_id,
            record.rack_id,
            record.client_id,
            record.client_host,
            tuple(record.subscribed_topic_names),
            record.subscribed_topic_regex,
            record.rebalance_timeout_ms,
            record.server_assignor,
            MemberState(record.state),
            record.member_epoch,
            record.previous_member_epoch,
            _partitions(record.assigned),
            _partitions(record.pending_revocation),
            _partitions(record.target),
            record.target_epoch,
            ClassicProtocols(
                record.classic_session_timeout_ms,
                tuple((name, bytes(data)) for name, data in record.classic_protocols),
            )
            if record.classic_session_timeout_ms is not None and record.classic_protocols
            else None,
        )


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    metadata_hash: str = ""
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    owners: dict[TopicPartition, str] = field(default_factory=dict)
    # Soft state, restarted by a failover:
    sessions: dict[str, int] = field(default_factory=dict)  # member -> session deadline
    revocations: dict[str, tuple[int, int]] = field(default_factory=dict)  # member -> (epoch, due)
    target_ms: int = 0  # when the target was last computed
    target_stale: bool = False  # loaded half-written: recompute at the next step

    def evolve(self) -> ConsumerGroup:
        """A copy to change: its own dicts, the (frozen) members shared."""
        return ConsumerGroup(
            self.group_id,
            self.epoch,
            self.assignment_epoch,
            self.metadata_hash,
            dict(self.members),
            dict(self.static),
            dict(self.owners),
            dict(self.sessions),
            dict(self.revocations),
            self.target_ms,
            self.target_stale,
        )

    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        if any(
            m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def put_member(self, member: ConsumerMember) -> None:
        """Add or replace a member, keeping ``static`` and ``owners`` in step."""
        self.drop_member(member.member_id)
        self.members[member.member_id] = member
        if member.instance_id:
            self.static[member.instance_id] = member.member_id
        for tp in member.held():
            holder = self.owners.setdefault(tp, member.member_id)
            if holder != member.member_id:
                raise AssertionError(f"{tp} is held by {holder} and {member.member_id}")

    def drop_member(self, member_id: str) -> ConsumerMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.instance_id and self.static.get(member.instance_id) == member_id:
            del self.static[member.instance_id]
        for tp in member.held():
            if self.owners.get(tp) == member_id:
                del self.owners[tp]
        return member

    def record(self) -> ConsumerGroupRecord:
        return ConsumerGroupRecord(
            self.group_id, self.epoch, self.assignment_epoch, self.metadata_hash
        )

    @classmethod
    def restore(
        cls,
        record: ConsumerGroupRecord,
        members: list[ConsumerMemberRecord],
        now: int,
        session_ms: int,
    ) -> ConsumerGroup:
        """The group as stored; every member gets a fresh session to prove itself alive."""
        group = cls(record.group_id, record.epoch, record.assignment_epoch, record.metadata_hash)
        for stored in sorted(members, key=lambda m: m.member_id):
            member = ConsumerMember.restore(stored)
            group.put_member(member)
            group.sessions[member.member_id] = now + member.session_ms(session_ms)
            if member.target_epoch > group.assignment_epoch:
                group.target_stale = True
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                due = now + member.rebalance_timeout_ms
                group.revocations[member.member_id] = (member.member_epoch, due)
        group.target_ms = now
        return group


def _stored(partitions: Partitions) -> StoredPartitions:
    return {topic: sorted(p) for topic, p in sorted(partitions.items()) if p}


def _partitions(stored: StoredPartitions) -> Partitions:
    return {topic: frozenset(p) for topic, p in stored.items() if p}
