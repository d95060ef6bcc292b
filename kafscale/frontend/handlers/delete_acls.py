"""DeleteAcls (key 31), v1-v3: ``kafka-acls --remove``. Each filter selects bindings as Kafka's
filters do; the coordinator deletes everything selected in one transaction
(``kafscale.coordinator.acls``) and each filter's result lists what it removed. A filter Kafka
refuses is INVALID_REQUEST (the others still apply). The answer waits until this frontend's view
no longer holds them."""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers import _acls
from kafscale.frontend.handlers._acls import MAX_VERSION, MIN_VERSION
from kafscale.frontend.handlers.describe_acls import acl_filter
from kafscale.ipc.messages import AclFilterValue, AclValue, DeleteAcls
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import filter_error

API_KEY = 31
__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    refused = _acls.refusal(ctx, AclOperation.ALTER)
    outcomes: list[_acls.Outcome] = []
    valid: list[int] = []  # indexes of the filters sent to the coordinator
    wanted: list[AclFilterValue] = []
    for index, given in enumerate(request.filters):
        problem = filter_error(acl_filter(given))
        if refused is not None:
            outcomes.append(refused)
        elif problem is not None:
            outcomes.append((ErrorCode.invalid_request, problem))
        else:
            outcomes.append((ErrorCode.none, None))
            valid.append(index)
            wanted.append(
                AclFilterValue(
                    int(given.resource_type_filter),
                    given.resource_name_filter,
                    int(given.pattern_type_filter),
                    given.principal_filter,
                    given.host_filter,
                    int(given.operation),
                    int(given.permission_type),
                )
            )
    removed: dict[int, list[AclValue]] = {}
    if wanted:
        answer = await _acls.ask(ctx, DeleteAcls(wanted))
        if isinstance(answer, tuple):
            for index in valid:
                outcomes[index] = answer
        else:
            removed = dict(zip(valid, answer.deleted, strict=True))
    result = element(schema, "filter_results")
    matched = element(result, "matching_acls")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        filter_results=tuple(
            build(
                result,
                error_code=code,
                error_message=message,
                matching_acls=tuple(
                    build(
                        matched,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=acl.resource_type,
                        resource_name=acl.resource_name,
                        pattern_type=acl.pattern_type,
                        principal=acl.principal,
                        host=acl.host,
                        operation=acl.operation,
                        permission_type=acl.permission_type,
                    )
                    for acl in removed.get(index, [])
                ),
            )
            for index, (code, message) in enumerate(outcomes)
        ),
    )
