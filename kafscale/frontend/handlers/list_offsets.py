"""ListOffsets (key 2), v1-v10 (Kafka 4's range): the offset for a timestamp, per partition.

Special timestamps: -1 latest (the high watermark, or the log end when unflushed data is served),
-2 earliest (the log start), -3 (v7+) the first record with the largest timestamp, -4 (v8+)
earliest local = earliest (all of the log is equally "local"), -5 (v9+) latest tiered: no offset,
as Kafka answers for a topic without tiered storage. A timestamp >= 0 finds the first offset whose
record has a timestamp >= it, reading at most the one segment that holds it; none gives offset -1.
Each partition is answered by the shard that owns it, once this broker is found to lead it at the
client's leader epoch (``kafscale.frontend.leaders``: NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH
or UNKNOWN_LEADER_EPOCH otherwise), with the leader epoch that wrote the offset found. The
isolation level is accepted: without transactions the last stable offset is the high watermark.
v10 (KIP-1075, Kafka 4.0) only adds TimeoutMs, how long a tiered-storage broker may spend on a
remote lookup; it is ignorable, and ours are bounded by SHARD_TIMEOUT_S. Clients tell Kafka 4.0
from 3.9 by this version (kafka-python infers the broker's release from it), so serving v9 only
makes KafScale look like a 3.9 broker.
"""

from __future__ import annotations

import asyncio
import datetime
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.leaders import Leaders
from kafscale.ipc import messages
from kafscale.ipc.messages import OffsetAnswer, OffsetQuery
from kafscale.ipc.rpc import RpcError
from kafscale.metadata.records import TopicRecord
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 2
MIN_VERSION, MAX_VERSION = 1, 10
SHARD_TIMEOUT_S = 30.0
SPECIAL_LATEST = -1
# The oldest version that may ask for each special timestamp.
SPECIAL_SINCE = {-1: 0, -2: 0, -3: 7, -4: 8, -5: 9}

Key = tuple[str, int]


async def handle(ctx: RequestContext, request: Any) -> Any:
    snapshot = ctx.broker.view.snapshot
    leaders = Leaders(ctx, snapshot)
    answers: dict[Key, OffsetAnswer] = {}
    queries: list[tuple[Key, OffsetQuery]] = []
    described = authz.topics_allowed(ctx, AclOperation.DESCRIBE, (t.name for t in request.topics))
    for topic in request.topics:
        record = snapshot.topics.get(topic.name)
        for wanted in topic.partitions:
            key = (topic.name, int(wanted.partition_index))
            current_epoch = int(getattr(wanted, "current_leader_epoch", -1))  # v4+
            error = (
                check_partition(leaders, record, key[1], current_epoch)
                if topic.name in described
                else ErrorCode.topic_authorization_failed
            )
            timestamp = int(wanted.timestamp)
            if error is None and timestamp < 0 and SPECIAL_SINCE.get(timestamp, 99) > ctx.version:
                error = ErrorCode.unsupported_version
            if error is not None:
                answers[key] = OffsetAnswer(error_code=int(error))
            else:
                assert record is not None
                queries.append((key, offset_query(record, key[1], timestamp)))
    answers.update(await query(ctx, queries))
    return _response(ctx, request, answers)


def check_partition(
    leaders: Leaders, record: TopicRecord | None, partition: int, current_epoch: int
) -> ErrorCode | None:
    """The error of a partition that cannot be asked for (also OffsetForLeaderEpoch's)."""
    if record is None or not 0 <= partition < record.partitions:
        return ErrorCode.unknown_topic_or_partition
    return leaders.check(record.name, partition, current_epoch)


def offset_query(
    record: TopicRecord,
    partition: int,
    timestamp: int = SPECIAL_LATEST,
    leader_epoch: int | None = None,
) -> OffsetQuery:
    """The shard's query: the offset for ``timestamp``, or where ``leader_epoch`` ends."""
    return OffsetQuery(
        topic=record.name,
        topic_id=record.topic_id,
        partition=partition,
        timestamp=timestamp,
        topic_created_ms=record.created_ms,
        leader_epoch=leader_epoch,
    )


async def query(
    ctx: RequestContext, queries: Sequence[tuple[Key, OffsetQuery]]
) -> dict[Key, OffsetAnswer]:
    """Ask the owning shards, all shards at once."""
    by_shard: dict[int, list[tuple[Key, OffsetQuery]]] = defaultdict(list)
    for key, wanted in queries:
        by_shard[ctx.broker.shards.owner(wanted.topic_id, wanted.partition)].append((key, wanted))
    answers: dict[Key, OffsetAnswer] = {}

    async def ask(shard: int, items: list[tuple[Key, OffsetQuery]]) -> None:
        request = messages.ListOffsets(queries=[q for _, q in items])
        try:
            reply = await ctx.broker.shards.list_offsets(shard, request, SHARD_TIMEOUT_S)
        except RpcError as exc:
            for key, _ in items:
                answers[key] = OffsetAnswer(
                    error_code=int(ErrorCode.request_timed_out), message=f"shard {shard}: {exc}"
                )
            return
        for (key, _), answer in zip(items, reply.results, strict=True):
            answers[key] = answer

    await asyncio.gather(*(ask(shard, items) for shard, items in by_shard.items()))
    return answers


def _response(ctx: RequestContext, request: Any, answers: dict[Key, OffsetAnswer]) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    partition_class = nested(schema, "ListOffsetsPartitionResponse")
    topic_class = nested(schema, "ListOffsetsTopicResponse")
    topics = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            answer = answers[(topic.name, int(wanted.partition_index))]
            partitions.append(
                build(
                    partition_class,
                    partition_index=wanted.partition_index,
                    error_code=ErrorCode(answer.error_code),
                    timestamp=answer.timestamp,
                    offset=answer.offset,
                    leader_epoch=answer.leader_epoch,
                )
            )
        topics.append(build(topic_class, name=topic.name, partitions=tuple(partitions)))
    return build(schema, topics=tuple(topics), throttle_time=datetime.timedelta(0))
