"""SaslAuthenticate (key 36), v0-v2, and the bare tokens that follow a SaslHandshake v0: one step
of the connection's SASL exchange (docs/design/security.md, section 4).

The connection's ``Authentication`` runs the mechanism and decides; this module answers, counts
(``kafscale_sasl_authentications_total{listener,mechanism,result}``) and logs. A refused token is
answered SASL_AUTHENTICATION_FAILED with Kafka's message, which never says whether the user
exists; the log line names the listener, the peer, the mechanism and the user name the client
gave, never a password or a proof (one line per client address per 10 s); then the connection
closes (``Connection``). From v1 a
successful answer carries the session's lifetime (KIP-368, ``KAFSCALE_CONNECTIONS_MAX_REAUTH_MS``).

After a SaslHandshake v0 there is no request header: the token is the whole frame and the reply
is the server's token alone, length-prefixed (``answer_raw``). A refusal there can only close the
connection (Kafka's old clients see the connection drop).
"""

from __future__ import annotations

import datetime
import logging
import struct
import time

from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest as V0Request
from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest as V1Request
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as V2Request

from kafscale import metrics
from kafscale.frontend.context import Broker, RequestContext, Session
from kafscale.frontend.limits import LogLimiter
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.sasl import AuthenticateResult

API_KEY = 36
MIN_VERSION, MAX_VERSION = 0, 2
LIFETIME_VERSION = 1

log = logging.getLogger(__name__)
# One line per client address per interval: a password-guessing client does not flood the log.
_failures_logged = LogLimiter(10.0)


async def handle(ctx: RequestContext, request: V0Request | V1Request | V2Request) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    result = _step(ctx.session, request.auth_bytes, ctx.peer)
    fields: dict[str, object] = {
        "error_code": result.error,
        "error_message": result.message,
        "auth_bytes": result.token,
    }
    if ctx.version >= LIFETIME_VERSION:
        fields["session_lifetime"] = datetime.timedelta(milliseconds=result.session_lifetime_ms)
    return build(schema, **fields)


def answer_raw(broker: Broker, session: Session, frame: bytes, peer: str) -> bytes | None:
    """The reply to a bare token (after a SaslHandshake v0): the server's token, length-prefixed;
    None when the exchange failed (the connection closes without an answer)."""
    result = _step(session, frame, peer)
    if result.error is not ErrorCode.none:
        return None
    return struct.pack(">i", len(result.token)) + result.token


def _step(session: Session, token: bytes, peer: str) -> AuthenticateResult:
    auth = session.auth
    mechanism = auth.mechanism or "none"
    reauthenticating = auth.authenticated
    result = auth.authenticate(token, int(time.monotonic() * 1000))
    if result.error is not ErrorCode.none:
        metrics.SASL_AUTHENTICATIONS.labels(session.listener, mechanism, "failed").inc()
        held_back = _failures_logged.allow(peer.rpartition(":")[0], time.monotonic())
        if held_back is not None:
            log.warning(
                "SASL authentication failed",
                extra={
                    "listener": session.listener,
                    "peer": peer,
                    "mechanism": mechanism,
                    "reason": result.log,
                    "failures_not_logged": held_back,
                },
            )
    elif result.completed:
        outcome = "reauthenticated" if reauthenticating else "ok"
        metrics.SASL_AUTHENTICATIONS.labels(session.listener, mechanism, outcome).inc()
        log.debug(
            "SASL %s",
            "re-authentication" if reauthenticating else "authentication",
            extra={
                "listener": session.listener,
                "peer": peer,
                "mechanism": mechanism,
                "principal": auth.principal,
            },
        )
    return result
