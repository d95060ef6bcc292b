"""Administration of the groups this broker coordinates: DescribeGroups, ListGroups and
DeleteGroups, on the state machine's groups (``group_membership.Membership``). Pure.

As on Kafka, each broker answers for the groups it coordinates: ListGroups lists only those
(admin clients ask every broker), DescribeGroups and DeleteGroups answer NOT_COORDINATOR for the
others. An unknown group is described as Dead; only an empty group can be deleted, its committed
offsets with it.
"""

from __future__ import annotations

from kafscale.coordinator.group_membership import Membership
from kafscale.coordinator.group_model import GroupState
from kafscale.ipc import messages
from kafscale.protocol.errors import ErrorCode


def describe(core: Membership, request: messages.DescribeGroups) -> messages.GroupsDescribed:
    described = []
    for group_id in request.group_ids:
        if not core.coordinates(group_id):
            code = int(ErrorCode.not_coordinator)
            described.append(messages.GroupDescription(group_id, code, "", "", "", []))
            continue
        group = core.groups.get(group_id)
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


def list_groups(core: Membership, request: messages.ListGroups) -> messages.GroupsListed:
    states = {s.lower() for s in request.states}
    if request.types and "classic" not in {t.lower() for t in request.types}:
        return messages.GroupsListed([])  # every group here is a classic group
    listed = [
        messages.GroupListing(g.group_id, g.protocol_type or "", g.state.value)
        for g in core.groups.values()
        if (not states or g.state.value.lower() in states) and core.coordinates(g.group_id)
    ]
    return messages.GroupsListed(sorted(listed, key=lambda g: g.group_id))


def delete(core: Membership, request: messages.DeleteGroups) -> messages.GroupsDeleted:
    results = []
    for group_id in request.group_ids:
        group = core.groups.get(group_id)
        if not core.coordinates(group_id):
            results.append((group_id, int(ErrorCode.not_coordinator)))
        elif group is None or group.state is GroupState.DEAD:
            results.append((group_id, int(ErrorCode.group_id_not_found)))
        elif group.state is not GroupState.EMPTY:
            results.append((group_id, int(ErrorCode.non_empty_group)))
        else:
            try:
                core.store.delete_group(group_id, list(group.offsets))
            except Exception as exc:
                results.append((group_id, int(core.store_failed(group, "deletion", exc))))
                continue
            group.state = GroupState.DEAD
            del core.groups[group_id]
            results.append((group_id, int(ErrorCode.none)))
    return messages.GroupsDeleted(results)
