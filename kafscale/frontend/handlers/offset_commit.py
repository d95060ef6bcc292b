"""OffsetCommit (key 8), v2-v9 (Kafka 4's range). Partitions of unknown topics get
UNKNOWN_TOPIC_OR_PARTITION here; the coordinator checks membership and stores the rest."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 8
MIN_VERSION, MAX_VERSION = 2, 9


async def handle(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.view.snapshot.topics
    offsets = []
    for topic in request.topics:
        record = topics.get(topic.name)
        for p in topic.partitions:
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
    commit = messages.OffsetCommit(
        group_id=request.group_id,
        generation_id=int(request.generation_id_or_member_epoch),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        offsets=offsets,
    )
    reply = await ask(ctx, commit, messages.OffsetCommitResult)
    codes = [int(reply)] * len(offsets) if isinstance(reply, ErrorCode) else reply.error_codes
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
                        error_code=ErrorCode(next(results)),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        ),
    )
