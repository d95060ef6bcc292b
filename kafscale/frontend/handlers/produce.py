"""Produce (key 0), v3-v11 (advertised from v0 as Kafka 4 does; v0-v2 are not served).

Each partition's records go to the shard that owns the partition; one request to each shard
involved, all shards concurrently. Per-partition problems are per-partition errors. acks must be
-1, 0 or 1 (INVALID_REQUIRED_ACKS otherwise); acks=0 gets no response at all, acks=1 is answered
once the batch is in the shard's buffer, acks=all once its segment is committed (see the
durability contract in ARCHITECTURE.md). Unknown topics are created when auto-creation is on.
Internal topics (``__consumer_offsets``) are refused with INVALID_TOPIC_EXCEPTION, as Kafka refuses
clients' appends to them, and never auto-created here. A partition this broker does not lead
(the view's leader key) gets NOT_LEADER_OR_FOLLOWER without reaching a shard; from v10 every
NOT_LEADER_OR_FOLLOWER answer, ours or the shard's, names the current leader and the response
carries its endpoint (KIP-951, ``kafscale.frontend.leaders``). With ACLs on, a partition of a
topic the principal may not WRITE is TOPIC_AUTHORIZATION_FAILED, whether the topic exists or not,
and only topics it may also CREATE (on the cluster or the topic) are auto-created.
"""

from __future__ import annotations

import asyncio
import datetime
from collections import defaultdict
from typing import Any

from kafscale.frontend import authz, leaders
from kafscale.frontend.context import RequestContext
from kafscale.frontend.leaders import Leaders
from kafscale.ipc import messages
from kafscale.ipc.messages import AppendEntry, AppendResult, TopicSpec
from kafscale.ipc.rpc import RpcError
from kafscale.metadata import topic_configs
from kafscale.metadata.records import TopicRecord
from kafscale.metadata.topic_names import INTERNAL_TOPICS
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.compression import Codec
from kafscale.protocol.errors import ErrorCode

API_KEY = 0
MIN_VERSION, MAX_VERSION = 0, 11
FIRST_SERVED_VERSION = 3
FIRST_CURRENT_LEADER_VERSION = 10  # KIP-951: CurrentLeader and NodeEndpoints
VALID_ACKS = (-1, 0, 1)
SHARD_TIMEOUT_SLACK_S = 5.0

_CODECS = {
    "uncompressed": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
    "none": Codec.NONE,
}


async def handle(ctx: RequestContext, request: Any) -> Any:
    acks = int(request.acks)
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    writable = authz.topics_allowed(ctx, AclOperation.WRITE, (t.name for t in request.topic_data))
    topics = await _topics(
        ctx, [t.name for t in request.topic_data if t.name not in INTERNAL_TOPICS], writable
    )
    leadership = Leaders(ctx)
    results: dict[tuple[str, int], AppendResult] = {}
    batches: dict[int, list[tuple[tuple[str, int], AppendEntry, bytes]]] = defaultdict(list)
    for topic in request.topic_data:
        record = topics.get(topic.name)
        for data in topic.partition_data:
            key = (topic.name, int(data.index))
            if acks not in VALID_ACKS:
                results[key] = _error(ErrorCode.invalid_required_acks, f"acks={acks}")
            elif topic.name not in writable:  # before existence: nothing is revealed
                results[key] = _error(ErrorCode.topic_authorization_failed, None)
            elif topic.name in INTERNAL_TOPICS:
                message = f"cannot append to internal topic {topic.name}"
                results[key] = _error(ErrorCode.invalid_topic_exception, message)
            elif record is None or not 0 <= data.index < record.partitions:
                results[key] = _error(ErrorCode.unknown_topic_or_partition, None)
            elif data.records is None:
                results[key] = _error(ErrorCode.invalid_record, "no records")
            elif (refused := leadership.check(*key)) is not None:
                results[key] = _error(refused, None)
            else:
                entry = _entry(ctx, record, int(data.index))
                shard = ctx.broker.shards.owner(record.topic_id, int(data.index))
                batches[shard].append((key, entry, data.records))
    # One task per shard, made here in the request's first step, even for a single shard:
    # tasks run in the order they are made, so a connection's pipelined requests reach every
    # shard in request order (an idempotent producer's batches must be appended in order; a
    # later request's send awaited directly would overtake an earlier one's spawned sends).
    await asyncio.gather(
        *(_send(ctx, shard, acks, timeout_ms, b, results) for shard, b in batches.items())
    )
    if acks == 0:
        return None
    return _response(ctx, request, results, leadership)


async def _topics(
    ctx: RequestContext, names: list[str], writable: set[str]
) -> dict[str, TopicRecord]:
    """The records of ``names``; missing writable ones auto-created when the broker and the
    ACLs allow it (CREATE on the cluster or the topic)."""
    known = ctx.broker.view.snapshot.topics
    missing = [
        name
        for name in names
        if name not in known and name in writable and authz.may_create_topic(ctx, name)
    ]
    if missing and ctx.broker.config.auto_create_topics:
        await ctx.broker.coordinator.create_topics(
            [TopicSpec(name=name, partitions=-1) for name in missing]
        )
        known = ctx.broker.view.snapshot.topics
    return {name: known[name] for name in names if name in known}


def _entry(ctx: RequestContext, record: TopicRecord, partition: int) -> AppendEntry:
    configs = topic_configs.effective(record.configs, topic_configs.defaults(ctx.broker.config))
    compression = configs["compression.type"]
    if compression == "producer":
        compression = ctx.broker.config.compression_codec
    return AppendEntry(
        topic=record.name,
        topic_id=record.topic_id,
        partition=partition,
        max_message_bytes=int(configs["max.message.bytes"]),
        log_append_time=configs["message.timestamp.type"] == "LogAppendTime",
        codec=int(_CODECS[compression]),
        allow_zstd=ctx.version >= 7,
        topic_created_ms=record.created_ms,
        segment_bytes=int(configs["segment.bytes"]),
        timestamp_before_max_ms=int(configs["message.timestamp.before.max.ms"]),
        timestamp_after_max_ms=int(configs["message.timestamp.after.max.ms"]),
        compacted="compact" in configs["cleanup.policy"].split(","),
    )


async def _send(
    ctx: RequestContext,
    shard: int,
    acks: int,
    timeout_ms: int,
    items: list[tuple[tuple[str, int], AppendEntry, bytes]],
    results: dict[tuple[str, int], AppendResult],
) -> None:
    request = messages.Append(
        acks=acks, timeout_ms=timeout_ms, entries=[entry for _, entry, _ in items]
    )
    try:
        reply = await ctx.broker.shards.append(
            shard,
            request,
            [data for _, _, data in items],
            timeout=timeout_ms / 1000 + SHARD_TIMEOUT_SLACK_S,
        )
    except RpcError as exc:
        for key, _, _ in items:
            results[key] = _error(ErrorCode.request_timed_out, f"shard {shard}: {exc}")
        return
    for (key, _, _), result in zip(items, reply.results, strict=True):
        results[key] = result


def _error(code: ErrorCode, message: str | None) -> AppendResult:
    return AppendResult(error_code=int(code), message=message)


def _response(
    ctx: RequestContext,
    request: Any,
    results: dict[tuple[str, int], AppendResult],
    leadership: Leaders,
) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    partition_class = nested(schema, "PartitionProduceResponse")
    topic_class = nested(schema, "TopicProduceResponse")
    hints = ctx.version >= FIRST_CURRENT_LEADER_VERSION
    topics = []
    for topic in request.topic_data:
        partitions = []
        for data in topic.partition_data:
            result = results[(topic.name, int(data.index))]
            hint: dict[str, Any] = {}
            if hints and result.error_code == ErrorCode.not_leader_or_follower:
                hint["current_leader"] = leaders.leader_id_and_epoch(
                    nested(schema, "LeaderIdAndEpoch"),
                    leadership.current_leader(topic.name, int(data.index)),
                )
            partitions.append(
                build(
                    partition_class,
                    index=data.index,
                    error_code=ErrorCode(result.error_code),
                    base_offset=result.base_offset,
                    log_append_time=_timestamp(result.log_append_time),
                    log_start_offset=result.log_start_offset,
                    record_errors=(),
                    error_message=result.message if result.error_code else None,
                    **hint,
                )
            )
        topics.append(build(topic_class, name=topic.name, partition_responses=tuple(partitions)))
    endpoints: tuple[Any, ...] = ()
    if hints:
        endpoint_class = nested(schema, "NodeEndpoint")
        endpoints = tuple(
            leaders.node_endpoint(endpoint_class, b) for b in leadership.node_endpoints()
        )
    return build(
        schema,
        responses=tuple(topics),
        throttle_time=datetime.timedelta(0),
        node_endpoints=endpoints,
    )


def _timestamp(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
