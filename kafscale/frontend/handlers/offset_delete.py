"""OffsetDelete (key 47), v0: remove a group's committed offsets, except for topics its active
members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC)."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 47
MIN_VERSION, MAX_VERSION = 0, 0


async def handle(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.view.snapshot.topics
    errors: dict[tuple[str, int], int] = {}
    wanted = []
    for topic in request.topics:
        record = topics.get(topic.name)
        for p in topic.partitions:
            key = (topic.name, int(p.partition_index))
            if record is None or not 0 <= key[1] < record.partitions:
                errors[key] = int(ErrorCode.unknown_topic_or_partition)
            else:
                wanted.append(key)
    reply = await ask(ctx, messages.OffsetDelete(request.group_id, wanted), messages.OffsetsDeleted)
    if isinstance(reply, ErrorCode):
        return respond(ctx, API_KEY, error_code=reply, topics=())
    if reply.error_code:
        return respond(ctx, API_KEY, error_code=ErrorCode(reply.error_code), topics=())
    errors.update({(t, p): code for t, p, code in reply.results})
    topic_class = element(schema(ctx, API_KEY), "topics")
    partition_class = element(topic_class, "partitions")
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode.none,
        topics=tuple(
            build(
                topic_class,
                name=topic.name,
                partitions=tuple(
                    build(
                        partition_class,
                        partition_index=p.partition_index,
                        error_code=ErrorCode(errors[(topic.name, int(p.partition_index))]),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        ),
    )
