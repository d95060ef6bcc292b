"""Heartbeat (key 12), v0-v4: keeps a member's session; tells it when to rejoin. With ACLs on it
needs READ on the group, else GROUP_AUTHORIZATION_FAILED without reaching the coordinator."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask_authorized, respond
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.errors import ErrorCode

API_KEY = 12
MIN_VERSION, MAX_VERSION = 0, 4


async def handle(ctx: RequestContext, request: Any) -> Any:
    beat = messages.Heartbeat(
        group_id=request.group_id,
        generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    )
    reply = await ask_authorized(
        ctx, AclOperation.READ, request.group_id, beat, messages.GroupError
    )
    error = reply if isinstance(reply, ErrorCode) else ErrorCode(reply.error_code)
    return respond(ctx, API_KEY, error_code=error)
