"""DescribeGroups (key 15), v0-v5: state, protocol and members (with their subscriptions and
assignments while the group is stable). An unknown group is described as Dead, as Kafka does."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 15
MIN_VERSION, MAX_VERSION = 0, 5
NOT_REQUESTED = -(2**31)  # authorized_operations when not asked for


async def handle(ctx: RequestContext, request: Any) -> Any:
    group_ids = list(request.groups)
    reply = await ask(ctx, messages.DescribeGroups(group_ids), messages.GroupsDescribed)
    if isinstance(reply, ErrorCode):
        reply = messages.GroupsDescribed(
            [messages.GroupDescription(g, int(reply), "", "", "", []) for g in group_ids]
        )
    group_class = element(schema(ctx, API_KEY), "groups")
    member_class = element(group_class, "members")
    return respond(
        ctx,
        API_KEY,
        groups=tuple(
            build(
                group_class,
                error_code=ErrorCode(g.error_code),
                group_id=g.group_id,
                group_state=g.state,
                protocol_type=g.protocol_type,
                protocol_data=g.protocol,
                members=tuple(
                    build(
                        member_class,
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in g.members
                ),
                authorized_operations=NOT_REQUESTED,
            )
            for g in reply.groups
        ),
    )
