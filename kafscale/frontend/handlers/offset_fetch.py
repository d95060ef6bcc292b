"""OffsetFetch (key 9), v1-v9 (several groups at once from v8; all of a group's partitions when
topics is null, v2+). A partition without a committed offset gets -1, so the client's
auto.offset.reset decides where it starts.

With ACLs on, as Kafka: a group the principal may not DESCRIBE is GROUP_AUTHORIZATION_FAILED (per
partition in v1, which has no group error) and is not asked for; a named topic it may not
DESCRIBE has its partitions TOPIC_AUTHORIZATION_FAILED, and asked for every topic, those topics
are left out silently.
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import (
    ask,
    group_allowed,
    in_request_order,
    respond,
    schema,
)
from kafscale.ipc import messages
from kafscale.ipc.messages import GroupOffsets, PartitionOffset
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 9
MIN_VERSION, MAX_VERSION = 1, 9
GROUP_ERROR_VERSION = 2  # before, a group's error is each partition's
GROUPS_VERSION = 8


async def handle(ctx: RequestContext, request: Any) -> Any:
    batched = ctx.version >= GROUPS_VERSION
    wanted = request.groups if batched else [request]
    permitted = [group_allowed(ctx, AclOperation.DESCRIBE, group.group_id) for group in wanted]
    queries = []
    refused: list[list[PartitionOffset]] = []  # per query: its topics the principal may not see
    for group, ok in zip(wanted, permitted, strict=True):
        if not ok:
            continue
        member = getattr(group, "member_id", None), int(getattr(group, "member_epoch", -1))
        if group.topics is None:
            queries.append(messages.GroupOffsetsQuery(group.group_id, None, *member))
            refused.append([])
            continue
        named = authz.topics_allowed(ctx, AclOperation.DESCRIBE, (t.name for t in group.topics))
        asked = [
            (t.name, int(p)) for t in group.topics if t.name in named for p in t.partition_indexes
        ]
        queries.append(messages.GroupOffsetsQuery(group.group_id, asked, *member))
        refused.append(_partitions(group, ErrorCode.topic_authorization_failed, leaving_out=named))
    answers: list[GroupOffsets] = []
    if queries or all(permitted):
        fetch = messages.OffsetFetch(queries, bool(getattr(request, "require_stable", False)))
        reply = await ask(ctx, fetch, messages.OffsetFetchResult)
        answers = (
            [GroupOffsets(q.group_id, int(reply), []) for q in queries]
            if isinstance(reply, ErrorCode)
            else [
                _visible(ctx, query, answer, hidden)
                for query, answer, hidden in zip(queries, reply.groups, refused, strict=False)
            ]
        )
    groups = in_request_order(permitted, answers, lambda index: _refusal(ctx, wanted[index]))
    top = schema(ctx, API_KEY)
    if batched:
        group_class = element(top, "groups")
        return respond(
            ctx,
            API_KEY,
            groups=tuple(
                build(
                    group_class,
                    group_id=group.group_id,
                    error_code=ErrorCode(group.error_code),
                    topics=_topics(element(group_class, "topics"), group.offsets),
                )
                for group in groups
            ),
        )
    [group] = groups
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(group.error_code),
        topics=_topics(element(top, "topics"), group.offsets),
    )


def _visible(
    ctx: RequestContext,
    query: messages.GroupOffsetsQuery,
    answer: GroupOffsets,
    refused: list[PartitionOffset],
) -> GroupOffsets:
    """The coordinator's answer as the principal may see it: every topic asked for, only those
    it may DESCRIBE (silently); named topics, the refused ones added back as refused."""
    if answer.error_code:
        return answer
    if query.partitions is not None:
        return GroupOffsets(answer.group_id, answer.error_code, answer.offsets + refused)
    described = authz.topics_allowed(
        ctx, AclOperation.DESCRIBE, (o.topic for o in answer.offsets), count_denial=False
    )
    offsets = [o for o in answer.offsets if o.topic in described]
    return GroupOffsets(answer.group_id, answer.error_code, offsets)


def _refusal(ctx: RequestContext, group: Any) -> GroupOffsets:
    """A group the principal may not DESCRIBE; before v2 each partition carries the error."""
    denied = ErrorCode.group_authorization_failed
    offsets = _partitions(group, denied) if ctx.version < GROUP_ERROR_VERSION else []
    return GroupOffsets(group.group_id, int(denied), offsets)


def _partitions(
    group: Any, error: ErrorCode, leaving_out: set[str] | None = None
) -> list[PartitionOffset]:
    """The group's requested partitions, but those of ``leaving_out``, answered ``error``."""
    return [
        PartitionOffset(t.name, int(p), error_code=int(error))
        for t in group.topics or ()
        if leaving_out is None or t.name not in leaving_out
        for p in t.partition_indexes
    ]


def _topics(topic_class: type[Any], offsets: list[PartitionOffset]) -> tuple[Any, ...]:
    partition_class = element(topic_class, "partitions")
    by_topic: dict[str, list[PartitionOffset]] = {}
    for offset in offsets:
        by_topic.setdefault(offset.topic, []).append(offset)
    return tuple(
        build(
            topic_class,
            name=name,
            partitions=tuple(
                build(
                    partition_class,
                    partition_index=o.partition,
                    committed_offset=o.offset,
                    committed_leader_epoch=o.leader_epoch,
                    metadata=o.metadata,
                    error_code=ErrorCode(o.error_code),
                )
                for o in found
            ),
        )
        for name, found in by_topic.items()
    )
