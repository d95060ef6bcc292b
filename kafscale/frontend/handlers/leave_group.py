"""LeaveGroup (key 13), v0-v5 (several members at once from v3, by instance id for static ones).
With ACLs on it needs READ on the group, else the top-level error is GROUP_AUTHORIZATION_FAILED
(no member results, as Kafka answers) and the coordinator hears nothing."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask_authorized, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 13
MIN_VERSION, MAX_VERSION = 0, 5
BATCHED_VERSION = 3


async def handle(ctx: RequestContext, request: Any) -> Any:
    batched = ctx.version >= BATCHED_VERSION
    members = (
        [
            messages.LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
            for m in request.members
        ]
        if batched
        else [messages.LeavingMember(request.member_id)]
    )
    reply = await ask_authorized(
        ctx,
        AclOperation.READ,
        request.group_id,
        messages.LeaveGroup(request.group_id, members),
        messages.LeaveGroupResult,
    )
    if isinstance(reply, ErrorCode):
        return respond(ctx, API_KEY, error_code=reply, members=())
    if not batched:
        [(_, _, error)] = reply.members
        return respond(ctx, API_KEY, error_code=ErrorCode(error))
    member = element(schema(ctx, API_KEY), "members")
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(reply.error_code),
        members=tuple(
            build(member, member_id=m, group_instance_id=i, error_code=ErrorCode(e))
            for m, i, e in reply.members
        ),
    )
