"""AlterConfigs (key 33), v0-v2: replace the whole set of a topic's configs.

The configs named become the topic's configs; every other one returns to its default (a null
value means the default too), as Kafka's legacy AlterConfigs does. See ``_alter_configs`` for
the rules per resource, and ``kafscale.metadata.topic_configs`` for the configs accepted.
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._alter_configs import alter

API_KEY = 33
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx: RequestContext, request: Any) -> Any:
    return await alter(ctx, API_KEY, request, incremental=False)
