"""OffsetForLeaderEpoch (key 23), v2-v4: where a leader epoch ends, for log truncation checks.

Every partition has one leader epoch, 0, until partitions move between brokers. So epoch 0 ends
at the log's visible end (what ListOffsets calls latest), and any other epoch is unknown to the
log: UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET (-1, -1), as Kafka's leader answers an epoch it has
no record of. A consumer that read past that end (records lost in a crash, possible only when
unflushed data is served) sees the end below its position and resets, as against Kafka.
"""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers import list_offsets
from kafscale.ipc.messages import OffsetAnswer
from kafscale.metadata.records import TopicRecord
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.partition import LEADER_EPOCH

API_KEY = 23
MIN_VERSION, MAX_VERSION = 2, 4
UNDEFINED = -1

Key = tuple[str, int]


async def handle(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.view.snapshot.topics
    answers: dict[Key, OffsetAnswer] = {}
    queries: list[tuple[Key, TopicRecord, int, int]] = []
    for topic in request.topics:
        record = topics.get(topic.topic)
        for wanted in topic.partitions:
            key = (topic.topic, int(wanted.partition))
            error = list_offsets.check_partition(record, key[1], wanted.current_leader_epoch)
            if error is not None:
                answers[key] = OffsetAnswer(error_code=int(error))
            elif wanted.leader_epoch != LEADER_EPOCH:
                answers[key] = OffsetAnswer(offset=UNDEFINED, leader_epoch=UNDEFINED)
            else:
                assert record is not None
                queries.append((key, record, key[1], list_offsets.SPECIAL_LATEST))
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
