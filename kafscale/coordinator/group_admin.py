"""Administration of the groups this broker coordinates: DescribeGroups, ListGroups and
DeleteGroups, on the state machine's groups (``group_membership.Membership``). Pure: DeleteGroups'
writes are instructions (``Write``).

As on Kafka, each broker answers for the groups it coordinates: ListGroups lists only those
(admin clients ask every broker), DescribeGroups and DeleteGroups answer NOT_COORDINATOR for the
others. An unknown group is described as Dead (GROUP_ID_NOT_FOUND, which the frontend gives
DescribeGroups v6+ only; so is a consumer group); only an empty group can be deleted, its committed
offsets with it.
"""

from __future__ import annotations

from kafscale.coordinator.group_membership import Membership
from kafscale.coordinator.group_model import (
    DeleteGroup,
    GroupState,
    Instructions,
    Reply,
    Token,
    Write,
)
from kafscale.ipc import messages
from kafscale.protocol.errors import ErrorCode


def describe(core: Membership, request: messages.DescribeGroups) -> messages.GroupsDescribed:
    described = []
    for group_id in request.group_ids:
        if not core.coordinates(group_id):
            code = int(ErrorCode.not_coordinator)
            described.append(messages.GroupDescription(group_id, code, "", "", "", []))
            continue
        if group_id in core.consumer.groups:
            described.append(_not_found(group_id, f"Group {group_id} is not a classic group."))
            continue
        group = core.groups.get(group_id)
        if group is None:
            described.append(_not_found(group_id, f"Group {group_id} not found."))
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


def _not_found(group_id: str, message: str) -> messages.GroupDescription:
    """Dead, GROUP_ID_NOT_FOUND: DescribeGroups v6+ says so (KIP-1043), older versions see a
    Dead group without error (the frontend drops it)."""
    code = int(ErrorCode.group_id_not_found)
    return messages.GroupDescription(group_id, code, GroupState.DEAD.value, "", "", [], message)


def list_groups(core: Membership, request: messages.ListGroups) -> messages.GroupsListed:
    states = {s.lower() for s in request.states}
    types = {t.lower() for t in request.types}
    listed = []
    if not types or "classic" in types:
        listed += [
            messages.GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in core.groups.values()
            if (not states or g.state.value.lower() in states)
            and core.coordinates(g.group_id)
            and g.group_id not in core.consumer.groups  # only its offsets are classic-kept
        ]
    if not types or "consumer" in types:
        listed += core.consumer.listings(states)
    return messages.GroupsListed(sorted(listed, key=lambda g: g.group_id))


def delete(
    core: Membership,
    token: Token,
    request: messages.DeleteGroups,
    consumer: dict[str, ErrorCode | None],
) -> Instructions:
    """``consumer[group_id]``: how deleting the consumer group of that id went (None: there is
    none, or this broker does not coordinate it)."""
    return _delete_each(core, token, list(request.group_ids), consumer, [])


def _delete_each(
    core: Membership,
    token: Token,
    group_ids: list[str],
    consumer: dict[str, ErrorCode | None],
    results: list[tuple[str, int]],
) -> Instructions:
    """The groups one after another, each deleted before the next is looked at."""
    for at, group_id in enumerate(group_ids):
        group = core.groups.get(group_id)
        deleted = consumer.get(group_id)
        if deleted is not None and (deleted is not ErrorCode.none or group is None):
            results.append((group_id, int(deleted)))  # refused, or no offsets to delete
        elif not core.coordinates(group_id):
            results.append((group_id, int(ErrorCode.not_coordinator)))
        elif group is None or group.state is GroupState.DEAD:
            results.append((group_id, int(ErrorCode.group_id_not_found)))
        elif group.state is not GroupState.EMPTY:
            results.append((group_id, int(ErrorCode.non_empty_group)))
        else:
            rest = group_ids[at + 1 :]

            def done(group_id: str = group_id, rest: list[str] = rest) -> Instructions:
                gone = core.groups.pop(group_id, None)
                if gone is not None:
                    gone.state = GroupState.DEAD
                results.append((group_id, int(ErrorCode.none)))
                return _delete_each(core, token, rest, consumer, results)

            def failed(
                code: ErrorCode, group_id: str = group_id, rest: list[str] = rest
            ) -> Instructions:
                results.append((group_id, int(code)))
                return _delete_each(core, token, rest, consumer, results)

            change = DeleteGroup(group_id, tuple(group.offsets))
            return [Write(group_id, "deletion", change, done, failed)]
    return [Reply(token, messages.GroupsDeleted(results))]
