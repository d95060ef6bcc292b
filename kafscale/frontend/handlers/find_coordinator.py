"""FindCoordinator (key 10), v0-v6 (batched keys from v4): this broker coordinates every group.

Transaction coordinators (key type 1) and share groups (2) do not exist here: those keys get
INVALID_REQUEST with a message, so a transactional client fails at once with a reason instead of
retrying a retriable error forever. An empty group id is INVALID_REQUEST too.

As Kafka does, the first group lookup creates the internal topic ``__consumer_offsets``, whatever
``KAFSCALE_AUTO_CREATE_TOPICS`` says. KafScale keeps committed offsets in the metadata store, so
it has no partitions (``kafscale.coordinator.topics``): it exists so that clients see what they
see on Kafka, an internal topic, which e.g. regex subscriptions leave out.
"""

from __future__ import annotations

from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import respond, schema
from kafscale.ipc.messages import TopicSpec
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 10
MIN_VERSION, MAX_VERSION = 0, 6
GROUP = 0
BATCHED_VERSION = 4


async def handle(ctx: RequestContext, request: Any) -> Any:
    key_type = int(getattr(request, "key_type", GROUP))
    config = ctx.broker.config
    host, port, node = config.advertised_listener_host, config.broker_port, ctx.broker.node_id

    def answer(key: str) -> tuple[ErrorCode, str | None]:
        if key_type != GROUP:
            return ErrorCode.invalid_request, "KafScale coordinates consumer groups only"
        if not key:
            return ErrorCode.invalid_request, "the group id is empty"
        return ErrorCode.none, None

    keys = request.coordinator_keys if ctx.version >= BATCHED_VERSION else [request.key]
    if any(answer(key)[0] == ErrorCode.none for key in keys):
        await _ensure_offsets_topic(ctx)
    if ctx.version >= BATCHED_VERSION:
        coordinator = element(schema(ctx, API_KEY), "coordinators")
        found = []
        for key in request.coordinator_keys:
            error, message = answer(key)
            ok = error == ErrorCode.none
            found.append(
                build(
                    coordinator,
                    key=key,
                    node_id=node if ok else -1,
                    host=host if ok else "",
                    port=port if ok else -1,
                    error_code=error,
                    error_message=message,
                )
            )
        return respond(ctx, API_KEY, coordinators=tuple(found))
    error, message = answer(request.key)
    ok = error == ErrorCode.none
    return respond(
        ctx,
        API_KEY,
        error_code=error,
        error_message=message,
        node_id=node if ok else -1,
        host=host if ok else "",
        port=port if ok else -1,
    )


async def _ensure_offsets_topic(ctx: RequestContext) -> None:
    """Create ``__consumer_offsets`` unless the view has it; a failure (the coordinator is
    restarting) only means the next lookup tries again, so the lookup is answered anyway."""
    if OFFSETS_TOPIC not in ctx.broker.view.snapshot.topics:
        await ctx.broker.coordinator.create_topics([TopicSpec(name=OFFSETS_TOPIC, partitions=-1)])
