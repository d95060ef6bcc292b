"""CreateAcls (key 30), v1-v3: ``kafka-acls --add``. Each binding is checked as Kafka checks it
(``authorizer.binding_error``: INVALID_REQUEST with Kafka's message); the valid ones are written
by the coordinator in one transaction (``kafscale.coordinator.acls``) and apply on every broker
once their views hold them. The answer waits until this frontend's view does."""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend.authz import binding_of
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers import _acls
from kafscale.frontend.handlers._acls import MAX_VERSION, MIN_VERSION
from kafscale.ipc.messages import AclValue, CreateAcls
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import binding_error

API_KEY = 30
__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    outcomes: list[_acls.Outcome] = []
    refused = _acls.refusal(ctx, AclOperation.ALTER)
    valid: list[AclValue] = []
    for creation in request.creations:
        value = AclValue(
            int(creation.resource_type),
            creation.resource_name,
            int(creation.resource_pattern_type),
            creation.principal,
            creation.host,
            int(creation.operation),
            int(creation.permission_type),
        )
        if refused is not None:
            outcomes.append(refused)
        elif (problem := binding_error(binding_of(value))) is not None:
            outcomes.append((ErrorCode.invalid_request, problem))
        else:
            outcomes.append((ErrorCode.none, None))
            valid.append(value)
    if valid:
        answer = await _acls.ask(ctx, CreateAcls(valid))
        if isinstance(answer, tuple):
            outcomes = [answer if code is ErrorCode.none else (code, m) for code, m in outcomes]
    entry = element(schema, "results")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        results=tuple(
            build(entry, error_code=code, error_message=message) for code, message in outcomes
        ),
    )
