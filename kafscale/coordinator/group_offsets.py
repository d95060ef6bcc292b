"""Committed offsets of the groups this broker coordinates: OffsetCommit, OffsetFetch and
OffsetDelete, on the state machine's groups (``group_membership.Membership``). Pure: the writes
are instructions (``Write``), the time an argument.

An offset is in memory only once the store took it, and a commit is acknowledged only then (in
the write's ``done``); a fenced write is answered NOT_COORDINATOR for every partition.
OffsetCommit with generation -1 from outside any member is accepted only while the group is empty
(simple consumers using assign(), and admin tools); otherwise member and generation must match,
and a group completing its rebalance answers REBALANCE_IN_PROGRESS.
"""

from __future__ import annotations

from collections.abc import Callable

from kafscale.coordinator.group_membership import Membership
from kafscale.coordinator.group_model import (
    DeleteOffsets,
    Group,
    GroupState,
    Instructions,
    Reply,
    SaveOffsets,
    Token,
    TopicPartition,
    Write,
    member_error,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import PartitionOffset
from kafscale.metadata.records import OffsetRecord
from kafscale.protocol.errors import ErrorCode


def commit(
    core: Membership, token: Token, request: messages.OffsetCommit, now: int
) -> Instructions:
    error = _commit_error(core, request)
    if error is not None:
        return [Reply(token, messages.OffsetCommitResult([int(error)] * len(request.offsets)))]
    group = core.groups.get(request.group_id)
    if group is None:
        group = core.groups[request.group_id] = Group(request.group_id)
    if request.member_id in group.members:
        member = group.members[request.member_id]
        member.expires_ms = max(member.expires_ms, now + member.session_timeout_ms)
    codes: list[int] = []
    accepted: dict[TopicPartition, OffsetRecord] = {}
    for offset in request.offsets:
        metadata = offset.metadata or ""
        if offset.error_code:
            codes.append(offset.error_code)
        elif len(metadata.encode()) > core.settings.max_metadata_bytes:
            codes.append(int(ErrorCode.offset_metadata_too_large))
        else:
            accepted[(offset.topic, offset.partition)] = OffsetRecord(
                offset.offset, offset.leader_epoch, metadata, now
            )
            codes.append(int(ErrorCode.none))
    if not accepted:
        return [Reply(token, messages.OffsetCommitResult(codes))]

    def stored() -> Instructions:
        group.offsets.update(accepted)
        return [Reply(token, messages.OffsetCommitResult(codes))]

    def refused(code: ErrorCode) -> Instructions:
        return [Reply(token, messages.OffsetCommitResult([c or int(code) for c in codes]))]

    change = SaveOffsets(group.group_id, accepted)
    return [Write(group.group_id, "offsets", change, stored, refused)]


def _commit_error(core: Membership, request: messages.OffsetCommit) -> ErrorCode | None:
    group = core.groups.get(request.group_id)
    simple = request.generation_id < 0
    if not request.group_id:
        return ErrorCode.invalid_group_id
    if not core.coordinates(request.group_id):
        return ErrorCode.not_coordinator
    if request.group_id in core.consumer.groups:
        return core.consumer.commit_error(request)
    if group is not None and group.state is GroupState.DEAD:
        return ErrorCode.coordinator_not_available
    if simple and (group is None or group.state is GroupState.EMPTY):
        return None
    if group is None:
        return ErrorCode.illegal_generation
    if group.state is GroupState.COMPLETING_REBALANCE:
        return ErrorCode.rebalance_in_progress
    error = member_error(group, request.member_id, request.group_instance_id)
    if error is None and request.generation_id != group.generation:
        return ErrorCode.illegal_generation
    return error


def fetch(core: Membership, request: messages.OffsetFetch) -> messages.OffsetFetchResult:
    results = []
    for query in request.groups:
        if not core.coordinates(query.group_id):
            code = int(ErrorCode.not_coordinator)
            results.append(messages.GroupOffsets(query.group_id, code, []))
            continue
        refused = core.consumer.fetch_error(query)
        if refused is not None:
            results.append(messages.GroupOffsets(query.group_id, int(refused), []))
            continue
        group = core.groups.get(query.group_id)
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


def delete(
    core: Membership,
    token: Token,
    request: messages.OffsetDelete,
    subscribed: Callable[[Group], set[str]],
) -> Instructions:
    """OffsetDelete: ``subscribed(group)`` names the topics its members consume, whose offsets
    cannot be deleted while the group is active."""
    if not core.coordinates(request.group_id):
        return [Reply(token, messages.OffsetsDeleted(int(ErrorCode.not_coordinator)))]
    group = core.groups.get(request.group_id)
    if group is None or group.state is GroupState.DEAD:
        return [Reply(token, messages.OffsetsDeleted(int(ErrorCode.group_id_not_found)))]
    busy = subscribed(group) if group.state is not GroupState.EMPTY else set()
    busy |= core.consumer.subscribed_names(group.group_id)
    results, doomed = [], []
    for topic, partition in request.partitions:
        if topic in busy:
            results.append((topic, partition, int(ErrorCode.group_subscribed_to_topic)))
        else:
            results.append((topic, partition, int(ErrorCode.none)))
            if (topic, partition) in group.offsets:
                doomed.append((topic, partition))
    answer = messages.OffsetsDeleted(int(ErrorCode.none), results)
    if not doomed:
        return [Reply(token, answer)]

    def deleted() -> Instructions:
        for key in doomed:
            group.offsets.pop(key, None)
        return [Reply(token, answer)]

    def refused(code: ErrorCode) -> Instructions:
        return [Reply(token, messages.OffsetsDeleted(int(code)))]

    change = DeleteOffsets(group.group_id, tuple(doomed))
    return [Write(group.group_id, "offset deletion", change, deleted, refused)]
