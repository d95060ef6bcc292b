"""The KIP-848 consumer-group protocol as Kafka 4 serves it (docs/design/ecosystem.md, section 5):
ConsumerGroupHeartbeat, session and revocation deadlines, and topic changes. Pure: each call takes
a group (or None), the stimulus, the topics and the time, and returns a ``Step`` -- the group as
it is after it, which members changed or went (for the store) and the answer. The caller stores
the step and only then keeps ``step.group``; a refused write leaves the old group untouched.

A heartbeat (``GroupMetadataManager.consumerGroupHeartbeat``): validate the request; get or
create the group (only epoch 0 creates) and the member (dynamic, or static by instance id);
check the member's epoch; apply the fields the request carries; bump the group epoch when the
member is new or its subscription, or the subscribed topics, changed; compute the new target when
the group epoch is ahead of the assignment epoch (and ``assignment_interval_ms`` has passed);
reconcile the member (``reconcile``); answer its epoch, the heartbeat interval and its partitions
when they changed, when it joined, or when it sent a full request.

Leaving (epoch -1, or a session that timed out) removes the member and bumps the group epoch; a
static member leaving with -2 keeps its place and partitions until its session times out, so it
can come back under a new member id without a rebalance. A member that does not give up
partitions within its rebalance timeout is fenced (removed).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from dataclasses import dataclass, field

from kafscale.coordinator.consumer_groups.model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    ConsumerSettings,
    MemberState,
    Partitions,
)
from kafscale.coordinator.consumer_groups.reconcile import reconcile
from kafscale.coordinator.consumer_groups.target import (
    Topics,
    assign_if_due,
    subscribed_ids,
    subscription_hash,
)
from kafscale.ipc.consumer_groups import ConsumerGroupHeartbeat, ConsumerGroupHeartbeatResult
from kafscale.ipc.consumer_groups import TopicIdPartitions as WirePartitions
from kafscale.protocol.errors import ErrorCode


@dataclass
class Step:
    group: ConsumerGroup | None  # None: the group does not exist (after it: unchanged)
    changed: set[str] = field(default_factory=set)  # member ids to store
    removed: set[str] = field(default_factory=set)  # member ids to delete
    group_changed: bool = False  # the group record to store
    reply: ConsumerGroupHeartbeatResult | None = None
    fenced: dict[str, str] = field(default_factory=dict)  # member id -> why (metrics, logs)

    @property
    def writes(self) -> bool:
        return bool(self.changed or self.removed or self.group_changed)


class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def heartbeat(
    group: ConsumerGroup | None,
    request: ConsumerGroupHeartbeat,
    settings: ConsumerSettings,
    topics: Topics,
    now: int,
) -> Step:
    try:
        validate(request, settings)
        if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return _leave(group, request, now)
        return _heartbeat(group, request, settings, topics, now)
    except HeartbeatError as exc:
        reply = ConsumerGroupHeartbeatResult(int(exc.code), exc.message, request.member_id or None)
        return Step(group, reply=reply)


def validate(request: ConsumerGroupHeartbeat, settings: ConsumerSettings) -> None:
    """Kafka's ``throwIfConsumerGroupHeartbeatRequestIsInvalid``, with its messages."""
    epoch = request.member_epoch

    def invalid(message: str) -> HeartbeatError:
        return HeartbeatError(ErrorCode.invalid_request, message)

    if not request.member_id and (request.version >= 1 or epoch > 0 or epoch == LEAVE_EPOCH):
        raise invalid("MemberId can't be empty.")
    if not request.group_id.strip():
        raise invalid("GroupId can't be empty.")
    if request.instance_id is not None and not request.instance_id.strip():
        raise invalid("InstanceId can't be empty.")
    if request.rack_id is not None and not request.rack_id.strip():
        raise invalid("RackId can't be empty.")
    if epoch == JOIN_EPOCH:
        if request.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.topic_partitions is None or request.topic_partitions:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise invalid(
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining."
            )
    elif epoch == STATIC_LEAVE_EPOCH:
        if request.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif epoch < STATIC_LEAVE_EPOCH:
        raise invalid("MemberEpoch is invalid.")
    assignor = request.server_assignor
    if assignor is not None and assignor not in settings.assignors:
        raise HeartbeatError(
            ErrorCode.unsupported_assignor,
            f"ServerAssignor {assignor} is not supported. Supported assignors: "
            f"{', '.join(settings.assignors)}.",
        )
    regex = request.subscribed_topic_regex
    if regex:
        try:
            re.compile(regex)
        except re.error as exc:
            raise HeartbeatError(
                ErrorCode.invalid_regular_expression, f"SubscribedTopicRegex {regex}: {exc}"
            ) from None


def _heartbeat(
    group: ConsumerGroup | None,
    request: ConsumerGroupHeartbeat,
    settings: ConsumerSettings,
    topics: Topics,
    now: int,
) -> Step:
    epoch = request.member_epoch
    if group is None:
        if epoch != JOIN_EPOCH:
            raise HeartbeatError(
                ErrorCode.group_id_not_found, f"Consumer group {request.group_id} not found."
            )
        group = ConsumerGroup(request.group_id)
        new_group = True
    else:
        new_group = False
    step = Step(group.evolve(), group_changed=new_group)
    assert step.group is not None
    g = step.group
    member_id = request.member_id or str(uuid.uuid4())  # v0: the coordinator names it
    old = _member(g, request, member_id, settings)
    member = old if old is not None else ConsumerMember(member_id)
    if old is None or old.member_id != member_id:  # new, or a static member's new incarnation
        if old is None and len(g.members) >= settings.max_size:
            raise HeartbeatError(
                ErrorCode.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of {settings.max_size} "
                "members.",
            )
        member = dataclasses.replace(member, member_id=member_id)
    updated = dataclasses.replace(
        member,
        instance_id=_given(request.instance_id, member.instance_id),
        rack_id=_given(request.rack_id, member.rack_id),
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topic_names=(
            tuple(sorted(set(request.subscribed_topic_names)))
            if request.subscribed_topic_names is not None
            else member.subscribed_topic_names
        ),
        subscribed_topic_regex=(
            (request.subscribed_topic_regex or None)
            if request.subscribed_topic_regex is not None
            else member.subscribed_topic_regex
        ),
        rebalance_timeout_ms=(
            request.rebalance_timeout_ms
            if request.rebalance_timeout_ms != -1
            else member.rebalance_timeout_ms
        ),
        server_assignor=_given(request.server_assignor, member.server_assignor),
        classic=None,  # it speaks the consumer protocol now
    )
    bump = old is None or (
        updated.subscribed_topic_names != member.subscribed_topic_names
        or updated.subscribed_topic_regex != member.subscribed_topic_regex
    )
    place_member(step, old, updated, bump, settings, topics, now)
    owned = _owned(request.topic_partitions)
    if epoch == JOIN_EPOCH:
        owned = {}
    reconciled = reconcile_member(g, g.members[member_id], topics, owned, now)
    if reconciled != old:
        step.changed.add(member_id)
    g.sessions[member_id] = now + settings.session_timeout_ms
    subscribing = (
        request.subscribed_topic_names is not None or request.subscribed_topic_regex is not None
    )
    full = (
        request.rebalance_timeout_ms != -1 and subscribing and request.topic_partitions is not None
    )
    before = old.assigned if old is not None else None
    send_assignment = epoch == JOIN_EPOCH or full or reconciled.assigned != before
    step.reply = ConsumerGroupHeartbeatResult(
        int(ErrorCode.none),
        None,
        member_id,
        reconciled.member_epoch,
        settings.heartbeat_interval_ms,
        _wire(reconciled.assigned) if send_assignment else None,
    )
    return step


def _member(
    g: ConsumerGroup, request: ConsumerGroupHeartbeat, member_id: str, settings: ConsumerSettings
) -> ConsumerMember | None:
    """The member the request speaks for (None: a new one), its epoch checked."""
    epoch = request.member_epoch
    instance = request.instance_id
    if instance is None:
        member = g.members.get(member_id)
        if member is None and epoch != JOIN_EPOCH:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Member {member_id} is not a member of group {g.group_id}.",
            )
    else:
        holder = g.static.get(instance)
        member = g.members.get(holder) if holder is not None else None
        if epoch == JOIN_EPOCH:
            if (
                member is not None
                and member.member_id != member_id
                and member.member_epoch != STATIC_LEAVE_EPOCH
            ):
                raise HeartbeatError(
                    ErrorCode.unreleased_instance_id,
                    f"Static member {member_id} with instance id {instance} cannot join "
                    f"the group because the instance id is owned by {member.member_id} "
                    "member.",
                )
            if member is None and member_id in g.members:
                member = g.members[member_id]  # a dynamic member turning static
        elif member is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Instance id {instance} is unknown in group {g.group_id}.",
            )
        elif member.member_id != member_id:
            raise HeartbeatError(
                ErrorCode.fenced_instance_id,
                f"Static member {member_id} with instance id {instance} was fenced by member "
                f"{member.member_id}.",
            )
    if member is not None and epoch != JOIN_EPOCH:
        _check_epoch(member, epoch, _owned(request.topic_partitions))
    return member


def _check_epoch(member: ConsumerMember, epoch: int, owned: Partitions | None) -> None:
    if epoch > member.member_epoch:
        raise HeartbeatError(
            ErrorCode.fenced_member_epoch,
            f"The consumer group member has a greater member epoch ({epoch}) than the one known "
            f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
            "partitions and rejoin.",
        )
    if epoch < member.member_epoch and (
        epoch != member.previous_member_epoch or not _subset(owned, member.assigned)
    ):
        raise HeartbeatError(
            ErrorCode.fenced_member_epoch,
            f"The consumer group member has a smaller member epoch ({epoch}) than the one known "
            f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
            "partitions and rejoin.",
        )


def _leave(group: ConsumerGroup | None, request: ConsumerGroupHeartbeat, now: int) -> Step:
    if group is None:
        raise HeartbeatError(
            ErrorCode.group_id_not_found, f"Consumer group {request.group_id} not found."
        )
    if request.instance_id is not None:
        holder = group.static.get(request.instance_id)
        if holder is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Instance id {request.instance_id} is unknown in group {group.group_id}.",
            )
        if holder != request.member_id:
            raise HeartbeatError(
                ErrorCode.fenced_instance_id,
                f"Static member {request.member_id} with instance id {request.instance_id} was "
                f"fenced by member {holder}.",
            )
    member = group.members.get(request.member_id)
    if member is None:
        raise HeartbeatError(
            ErrorCode.unknown_member_id,
            f"Member {request.member_id} is not a member of group {group.group_id}.",
        )
    step = Step(group.evolve())
    assert step.group is not None
    if request.member_epoch == STATIC_LEAVE_EPOCH:
        # Keeps its place and partitions until its session times out: a restart comes back.
        step.group.members[member.member_id] = dataclasses.replace(
            member, member_epoch=STATIC_LEAVE_EPOCH
        )
        step.changed.add(member.member_id)
    else:
        remove(step, member.member_id, "left")
    step.reply = ConsumerGroupHeartbeatResult(
        int(ErrorCode.none), None, request.member_id, request.member_epoch, 0, None
    )
    return step


def remove(step: Step, member_id: str, why: str) -> None:
    """Take ``member_id`` out of ``step.group``: its partitions are free, the epoch moves on."""
    g = step.group
    assert g is not None
    g.drop_member(member_id)
    g.sessions.pop(member_id, None)
    g.revocations.pop(member_id, None)
    g.epoch += 1
    step.group_changed = True
    step.removed.add(member_id)
    step.changed.discard(member_id)
    step.fenced[member_id] = why


def tick(group: ConsumerGroup, settings: ConsumerSettings, topics: Topics, now: int) -> Step | None:
    """Members whose session ran out or who kept partitions past their rebalance timeout are
    removed; a target that is due is computed. None when nothing is due."""
    expired = sorted(m for m, due in group.sessions.items() if due <= now)
    late = sorted(
        m
        for m, (epoch, due) in group.revocations.items()
        if due <= now
        and (member := group.members.get(m)) is not None
        and member.member_epoch == epoch
        and member.state is MemberState.UNREVOKED_PARTITIONS
    )
    due_target = (
        group.epoch > group.assignment_epoch
        and now >= group.target_ms + settings.assignment_interval_ms
    )
    if not expired and not late and not due_target:
        return None
    step = Step(group.evolve())
    for member_id in expired:
        remove(step, member_id, "session timeout")
    for member_id in late:
        if member_id not in step.removed:
            remove(step, member_id, "rebalance timeout")
    maybe_assign(step, settings, topics, now)
    return step


def topics_changed(
    group: ConsumerGroup, settings: ConsumerSettings, topics: Topics, now: int
) -> Step | None:
    """A subscribed topic was created, deleted or grew: a new group epoch and target."""
    metadata_hash = subscription_hash(group, topics)
    if metadata_hash == group.metadata_hash:
        return None
    step = Step(group.evolve(), group_changed=True)
    assert step.group is not None
    step.group.metadata_hash = metadata_hash
    step.group.epoch += 1
    maybe_assign(step, settings, topics, now)
    return step


def place_member(
    step: Step,
    old: ConsumerMember | None,
    updated: ConsumerMember,
    bump: bool,
    settings: ConsumerSettings,
    topics: Topics,
    now: int,
) -> None:
    """Put a joining or heartbeating member (``updated``; ``old`` as the group had it) into
    ``step.group``: a static member back under a new id takes its old place; the group epoch
    moves when ``bump`` says so or the subscribed topics changed; a due target is computed."""
    g = step.group
    assert g is not None
    if old is not None and old.member_id != updated.member_id:  # a static member back
        g.drop_member(old.member_id)
        g.sessions.pop(old.member_id, None)
        g.revocations.pop(old.member_id, None)
        step.removed.add(old.member_id)
    g.put_member(updated)
    metadata_hash = subscription_hash(g, topics)
    if metadata_hash != g.metadata_hash:
        g.metadata_hash = metadata_hash
        bump = True
    if bump or g.target_stale:
        g.epoch += 1
        g.target_stale = False
        step.group_changed = True
    maybe_assign(step, settings, topics, now)


def maybe_assign(step: Step, settings: ConsumerSettings, topics: Topics, now: int) -> None:
    assert step.group is not None
    changed = assign_if_due(step.group, settings, topics, now)
    if changed is not None:
        step.changed |= changed
        step.group_changed = True


def reconcile_member(
    g: ConsumerGroup, member: ConsumerMember, topics: Topics, owned: Partitions | None, now: int
) -> ConsumerMember:
    subscribed = subscribed_ids(member, topics)
    reconciled = reconcile(
        member,
        g.assignment_epoch,
        subscribed.__contains__,
        lambda topic, p: g.owners.get((topic, p), member.member_id) != member.member_id,
        owned,
    )
    if reconciled is not member:
        g.put_member(reconciled)
    if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
        started = g.revocations.get(member.member_id)
        if started is None or started[0] != reconciled.member_epoch:
            due = now + reconciled.rebalance_timeout_ms
            g.revocations[member.member_id] = (reconciled.member_epoch, due)
    else:
        g.revocations.pop(member.member_id, None)
    return reconciled


def _given(value: str | None, current: str | None) -> str | None:
    return current if value is None else value


def _owned(wire: list[WirePartitions] | None) -> Partitions | None:
    if wire is None:
        return None
    owned: Partitions = {}
    for entry in wire:
        if entry.partitions:
            owned[entry.topic_id] = owned.get(entry.topic_id, frozenset()) | frozenset(
                entry.partitions
            )
    return owned


def _subset(owned: Partitions | None, assigned: Partitions) -> bool:
    if owned is None:
        return False
    return all(p <= assigned.get(topic, frozenset()) for topic, p in owned.items())


def _wire(partitions: Partitions) -> list[WirePartitions]:
    return [WirePartitions(topic, sorted(p)) for topic, p in sorted(partitions.items()) if p]
