"""OffsetFetch (key 9), v1-v9 (several groups at once from v8; all of a group's partitions when
topics is null, v2+). A partition without a committed offset gets -1, so the client's
auto.offset.reset decides where it starts."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 9
MIN_VERSION, MAX_VERSION = 1, 9
GROUPS_VERSION = 8


async def handle(ctx: RequestContext, request: Any) -> Any:
    batched = ctx.version >= GROUPS_VERSION
    wanted = request.groups if batched else [request]
    queries = [
        messages.GroupOffsetsQuery(
            group.group_id,
            None
            if group.topics is None
            else [(t.name, int(p)) for t in group.topics for p in t.partition_indexes],
        )
        for group in wanted
    ]
    fetch = messages.OffsetFetch(queries, bool(getattr(request, "require_stable", False)))
    reply = await ask(ctx, fetch, messages.OffsetFetchResult)
    if isinstance(reply, ErrorCode):
        failed = messages.OffsetFetchResult(
            [messages.GroupOffsets(q.group_id, int(reply), []) for q in queries]
        )
        reply = failed
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
                for group in reply.groups
            ),
        )
    [group] = reply.groups
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(group.error_code),
        topics=_topics(element(top, "topics"), group.offsets),
    )


def _topics(topic_class: type[Any], offsets: list[messages.PartitionOffset]) -> tuple[Any, ...]:
    partition_class = element(topic_class, "partitions")
    by_topic: dict[str, list[messages.PartitionOffset]] = {}
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
