"""ConsumerGroupHeartbeat (key 68), v0-v1: a member of a consumer (KIP-848) group joins, heartbeats,
reports what it owns and leaves; the coordinator answers its epoch and assignment
(docs/design/ecosystem.md, section 5). With ACLs on it needs READ on the group (else
GROUP_AUTHORIZATION_FAILED) and DESCRIBE on every topic it names (else
TOPIC_AUTHORIZATION_FAILED, naming them), as Kafka checks before the coordinator hears of it.
"""

from __future__ import annotations

import datetime
import uuid

from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.consumer_group_heartbeat.v1.response import ConsumerGroupHeartbeatResponse

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask_authorized, client_host, respond, schema
from kafscale.ipc.consumer_groups import (
    ConsumerGroupHeartbeat,
    ConsumerGroupHeartbeatResult,
    TopicIdPartitions,
)
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 68
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(
    ctx: RequestContext, request: ConsumerGroupHeartbeatRequest
) -> ConsumerGroupHeartbeatResponse:
    names = request.subscribed_topic_names
    if names:
        allowed = authz.topics_allowed(ctx, AclOperation.DESCRIBE, names)
        refused = sorted(set(names) - set(allowed))
        if refused:
            return _error(
                ctx,
                ErrorCode.topic_authorization_failed,
                f"Topic authorization failed for topics {refused}",
            )
    owned = request.topic_partitions
    beat = ConsumerGroupHeartbeat(
        version=ctx.version,
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=int(request.member_epoch),
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=list(names) if names is not None else None,
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor,
        topic_partitions=None
        if owned is None
        else [
            TopicIdPartitions(str(t.topic_id), [int(p) for p in t.partitions])
            for t in owned
            if t.topic_id is not None
        ],
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
    )
    reply = await ask_authorized(
        ctx, AclOperation.READ, request.group_id, beat, ConsumerGroupHeartbeatResult
    )
    if isinstance(reply, ErrorCode):
        return _error(ctx, reply, None)
    top = schema(ctx, API_KEY)
    assignment = None
    if reply.assignment is not None:
        assignment_class = element(top, "assignment")
        partitions_class = element(assignment_class, "topic_partitions")
        assignment = build(
            assignment_class,
            topic_partitions=tuple(
                build(
                    partitions_class,
                    topic_id=uuid.UUID(t.topic_id),
                    partitions=tuple(t.partitions),
                )
                for t in reply.assignment
            ),
        )
    response: ConsumerGroupHeartbeatResponse = respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(reply.error_code),
        error_message=reply.error_message,
        member_id=reply.member_id,
        member_epoch=reply.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=reply.heartbeat_interval_ms),
        assignment=assignment,
    )
    return response


def _error(
    ctx: RequestContext, code: ErrorCode, message: str | None
) -> ConsumerGroupHeartbeatResponse:
    response: ConsumerGroupHeartbeatResponse = respond(
        ctx,
        API_KEY,
        error_code=code,
        error_message=message,
        member_id=None,
        member_epoch=-1,
        heartbeat_interval=datetime.timedelta(0),
        assignment=None,
    )
    return response


def _ms(value: datetime.timedelta | int) -> int:
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)
