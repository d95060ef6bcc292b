"""IncrementalAlterConfigs (key 44), v0-v1: SET, DELETE, APPEND, SUBTRACT single topic configs.

KIP-339: each change applies to the topic's current configs; APPEND and SUBTRACT only to
list-typed configs (INVALID_CONFIG otherwise), a config named twice in one resource or a null
value to SET is INVALID_REQUEST. See ``_alter_configs`` for the rules per resource.
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._alter_configs import alter

API_KEY = 44
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx: RequestContext, request: Any) -> Any:
    return await alter(ctx, API_KEY, request, incremental=True)
