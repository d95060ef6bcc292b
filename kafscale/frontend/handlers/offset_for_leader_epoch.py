"""OffsetForLeaderEpoch (key 23), v2-v4: where a leader epoch ends, for log truncation checks.

Consumers ask it (KIP-320) after the leader changed, to check that the position they reached at
some epoch is still in the log. Each partition is answered by the shard that owns it, from the
partition's leader epoch history (``PartitionLog.epochs``), as Kafka's
``LeaderEpochFileCache.endOffsetFor`` (``kafscale.metadata.epochs.end_offset_for``): the largest
epoch at or below the one asked for and the offset where the next epoch starts, or the log's
visible end (what ListOffsets calls latest) for the current epoch; an epoch newer than every known
one, or none, is UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET (-1, -1). KafScale never truncates
committed data, so a consumer's position is always inside the log; only one that read past the end
(records lost in a crash, possible only when unflushed data is served) sees the end below its
position and resets, as against Kafka. A partition this broker does not lead, or asked for at
another current leader epoch, is refused first (``kafscale.frontend.leaders``).
"""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers import list_offsets
from kafscale.frontend.leaders import Leaders
from kafscale.ipc.messages import OffsetAnswer, OffsetQuery
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 23
MIN_VERSION, MAX_VERSION = 2, 4
UNDEFINED = -1

Key = tuple[str, int]


async def handle(ctx: RequestContext, request: Any) -> Any:
    snapshot = ctx.broker.view.snapshot
    leaders = Leaders(ctx, snapshot)
    answers: dict[Key, OffsetAnswer] = {}
    queries: list[tuple[Key, OffsetQuery]] = []
    described = authz.topics_allowed(ctx, AclOperation.DESCRIBE, (t.topic for t in request.topics))
    for topic in request.topics:
        record = snapshot.topics.get(topic.topic)
        for wanted in topic.partitions:
            key = (topic.topic, int(wanted.partition))
            current_epoch = int(wanted.current_leader_epoch)
            error = (
                list_offsets.check_partition(leaders, record, key[1], current_epoch)
                if topic.topic in described
                else ErrorCode.topic_authorization_failed
            )
            if error is not None:
                answers[key] = OffsetAnswer(error_code=int(error))
            else:
                assert record is not None
                epoch = int(wanted.leader_epoch)
                queries.append((key, list_offsets.offset_query(record, key[1], leader_epoch=epoch)))
    answers.update(await list_offsets.query(ctx, queries))
    return _response(ctx, request, answers)


def _response(ctx: RequestContext, request: Any, answers: dict[Key, OffsetAnswer]) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    partition_class = nested(schema, "EpochEndOffset")
    topic_class = nested(schema, "OffsetForLeaderTopicResult")
    topics = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            answer = answers[(topic.topic, int(wanted.partition))]
            partitions.append(
                build(
                    partition_class,
                    error_code=ErrorCode(answer.error_code),
                    partition=wanted.partition,
                    leader_epoch=answer.leader_epoch if not answer.error_code else UNDEFINED,
                    end_offset=answer.offset if not answer.error_code else UNDEFINED,
                )
            )
        topics.append(build(topic_class, topic=topic.topic, partitions=tuple(partitions)))
    return build(schema, topics=tuple(topics), throttle_time=datetime.timedelta(0))
