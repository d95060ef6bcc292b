"""SyncGroup (key 14), v0-v5: members wait for the leader's assignment, then each gets its own.
With ACLs on it needs READ on the group, else GROUP_AUTHORIZATION_FAILED without reaching the
coordinator."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask_authorized, respond
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.errors import ErrorCode

API_KEY = 14
MIN_VERSION, MAX_VERSION = 0, 5
# The leader may take its rebalance timeout (Java: max.poll.interval.ms, 5 min) to assign.
TIMEOUT_S = 330.0


async def handle(ctx: RequestContext, request: Any) -> Any:
    sync = messages.SyncGroup(
        group_id=request.group_id,
        generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=getattr(request, "protocol_type", None),
        protocol_name=getattr(request, "protocol_name", None),
        assignments=[(a.member_id, bytes(a.assignment)) for a in request.assignments],
    )
    reply = await ask_authorized(
        ctx, AclOperation.READ, request.group_id, sync, messages.SyncGroupResult, TIMEOUT_S
    )
    if isinstance(reply, ErrorCode):
        reply = messages.SyncGroupResult(int(reply))
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(reply.error_code),
        protocol_type=reply.protocol_type,
        protocol_name=reply.protocol_name,
        assignment=reply.assignment,
    )
