"""What the consumer-group handlers share: asking the coordinator process, and the answer when
it cannot be reached (COORDINATOR_NOT_AVAILABLE, which makes clients look for the coordinator
again and retry). With ACLs on, the handlers refuse a group the principal may not act on with
GROUP_AUTHORIZATION_FAILED before the coordinator hears of it (``group_allowed``,
``ask_authorized``)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

log = logging.getLogger(__name__)

M = TypeVar("M", bound=messages.Message)
R = TypeVar("R")
D = TypeVar("D")
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


def group_allowed(
    ctx: RequestContext, operation: AclOperation, group_id: str, *, count_denial: bool = True
) -> bool:
    """May the principal do ``operation`` on the group (always, without an authorizer)?"""
    return authz.allowed(ctx, operation, ResourceType.GROUP, group_id, count_denial=count_denial)


async def ask_authorized(
    ctx: RequestContext,
    operation: AclOperation,
    group_id: str,
    request: messages.Message,
    expected: type[M],
    timeout: float = DEFAULT_TIMEOUT_S,
) -> M | ErrorCode:
    """``ask``, if the principal may do ``operation`` on the group; GROUP_AUTHORIZATION_FAILED
    otherwise, whether the group exists or not, and the coordinator hears nothing."""
    if not group_allowed(ctx, operation, group_id):
        return ErrorCode.group_authorization_failed
    return await ask(ctx, request, expected, timeout)


def in_request_order(
    permitted: Sequence[bool], answers: Iterable[R], refusal: Callable[[int], R]
) -> list[R]:
    """The coordinator's ``answers`` to the permitted items of a request (one each, in order)
    and ``refusal(index)`` for the others, in the request's order."""
    if all(permitted):
        return list(answers)
    given = iter(answers)
    return [next(given) if ok else refusal(index) for index, ok in enumerate(permitted)]


async def describe_permitted(
    ctx: RequestContext,
    group_ids: list[str],
    request: Callable[[list[str]], messages.Message],
    expected: type[M],
    described: Callable[[M], list[D]],
    failed: Callable[[str, int], D],
) -> list[D]:
    """A description of each of ``group_ids``, in the request's order: the coordinator's
    (``described(reply)`` to ``request(groups)``) for the groups the principal may DESCRIBE,
    ``failed(group_id, error)`` for the others (GROUP_AUTHORIZATION_FAILED, the coordinator
    never hears of them) and for every group when the coordinator cannot be asked."""
    permitted = [group_allowed(ctx, AclOperation.DESCRIBE, g) for g in group_ids]
    asked = [g for g, ok in zip(group_ids, permitted, strict=True) if ok]
    answers: list[D] = []
    if asked:
        reply = await ask(ctx, request(asked), expected)
        if isinstance(reply, ErrorCode):
            answers = [failed(g, int(reply)) for g in asked]
        else:
            answers = described(reply)
    denied = int(ErrorCode.group_authorization_failed)
    return in_request_order(permitted, answers, lambda i: failed(group_ids[i], denied))


def schema(ctx: RequestContext, api_key: int) -> type[Any]:
    found = response_schema(api_key, ctx.version)
    assert found is not None
    return found


def respond(ctx: RequestContext, api_key: int, **values: Any) -> Any:
    return build(schema(ctx, api_key), throttle_time=NO_THROTTLE, **values)


def client_host(ctx: RequestContext) -> str:
    """As Kafka shows it: ``/`` and the client's address."""
    return "/" + ctx.peer.rsplit(":", 1)[0]
