"""DescribeGroups (key 15), v0-v6: state, protocol and members (with their subscriptions and
assignments while the group is stable). An unknown group, or a consumer (KIP-848) one, is Dead:
with GROUP_ID_NOT_FOUND from v6 (KIP-1043), without an error before, as Kafka does.

With ACLs on, a group the principal may not DESCRIBE is GROUP_AUTHORIZATION_FAILED and not asked
for; authorized operations (v3+, when asked for) are the principal's on the group (KIP-430).
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import describe_permitted, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.acls import NOT_REQUESTED
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 15
MIN_VERSION, MAX_VERSION = 0, 6
NOT_FOUND_VERSION = 6  # before, an unknown group (or a consumer group) is Dead without error


def _failed(group_id: str, error: int) -> messages.GroupDescription:
    return messages.GroupDescription(group_id, error, "", "", "", [])


async def handle(ctx: RequestContext, request: Any) -> Any:
    groups = await describe_permitted(
        ctx,
        list(request.groups),
        messages.DescribeGroups,
        messages.GroupsDescribed,
        lambda reply: reply.groups,
        _failed,
    )
    if ctx.version < NOT_FOUND_VERSION:
        found = int(ErrorCode.group_id_not_found)
        dead = [messages.GroupDescription(g.group_id, 0, g.state, "", "", []) for g in groups]
        groups = [d if g.error_code == found else g for g, d in zip(groups, dead, strict=True)]
    with_operations = bool(getattr(request, "include_authorized_operations", False))
    group_class = element(schema(ctx, API_KEY), "groups")
    member_class = element(group_class, "members")
    return respond(
        ctx,
        API_KEY,
        groups=tuple(
            build(
                group_class,
                error_code=ErrorCode(g.error_code),
                error_message=g.error_message,
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
                # As Kafka: only for a group described without error.
                authorized_operations=authz.authorized_operations(
                    ctx, ResourceType.GROUP, g.group_id
                )
                if with_operations and not g.error_code
                else NOT_REQUESTED,
            )
            for g in groups
        ),
    )
