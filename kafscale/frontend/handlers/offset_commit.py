"""OffsetCommit (key 8), v2-v9 (Kafka 4's range). Partitions of unknown topics get
UNKNOWN_TOPIC_OR_PARTITION here; the coordinator checks membership and stores the rest.

With ACLs on, as Kafka: without READ on the group every partition is GROUP_AUTHORIZATION_FAILED;
a topic the principal may not READ has its partitions TOPIC_AUTHORIZATION_FAILED whether it
exists or not, and never reaches the coordinator (the authorized ones are still committed).
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, group_allowed, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 8
MIN_VERSION, MAX_VERSION = 2, 9


async def handle(ctx: RequestContext, request: Any) -> Any:
    if not group_allowed(ctx, AclOperation.READ, request.group_id):
        denied = ErrorCode.group_authorization_failed
        return _response(ctx, request, [denied] * sum(len(t.partitions) for t in request.topics))
    readable = authz.topics_allowed(ctx, AclOperation.READ, (t.name for t in request.topics))
    topics = ctx.broker.view.snapshot.topics
    offsets = []
    refusals: list[ErrorCode | None] = []  # per partition in request order; None: committed
    for topic in request.topics:
        record = topics.get(topic.name)
        for p in topic.partitions:
            if topic.name not in readable:  # before existence: nothing is revealed
                refusals.append(ErrorCode.topic_authorization_failed)
                continue
            refusals.append(None)
            known = record is not None and 0 <= p.partition_index < record.partitions
            offsets.append(
                messages.PartitionOffset(
                    topic.name,
                    int(p.partition_index),
                    int(p.committed_offset),
                    int(getattr(p, "committed_leader_epoch", -1)),
                    p.committed_metadata,
                    0 if known else int(ErrorCode.unknown_topic_or_partition),
                )
            )
    codes: list[int] = []
    if offsets or not any(refusals):  # as Kafka, nothing to ask when every topic was refused
        commit = messages.OffsetCommit(
            group_id=request.group_id,
            generation_id=int(request.generation_id_or_member_epoch),
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            offsets=offsets,
            version=ctx.version,
        )
        reply = await ask(ctx, commit, messages.OffsetCommitResult)
        codes = [int(reply)] * len(offsets) if isinstance(reply, ErrorCode) else reply.error_codes
    answered = iter(codes)
    return _response(
        ctx, request, [ErrorCode(next(answered)) if r is None else r for r in refusals]
    )


def _response(ctx: RequestContext, request: Any, codes: list[ErrorCode]) -> Any:
    """The answer with ``codes`` for the request's partitions, in order."""
    topic_class = element(schema(ctx, API_KEY), "topics")
    partition_class = element(topic_class, "partitions")
    results = iter(codes)
    return respond(
        ctx,
        API_KEY,
        topics=tuple(
            build(
                topic_class,
                name=topic.name,
                partitions=tuple(
                    build(
                        partition_class,
                        partition_index=p.partition_index,
                        error_code=next(results),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        ),
    )
