"""ListGroups (key 16), v0-v5: every group, filtered by state (v4+) and type (v5+; all groups
here are classic groups). With ACLs on, as Kafka: DESCRIBE on the cluster lists every group,
otherwise only the groups the principal may DESCRIBE are listed (the others left out silently)."""

from __future__ import annotations

from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, group_allowed, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 16
MIN_VERSION, MAX_VERSION = 0, 5


async def handle(ctx: RequestContext, request: Any) -> Any:
    query = messages.ListGroups(
        states=list(getattr(request, "states_filter", ())),
        types=list(getattr(request, "types_filter", ())),
    )
    reply = await ask(ctx, query, messages.GroupsListed)
    if isinstance(reply, ErrorCode):
        return respond(ctx, API_KEY, error_code=reply, groups=())
    every = authz.allowed(
        ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, authz.CLUSTER, count_denial=False
    )
    listed = [
        g
        for g in reply.groups
        if every or group_allowed(ctx, AclOperation.DESCRIBE, g.group_id, count_denial=False)
    ]
    group_class = element(schema(ctx, API_KEY), "groups")
    return respond(
        ctx,
        API_KEY,
        error_code=ErrorCode.none,
        groups=tuple(
            build(
                group_class,
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in listed
        ),
    )
