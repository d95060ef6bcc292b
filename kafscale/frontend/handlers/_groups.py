"""What the consumer-group handlers share: asking the coordinator process, and the answer when
it cannot be reached (COORDINATOR_NOT_AVAILABLE, which makes clients look for the coordinator
again and retry)."""

from __future__ import annotations

import datetime
import logging
from typing import Any, TypeVar

from kafscale.frontend.context import RequestContext
from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

M = TypeVar("M", bound=messages.Message)
DEFAULT_TIMEOUT_S = 30.0
NO_THROTTLE = datetime.timedelta(0)


async def ask(
    ctx: RequestContext,
    request: messages.Message,
    expected: type[M],
    timeout: float = DEFAULT_TIMEOUT_S,
) -> M | ErrorCode:
    """The coordinator's answer, or the error code to give the client instead."""
    try:
        reply = await ctx.broker.coordinator.call(request, timeout=timeout)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        return ErrorCode.coordinator_not_available
    if not isinstance(reply, expected):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return ErrorCode.coordinator_not_available
    return reply


def schema(ctx: RequestContext, api_key: int) -> type[Any]:
    found = response_schema(api_key, ctx.version)
    assert found is not None
    return found


def respond(ctx: RequestContext, api_key: int, **values: Any) -> Any:
    return build(schema(ctx, api_key), throttle_time=NO_THROTTLE, **values)


def client_host(ctx: RequestContext) -> str:
    """As Kafka shows it: ``/`` and the client's address."""
    return "/" + ctx.peer.rsplit(":", 1)[0]
