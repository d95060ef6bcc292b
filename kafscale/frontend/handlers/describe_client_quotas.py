"""DescribeClientQuotas (key 48), v0-v1: KafScale enforces no client quotas (produce, fetch or
request rates), so every filter matches nothing: an empty list, no error.

``kafka-configs --describe --entity-type users`` asks for quotas and SCRAM credentials together;
without this answer it fails before it shows the credentials (KIP-554's half of it).
"""

from __future__ import annotations

import datetime

from kio.schema.describe_client_quotas.v0.request import DescribeClientQuotasRequest as V0
from kio.schema.describe_client_quotas.v1.request import DescribeClientQuotasRequest as V1

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 48
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx: RequestContext, request: V0 | V1) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    allowed = authz.cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS)
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none if allowed else ErrorCode.cluster_authorization_failed,
        error_message=None,
        entries=() if allowed else None,
    )
