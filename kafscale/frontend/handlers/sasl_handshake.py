"""SaslHandshake (key 17), v0-v1: KafScale has no authentication, so no SASL mechanism.

Every mechanism is answered with UNSUPPORTED_SASL_MECHANISM and an empty list of enabled
mechanisms, and the connection stays open: a client configured for SASL reports "mechanism X not
enabled, server supports: []" instead of a dropped connection. (A Kafka broker answers a
SaslHandshake on a PLAINTEXT listener with ILLEGAL_SASL_STATE, whose message says less.)
"""

from __future__ import annotations

import logging
from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 17
MIN_VERSION, MAX_VERSION = 0, 1

log = logging.getLogger(__name__)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    log.warning(
        "SASL requested but authentication is off",
        extra={"mechanism": request.mechanism, "peer": ctx.peer},
    )
    return build(schema, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=())
