"""InitProducerId (key 22), v0-v5, for idempotent (non-transactional) producers.

As Kafka does for a request without a transactional id, every call gets a fresh producer id
(allocated by the coordinator, unique across brokers and restarts) with epoch 0. Transactions
are out of scope: a transactional id is refused with UNSUPPORTED_VERSION, which clients report
as the broker not supporting the operation, instead of a retriable error they would loop on.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 22
MIN_VERSION, MAX_VERSION = 0, 5

log = logging.getLogger(__name__)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    if request.transactional_id is not None:
        log.warning(
            "refusing a transactional producer: transactions are not supported",
            extra={"transactional_id": request.transactional_id, "peer": ctx.peer},
        )
        return _response(schema, ErrorCode.unsupported_version, -1)
    idempotent = AclOperation.IDEMPOTENT_WRITE
    cluster = authz.allowed(
        ctx, idempotent, ResourceType.CLUSTER, authz.CLUSTER, count_denial=False
    )
    if not cluster and not authz.may_write_some_topic(ctx):  # KIP-679
        authz.denied(ctx, idempotent, ResourceType.CLUSTER, authz.CLUSTER)
        return _response(schema, ErrorCode.cluster_authorization_failed, -1)
    producer_id = await ctx.broker.coordinator.allocate_producer_id()
    if producer_id < 0:
        return _response(schema, ErrorCode.coordinator_not_available, -1)
    return _response(schema, ErrorCode.none, producer_id)


def _response(schema: type[Any], error: ErrorCode, producer_id: int) -> Any:
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=error,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
    )
