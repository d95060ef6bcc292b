"""SaslHandshake (key 17), v0-v1: the client picks a SASL mechanism (docs/design/security.md,
section 4).

The connection's ``Authentication`` decides; this handler only answers. On a SASL listener a
mechanism of ``KAFSCALE_SASL_ENABLED_MECHANISMS`` is accepted (NONE, with the enabled list), and
the tokens follow in SaslAuthenticate requests (v1) or as bare frames (v0); any other mechanism
gets UNSUPPORTED_SASL_MECHANISM with the list, and the connection closes after the answer, as in
Kafka. On a PLAINTEXT or SSL listener there is nothing to pick: UNSUPPORTED_SASL_MECHANISM with an
empty list, and the connection stays open, so a client configured for SASL reports "mechanism X
not enabled, server supports: []" (Kafka answers ILLEGAL_SASL_STATE there, which says less).
"""

from __future__ import annotations

import logging

from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as V0Request
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as V1Request

from kafscale import metrics
from kafscale.frontend.context import RequestContext
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 17
MIN_VERSION, MAX_VERSION = 0, 1

log = logging.getLogger(__name__)


async def handle(ctx: RequestContext, request: V0Request | V1Request) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    auth = ctx.session.auth
    result = auth.handshake(request.mechanism, ctx.version)
    if result.error is not ErrorCode.none:
        if auth.sasl:
            metrics.SASL_AUTHENTICATIONS.labels(
                ctx.session.listener, _label(request.mechanism), "unsupported_mechanism"
            ).inc()
        log.warning(
            "SASL handshake refused: %s",
            "the listener has no SASL" if not auth.sasl else result.error.name,
            extra={
                "mechanism": request.mechanism,
                "enabled": list(result.mechanisms),
                "listener": ctx.session.listener,
                "peer": ctx.peer,
            },
        )
    return build(schema, error_code=result.error, mechanisms=result.mechanisms)


def _label(mechanism: str) -> str:
    """A metric label: one of the known mechanisms or "other" (a label per made-up name would
    let a client grow the metric without bound)."""
    return mechanism if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") else "other"
