"""OffsetDelete (key 47), v0: remove a group's committed offsets, except for topics its active
members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC). With ACLs on, as Kafka: without DELETE on the
group the answer is GROUP_AUTHORIZATION_FAILED; the partitions of a topic the principal may not
READ are TOPIC_AUTHORIZATION_FAILED, whether it exists or not, and never reach the coordinator."""

from __future__ import annotations

from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, group_allowed, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 47
MIN_VERSION, MAX_VERSION = 0, 0


async def handle(ctx: RequestContext, request: Any) -> Any:
    if not group_allowed(ctx, AclOperation.DELETE, request.group_id):
        return respond(ctx, API_KEY, error_code=ErrorCode.group_authorization_failed, topics=())
    readable = authz.topics_allowed(ctx, AclOperation.READ, (t.name for t in request.topics))
    topics = ctx.broker.view.snapshot.topics
    errors: dict[tuple[str, int], int] = {}
    wanted = []
    for topic in request.topics:
        record = topics.get(topic.name)
        for p in topic.partitions:
            key = (topic.name, int(p.partition_index))
            if topic.name not in readable:  # before existence: nothing is revealed
                errors[key] = int(ErrorCode.topic_authorization_failed)
            elif record is None or not 0 <= key[1] < record.partitions:
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
