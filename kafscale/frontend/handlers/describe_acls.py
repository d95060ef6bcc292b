"""DescribeAcls (key 29), v1-v3: ``kafka-acls --list``. Answered from this frontend's view: the
bindings the filter selects as Kafka's filters do (``ANY`` and ``MATCH`` included), grouped by
resource pattern. A filter Kafka refuses (an UNKNOWN code) is INVALID_REQUEST."""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend.authz import binding_of
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers import _acls
from kafscale.frontend.handlers._acls import MAX_VERSION, MIN_VERSION
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import AclBinding, filter_error, matching
from kafscale.security.authorizer import AclBindingFilter as Filter
from kafscale.security.authorizer import binding_from_codes as codes

API_KEY = 29
__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]


def acl_filter(request: Any) -> Filter:
    """A Describe/DeleteAcls filter as the authorizer's (None strings match anything)."""
    shape = codes(
        int(request.resource_type_filter),
        "",
        int(request.pattern_type_filter),
        "",
        "",
        int(request.operation),
        int(request.permission_type),
    )
    return Filter(
        shape.resource_type,
        request.resource_name_filter,
        shape.pattern_type,
        request.principal_filter,
        request.host_filter,
        shape.operation,
        shape.permission_type,
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    code: ErrorCode = ErrorCode.none
    message: str | None = None
    found: list[AclBinding] = []
    refused = _acls.refusal(ctx, AclOperation.DESCRIBE)
    selection = acl_filter(request)
    if refused is not None:
        code, message = refused
    elif (problem := filter_error(selection)) is not None:
        code, message = ErrorCode.invalid_request, problem
    else:
        stored = (binding_of(r) for r in ctx.broker.view.snapshot.acls.values())
        found = matching(selection, stored)
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for binding in sorted(found, key=_order):
        pattern = (int(binding.resource_type), binding.resource_name, int(binding.pattern_type))
        grouped.setdefault(pattern, []).append(binding)
    resource = element(schema, "resources")
    description = element(resource, "acls")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=code,
        error_message=message,
        resources=tuple(
            build(
                resource,
                resource_type=kind,
                resource_name=name,
                pattern_type=pattern_type,
                acls=tuple(
                    build(
                        description,
                        principal=b.principal,
                        host=b.host,
                        operation=int(b.operation),
                        permission_type=int(b.permission_type),
                    )
                    for b in bindings
                ),
            )
            for (kind, name, pattern_type), bindings in grouped.items()
        ),
    )


def _order(binding: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (
        int(binding.resource_type),
        binding.resource_name,
        int(binding.pattern_type),
        binding.principal,
        binding.host,
        int(binding.operation),
        int(binding.permission_type),
    )
