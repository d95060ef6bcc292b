"""What CreateAcls, DescribeAcls and DeleteAcls share (docs/design/security.md, section 6).

As Kafka: without an authorizer (``KAFSCALE_AUTHORIZER=none``) each answers SECURITY_DISABLED;
describing needs DESCRIBE on the cluster and changing ALTER, else CLUSTER_AUTHORIZATION_FAILED.
Versions 1-3 (v0 has no pattern type: every ACL was literal).
"""

from __future__ import annotations

import logging

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.ipc.messages import AclsChanged, Message
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.errors import ErrorCode

MIN_VERSION, MAX_VERSION = 1, 3
DISABLED = "No Authorizer is configured on the broker (KAFSCALE_AUTHORIZER=none)"

log = logging.getLogger(__name__)

Outcome = tuple[ErrorCode, str | None]


def refusal(ctx: RequestContext, operation: AclOperation) -> Outcome | None:
    """Why the whole request is refused, or None."""
    if ctx.broker.config.authorizer != "acl":
        return ErrorCode.security_disabled, DISABLED
    if not authz.cluster_allowed(ctx, operation):
        return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
    return None


async def ask(ctx: RequestContext, message: Message) -> AclsChanged | Outcome:
    """The coordinator's answer, waited into this frontend's view; or why there is none."""
    try:
        reply = await ctx.broker.coordinator.call(message)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        return ErrorCode.request_timed_out, "the coordinator is unavailable"
    if not isinstance(reply, AclsChanged):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return ErrorCode.unknown_server_error, "the ACLs could not be changed"
    if reply.revision:
        await ctx.broker.coordinator.caught_up(reply.revision)
    return reply
