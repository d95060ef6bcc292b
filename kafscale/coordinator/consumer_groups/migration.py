"""KIP-848's online migration: a live classic group becomes a consumer group, and classic members
live inside consumer groups, served by the classic APIs (Kafka's ``convertToConsumerGroup`` and
``classicGroupJoinToConsumerGroup`` with its SyncGroup, Heartbeat and LeaveGroup twins;
docs/design/ecosystem.md, section 5.4). Pure, as ``machine``: each call takes the group and the
time and returns a ``Step`` (the caller stores it, then keeps ``step.group``) with the answer.

Upgrade: the first consumer-protocol member (a heartbeat at epoch 0) of a Stable classic group
of Kafka consumers turns it into a consumer group at the classic generation: each member keeps
its id, subscription and assignment (decoded from the embedded consumer protocol) and becomes a
STABLE member at that epoch; then the heartbeat joins as any other.

A classic member inside a consumer group rejoins (JoinGroup) whenever it must change its
partitions: its subscription's owned partitions are what it reports (an eager member revoked
everything before rejoining), it is reconciled as a heartbeat would reconcile it, and the answer
comes at once -- its member epoch as the generation, its first protocol, never the leader. Its
SyncGroup gets its assigned partitions; its Heartbeat says REBALANCE_IN_PROGRESS when it must
rejoin: its epoch is behind the target, it has partitions to give up, or a partition it waits
for is free now.

Downgrade: once only classic members are left (the last consumer-protocol member left or was
removed), the group becomes a classic group again at its assignment epoch, which the classic
side rebalances (``downgrade``), when the policy allows.
"""

from __future__ import annotations

import dataclasses
import uuid

from kafscale.coordinator.consumer_groups.machine import (
    HeartbeatError,
    Step,
    place_member,
    reconcile_member,
    remove,
)
from kafscale.coordinator.consumer_groups.model import (
    ClassicProtocols,
    ConsumerGroup,
    ConsumerMember,
    ConsumerSettings,
    MemberState,
    Partitions,
)
from kafscale.coordinator.consumer_groups.target import Topics, subscription_hash
from kafscale.coordinator.group_model import Group, GroupState
from kafscale.ipc import messages
from kafscale.metadata.records import GroupRecord, MemberRecord
from kafscale.protocol import consumer_protocol
from kafscale.protocol.consumer_protocol import (
    UndecodableProtocol,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from kafscale.protocol.errors import ErrorCode

Policy = str  # Kafka's group.consumer.migration.policy: bidirectional, upgrade, downgrade, disabled
POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


# -- upgrade ---------------------------------------------------------------------------------------


def upgrade(
    classic: Group, policy: Policy, settings: ConsumerSettings, topics: Topics, now: int
) -> ConsumerGroup:
    """The consumer group a classic group with members becomes, or ``HeartbeatError``
    (GROUP_ID_NOT_FOUND with Kafka's reasons) when it cannot."""
    group_id = classic.group_id

    def refuse(why: str) -> HeartbeatError:
        return HeartbeatError(
            ErrorCode.group_id_not_found,
            f"Cannot upgrade classic group {group_id} to consumer group because {why}.",
        )

    if policy not in ("bidirectional", "upgrade"):
        raise refuse("online upgrade is disabled")
    if classic.protocol_type != consumer_protocol.PROTOCOL_TYPE:
        raise refuse("the group does not use the consumer embedded protocol")
    if len(classic.members) > settings.max_size:
        raise refuse("the group size exceeds the consumer group maximum size")
    if classic.state is not GroupState.STABLE or classic.protocol is None:
        # Kafka converts a rebalancing group too; its cooperative members still own partitions
        # no stored assignment names, so here the member retries once the rebalance is over
        # (a retriable error every client backs off on).
        raise HeartbeatError(
            ErrorCode.coordinator_load_in_progress,
            f"Classic group {group_id} is rebalancing; it is upgraded once it is stable.",
        )
    group = ConsumerGroup(group_id, classic.generation, classic.generation)
    for old in classic.members.values():
        try:
            subscription = decode_subscription(old.metadata(classic.protocol))
            assignment = decode_assignment(old.assignment)
        except UndecodableProtocol:
            raise refuse("the embedded consumer protocol is malformed") from None
        if assignment.user_data:
            raise refuse(
                "an unsupported custom assignor is in use. Please refer to the documentation "
                "or switch to a default assignor before re-attempting the upgrade"
            )
        assigned = _by_id(assignment.partitions, topics)
        member = ConsumerMember(
            old.member_id,
            instance_id=old.group_instance_id,
            rack_id=subscription.rack,
            client_id=old.client_id,
            client_host=old.client_host,
            subscribed_topic_names=tuple(sorted(set(subscription.topics))),
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            member_epoch=classic.generation,
            previous_member_epoch=classic.generation,
            assigned=assigned,
            target=assigned,
            target_epoch=classic.generation,
            classic=ClassicProtocols(old.session_timeout_ms, tuple(old.protocols)),
        )
        try:
            group.put_member(member)
        except AssertionError:  # the classic leader's assignment gave a partition twice
            raise refuse("two members are assigned the same partition") from None
        group.sessions[member.member_id] = now + old.session_timeout_ms
    group.metadata_hash = subscription_hash(group, topics)
    group.target_ms = now
    return group


# -- the classic APIs on a consumer group ----------------------------------------------------------


def join(
    group: ConsumerGroup,
    request: messages.JoinGroup,
    settings: ConsumerSettings,
    topics: Topics,
    now: int,
) -> tuple[Step, messages.JoinGroupResult]:
    """JoinGroup of a classic member (new, or rejoining) of a consumer group."""

    def fail(error: ErrorCode, member_id: str = request.member_id) -> messages.JoinGroupResult:
        return messages.JoinGroupResult(int(error), member_id=member_id)

    step = Step(group.evolve())
    g = step.group
    assert g is not None
    if request.protocol_type != consumer_protocol.PROTOCOL_TYPE or not request.protocols:
        return step, fail(ErrorCode.inconsistent_group_protocol)
    try:
        subscription = decode_subscription(request.protocols[0][1])
    except UndecodableProtocol:
        return step, fail(ErrorCode.inconsistent_group_protocol)
    instance = request.group_instance_id
    member_id = request.member_id
    old: ConsumerMember | None
    if instance and instance in g.static:
        old = g.members[g.static[instance]]
        if member_id and member_id != old.member_id:
            return step, fail(ErrorCode.fenced_instance_id)
    else:  # an id the group does not know is a new member's (the MEMBER_ID_REQUIRED one)
        old = g.members.get(member_id) if member_id else None
    if old is not None and old.classic is None:
        return step, fail(ErrorCode.unknown_member_id)  # a consumer-protocol member's id
    if not member_id:
        member_id = f"{request.client_id}-{uuid.uuid4()}"
        if old is None and request.require_known_member_id and not instance:
            return step, fail(ErrorCode.member_id_required, member_id)
    if old is None and len(g.members) >= settings.max_size:
        return step, fail(ErrorCode.group_max_size_reached)
    base = old if old is not None else ConsumerMember(member_id)
    updated = dataclasses.replace(
        base,
        member_id=member_id,
        instance_id=instance,
        rack_id=subscription.rack,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topic_names=tuple(sorted(set(subscription.topics))),
        subscribed_topic_regex=None,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        server_assignor=None,
        classic=ClassicProtocols(request.session_timeout_ms, tuple(request.protocols)),
    )
    bump = old is None or updated.subscribed_topic_names != old.subscribed_topic_names
    place_member(step, old, updated, bump, settings, topics, now)
    owned = _by_id(subscription.owned, topics)
    reconciled = reconcile_member(g, g.members[member_id], topics, owned, now)
    if reconciled != old:
        step.changed.add(member_id)
    g.sessions[member_id] = now + request.session_timeout_ms
    assert reconciled.classic is not None
    return step, messages.JoinGroupResult(
        int(ErrorCode.none),
        reconciled.member_epoch,
        consumer_protocol.PROTOCOL_TYPE,
        reconciled.classic.first(),
        "",  # the coordinator assigns: no member is the leader
        member_id=member_id,
    )


def _classic_member(
    group: ConsumerGroup, member_id: str, instance: str | None, generation: int | None = None
) -> ConsumerMember | ErrorCode:
    """The classic member a request speaks for, or why it cannot: ``generation`` (SyncGroup,
    Heartbeat) must be its member epoch."""
    if instance and group.static.get(instance) not in (None, member_id):
        return ErrorCode.fenced_instance_id
    member = group.members.get(member_id)
    if member is None or member.classic is None:
        return ErrorCode.unknown_member_id
    if generation is not None and generation != member.member_epoch:
        return ErrorCode.illegal_generation
    return member


def sync(
    group: ConsumerGroup, request: messages.SyncGroup, topics: Topics, now: int
) -> tuple[Step, messages.SyncGroupResult]:
    """SyncGroup of a classic member: its assigned partitions (the coordinator assigned them;
    a leader's assignments are not asked for and ignored)."""
    step = Step(group.evolve())
    g = step.group
    assert g is not None
    member = _classic_member(g, request.member_id, request.group_instance_id, request.generation_id)
    if isinstance(member, ErrorCode):
        return step, messages.SyncGroupResult(int(member))
    assert member.classic is not None
    if (request.protocol_type and request.protocol_type != consumer_protocol.PROTOCOL_TYPE) or (
        request.protocol_name and request.protocol_name != member.classic.first()
    ):
        return step, messages.SyncGroupResult(int(ErrorCode.inconsistent_group_protocol))
    g.sessions[member.member_id] = now + member.classic.session_timeout_ms
    return step, messages.SyncGroupResult(
        int(ErrorCode.none),
        consumer_protocol.PROTOCOL_TYPE,
        member.classic.first(),
        encode_assignment(_by_name(member.assigned, topics)),
    )


def heartbeat(
    group: ConsumerGroup, request: messages.Heartbeat, now: int
) -> tuple[Step, messages.GroupError]:
    step = Step(group.evolve())
    g = step.group
    assert g is not None
    member = _classic_member(g, request.member_id, request.group_instance_id, request.generation_id)
    if isinstance(member, ErrorCode):
        return step, messages.GroupError(int(member))
    assert member.classic is not None
    g.sessions[member.member_id] = now + member.classic.session_timeout_ms
    if must_rejoin(g, member):
        return step, messages.GroupError(int(ErrorCode.rebalance_in_progress))
    return step, messages.GroupError(int(ErrorCode.none))


def must_rejoin(group: ConsumerGroup, member: ConsumerMember) -> bool:
    """Whether a classic member must join again to change its partitions."""
    if member.member_epoch < group.assignment_epoch:
        return True
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        return True
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return any(
            (topic, p) not in group.owners
            for topic, partitions in member.target.items()
            for p in partitions
            if p not in member.assigned.get(topic, frozenset())
        )
    return False


def leave(
    group: ConsumerGroup, request: messages.LeaveGroup
) -> tuple[Step, messages.LeaveGroupResult]:
    """LeaveGroup of classic members: each removed (its partitions free, the epoch moves on)."""
    step = Step(group.evolve())
    g = step.group
    assert g is not None
    results: list[tuple[str, str | None, int]] = []
    for leaving in request.members:
        member_id = leaving.member_id
        if not member_id and leaving.group_instance_id:
            member_id = g.static.get(leaving.group_instance_id, "")
        member = _classic_member(g, member_id, leaving.group_instance_id)
        if isinstance(member, ErrorCode):
            results.append((member_id, leaving.group_instance_id, int(member)))
            continue
        remove(step, member_id, leaving.reason or "left the group")
        results.append((member_id, leaving.group_instance_id, int(ErrorCode.none)))
    return step, messages.LeaveGroupResult(int(ErrorCode.none), results)


def _by_id(partitions: consumer_protocol.Partitions, topics: Topics) -> Partitions:
    """Partitions by topic name -> by topic id; topics that no longer exist are left out."""
    ids = {name: topic_id for name, (topic_id, _) in topics.items()}
    return {ids[name]: frozenset(p) for name, p in partitions.items() if name in ids and p}


# -- downgrade -------------------------------------------------------------------------------------


def downgrade_due(group: ConsumerGroup | None, policy: Policy) -> bool:
    """Only classic members are left in the group (its last consumer-protocol member went) and
    the policy lets it become a classic group again."""
    return (
        policy in ("bidirectional", "downgrade")
        and group is not None
        and bool(group.members)
        and all(m.classic is not None for m in group.members.values())
    )


def downgrade(group: ConsumerGroup, topics: Topics) -> GroupRecord | None:
    """The classic group a consumer group of classic members becomes: each member with its
    protocols, session and assignment (ids -> names), at the group's assignment epoch as the
    generation; the classic side then rebalances it. None when the members have no protocol in
    common (it stays a consumer group, which serves them as well)."""
    members = sorted(group.members.values(), key=lambda m: m.member_id)
    protocols = [m.classic.protocols for m in members if m.classic is not None]
    common = set.intersection(*({name for name, _ in p} for p in protocols))
    if not common:
        return None
    records = []
    for member in members:
        assert member.classic is not None
        records.append(
            MemberRecord(
                member.member_id,
                member.instance_id,
                member.client_id,
                member.client_host,
                member.classic.session_timeout_ms,
                member.rebalance_timeout_ms,
                list(member.classic.protocols),
                encode_assignment(_by_name(member.assigned, topics)),
            )
        )
    protocol = next(name for name, _ in protocols[0] if name in common)
    return GroupRecord(
        group.group_id,
        consumer_protocol.PROTOCOL_TYPE,
        protocol,
        group.assignment_epoch,
        members[0].member_id,
        records,
    )


def _by_name(partitions: Partitions, topics: Topics) -> consumer_protocol.Partitions:
    """Partitions by topic id -> by topic name; topics deleted meanwhile are left out."""
    names = {topic_id: name for name, (topic_id, _) in topics.items()}
    return {
        names[topic_id]: tuple(sorted(p)) for topic_id, p in partitions.items() if topic_id in names
    }
