"""JoinGroup (key 11), v0-v9, answered by the coordinator's group state machine once the group's
join phase completes (which may take up to the rebalance timeout). With ACLs on it needs READ on
the group, else GROUP_AUTHORIZATION_FAILED without reaching the coordinator."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask_authorized, client_host, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 11
MIN_VERSION, MAX_VERSION = 0, 9
MEMBER_ID_REQUIRED_VERSION = 4
NULLABLE_VERSION = 7
SLACK_S = 30.0


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000)


async def handle(ctx: RequestContext, request: Any) -> Any:
    session_ms = _ms(request.session_timeout)
    rebalance = getattr(request, "rebalance_timeout", None)
    rebalance_ms = _ms(rebalance) if rebalance is not None else session_ms  # v0: the same
    join = messages.JoinGroup(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        require_known_member_id=ctx.version >= MEMBER_ID_REQUIRED_VERSION,
        reason=getattr(request, "reason", None),
    )
    timeout = rebalance_ms / 1000 + SLACK_S
    reply = await ask_authorized(
        ctx, AclOperation.READ, request.group_id, join, messages.JoinGroupResult, timeout
    )
    if isinstance(reply, ErrorCode):
        reply = messages.JoinGroupResult(int(reply), member_id=request.member_id)
    member = element(schema(ctx, API_KEY), "members")
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode(reply.error_code),
        generation_id=reply.generation_id,
        protocol_type=reply.protocol_type,
        # nullable only from v7 (an error answer has no protocol)
        protocol_name=reply.protocol_name
        if ctx.version >= NULLABLE_VERSION
        else reply.protocol_name or "",
        leader=reply.leader,
        skip_assignment=reply.skip_assignment,
        member_id=reply.member_id,
        members=tuple(
            build(
                member,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata,
            )
            for m in reply.members
        ),
    )
