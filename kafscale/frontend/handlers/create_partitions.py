"""CreatePartitions (key 37), v0-v3: grow a topic's partition count.

The coordinator checks and writes (``kafscale.coordinator.configs``): the count must be higher
than the current one (INVALID_PARTITIONS), the topic must exist (UNKNOWN_TOPIC_OR_PARTITION), and
explicit assignments must give each new partition this broker as its only replica
(INVALID_REPLICA_ASSIGNMENT otherwise). A topic named twice is INVALID_REQUEST. The answer waits
until this frontend's view holds the new count, so Metadata, Produce and Fetch see the new
partitions at once; ``timeout`` bounds the wait for the coordinator (REQUEST_TIMED_OUT).
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.ipc.messages import CreatePartitions, PartitionIncrease, TopicResults
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 37
MIN_VERSION, MAX_VERSION = 0, 3

MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 30.0

log = logging.getLogger(__name__)

Outcome = tuple[ErrorCode, str | None]


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    named = Counter(topic.name for topic in request.topics)
    outcomes: dict[int, Outcome] = {}
    increases: dict[int, PartitionIncrease] = {}
    for index, topic in enumerate(request.topics):
        if named[topic.name] > 1:
            outcomes[index] = (ErrorCode.invalid_request, "Duplicate topic in request.")
        elif not authz.allowed(ctx, AclOperation.ALTER, ResourceType.TOPIC, topic.name):
            outcomes[index] = (ErrorCode.topic_authorization_failed, None)
        else:
            increases[index] = PartitionIncrease(
                topic=topic.name,
                count=int(topic.count),
                assignments=None
                if topic.assignments is None
                else [[int(b) for b in a.broker_ids] for a in topic.assignments],
            )
    if increases:
        message = CreatePartitions(
            topics=list(increases.values()), validate_only=bool(request.validate_only)
        )
        timeout = min(max(request.timeout.total_seconds(), MIN_TIMEOUT_S), MAX_TIMEOUT_S)
        outcomes.update(zip(increases, await _ask(ctx, message, timeout), strict=True))
    result_class = element(schema, "results")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        results=tuple(
            build(
                result_class,
                name=topic.name,
                error_code=outcomes[index][0],
                error_message=outcomes[index][1],
            )
            for index, topic in enumerate(request.topics)
        ),
    )


async def _ask(ctx: RequestContext, message: CreatePartitions, timeout: float) -> list[Outcome]:
    try:
        reply = await ctx.broker.coordinator.call(message, timeout=timeout)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        unavailable = "the coordinator did not answer in time"  # the detail is logged, not sent
        return [(ErrorCode.request_timed_out, unavailable) for _ in message.topics]
    if not isinstance(reply, TopicResults):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return [(ErrorCode.unknown_server_error, "unexpected reply") for _ in message.topics]
    await ctx.broker.coordinator.caught_up(reply.revision)
    return [(ErrorCode(r.error_code), r.error_message) for r in reply.results]
