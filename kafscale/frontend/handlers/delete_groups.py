"""DeleteGroups (key 42), v0-v2: only empty groups can go (NON_EMPTY_GROUP otherwise); their
committed offsets go with them. With ACLs on, a group the principal may not DELETE is
GROUP_AUTHORIZATION_FAILED, whether it exists or not, and is not sent to the coordinator."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import (
    ask,
    group_allowed,
    in_request_order,
    respond,
    schema,
)
from kafscale.ipc import messages
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 42
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx: RequestContext, request: Any) -> Any:
    names = list(request.groups_names)
    permitted = [group_allowed(ctx, AclOperation.DELETE, name) for name in names]
    asked = [name for name, ok in zip(names, permitted, strict=True) if ok]
    answered: list[tuple[str, int]] = []
    if asked or all(permitted):
        reply = await ask(ctx, messages.DeleteGroups(asked), messages.GroupsDeleted)
        answered = (
            [(name, int(reply)) for name in asked]
            if isinstance(reply, ErrorCode)
            else reply.results
        )
    denied = int(ErrorCode.group_authorization_failed)
    results = in_request_order(permitted, answered, lambda i: (names[i], denied))
    result_class = element(schema(ctx, API_KEY), "results")
    return respond(
        ctx,
        API_KEY,
        results=tuple(
            build(result_class, group_id=name, error_code=ErrorCode(code)) for name, code in results
        ),
    )
