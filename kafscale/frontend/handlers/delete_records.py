"""DeleteRecords (key 21), v0-v2: move partitions' log start offsets forward.

What ``kafka-delete-records``, ``Admin.deleteRecords`` and Kafka Streams (purging repartition
topics) send. Each partition is checked here -- DELETE on its topic (TOPIC_AUTHORIZATION_FAILED),
the topic and partition exist (UNKNOWN_TOPIC_OR_PARTITION), this broker leads it
(NOT_LEADER_OR_FOLLOWER: the admin client sends each partition to its leader) -- and moved by this
broker's coordinator (``kafscale.coordinator.log_start``: the high watermark for offset -1,
OFFSET_OUT_OF_RANGE past it, POLICY_VIOLATION for a topic whose cleanup.policy lacks delete). The
answer's ``low_watermark`` is the partition's log start after the call. ``timeout`` bounds the
wait for the coordinator (REQUEST_TIMED_OUT). docs/design/ecosystem.md, section 2.
"""

from __future__ import annotations

import datetime
import logging

from kio.schema.delete_records.v0.request import DeleteRecordsRequest as V0
from kio.schema.delete_records.v1.request import DeleteRecordsRequest as V1
from kio.schema.delete_records.v2.request import DeleteRecordsRequest as V2

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.leaders import Leaders
from kafscale.ipc.log_admin import LogStartMove, LogStartMoveResult, LogStartMoves, MoveLogStart
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 21
MIN_VERSION, MAX_VERSION = 0, 2
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 30.0

log = logging.getLogger(__name__)

Request = V0 | V1 | V2
Key = tuple[str, int]


async def handle(ctx: RequestContext, request: Request) -> object:
    snapshot = ctx.broker.view.snapshot
    leaders = Leaders(ctx, snapshot)
    allowed = authz.topics_allowed(ctx, AclOperation.DELETE, (t.name for t in request.topics))
    results: dict[Key, LogStartMoveResult] = {}
    moves: dict[Key, LogStartMove] = {}
    for topic in request.topics:
        record = snapshot.topics.get(topic.name)
        for wanted in topic.partitions:
            key = (topic.name, int(wanted.partition_index))
            if topic.name not in allowed:
                results[key] = _error(ErrorCode.topic_authorization_failed)
            elif record is None or not 0 <= key[1] < record.partitions:
                results[key] = _error(ErrorCode.unknown_topic_or_partition)
            elif (error := leaders.check(topic.name, key[1])) is not None:
                results[key] = _error(error)
            else:
                moves[key] = LogStartMove(topic.name, record.topic_id, key[1], int(wanted.offset))
    if moves:
        timeout = min(max(request.timeout.total_seconds(), MIN_TIMEOUT_S), MAX_TIMEOUT_S)
        results.update(zip(moves, await _move(ctx, list(moves.values()), timeout), strict=True))
    return _response(ctx, request, results)


async def _move(
    ctx: RequestContext, moves: list[LogStartMove], timeout: float
) -> list[LogStartMoveResult]:
    try:
        reply = await ctx.broker.coordinator.call(MoveLogStart(moves), timeout=timeout)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        return [_error(ErrorCode.request_timed_out) for _ in moves]
    if not isinstance(reply, LogStartMoves) or len(reply.results) != len(moves):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return [_error(ErrorCode.unknown_server_error) for _ in moves]
    for move, result in zip(moves, reply.results, strict=True):
        if result.error_code and result.error_message:
            log.info(
                "records not deleted",
                extra={
                    "topic": move.topic,
                    "partition": move.partition,
                    "offset": move.offset,
                    "error": result.error_message,
                    "peer": ctx.peer,
                },
            )
    return reply.results


def _error(code: ErrorCode) -> LogStartMoveResult:
    return LogStartMoveResult(error_code=int(code))


def _response(
    ctx: RequestContext, request: Request, results: dict[Key, LogStartMoveResult]
) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    partition_class = nested(schema, "DeleteRecordsPartitionResult")
    topic_class = nested(schema, "DeleteRecordsTopicResult")

    def answer(topic: str, index: int) -> object:
        result = results[(topic, index)]
        return build(
            partition_class,
            partition_index=index,
            low_watermark=result.log_start_offset,
            error_code=ErrorCode(result.error_code),
        )

    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        topics=tuple(
            build(
                topic_class,
                name=topic.name,
                partitions=tuple(
                    answer(topic.name, int(p.partition_index)) for p in topic.partitions
                ),
            )
            for topic in request.topics
        ),
    )
