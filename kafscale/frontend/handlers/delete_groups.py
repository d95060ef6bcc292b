"""DeleteGroups (key 42), v0-v2: only empty groups can go (NON_EMPTY_GROUP otherwise); their
committed offsets go with them."""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import ask, respond, schema
from kafscale.ipc import messages
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 42
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx: RequestContext, request: Any) -> Any:
    names = list(request.groups_names)
    reply = await ask(ctx, messages.DeleteGroups(names), messages.GroupsDeleted)
    results = (
        [(name, int(reply)) for name in names] if isinstance(reply, ErrorCode) else reply.results
    )
    result_class = element(schema(ctx, API_KEY), "results")
    return respond(
        ctx,
        API_KEY,
        results=tuple(
            build(result_class, group_id=name, error_code=ErrorCode(code)) for name, code in results
        ),
    )
