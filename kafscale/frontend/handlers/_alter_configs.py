"""What AlterConfigs and IncrementalAlterConfigs share: sorting resources, asking the coordinator.

Per resource, in request order:
- a resource named twice in one request: INVALID_REQUEST for each (Kafka refuses them all);
- a topic: the coordinator applies the changes (``kafscale.coordinator.configs``) and the
  frontend waits until its view holds them, so the client's next request sees them;
- this broker, or "" (the cluster-wide defaults): KafScale's broker configuration is static
  (KAFSCALE_* variables, read at start), so any change is POLICY_VIOLATION, with a message that
  says how to change it; an empty list of changes is accepted (there is nothing to do). Another
  broker id: INVALID_REQUEST, as in DescribeConfigs;
- a group: the coordinator validates and stores its configs (``metadata.group_configs``; the
  group need not exist), with ALTER_CONFIGS on the group (else GROUP_AUTHORIZATION_FAILED);
- any other resource type: INVALID_REQUEST.
A coordinator that cannot be reached gives REQUEST_TIMED_OUT (retriable) for each topic or group.
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers.describe_configs import broker_name_error, unsupported_resource
from kafscale.ipc.consumer_groups import (
    AlterGroupConfigs,
    GroupConfigChange,
    GroupConfigChanges,
    GroupConfigResults,
)
from kafscale.ipc.messages import AlterTopicConfigs, ConfigChange, TopicConfigChanges, TopicResults
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.configs import AlterConfigOp, ResourceType
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType as AclResource

log = logging.getLogger(__name__)

Outcome = tuple[ErrorCode, str | None]


async def alter(ctx: RequestContext, api_key: int, request: Any, incremental: bool) -> Any:
    schema = response_schema(api_key, ctx.version)
    assert schema is not None
    resources = request.resources
    named = Counter((int(r.resource_type), r.resource_name) for r in resources)
    outcomes: dict[int, Outcome] = {}
    topics: dict[int, TopicConfigChanges] = {}
    groups: dict[int, GroupConfigChanges] = {}
    for index, resource in enumerate(resources):
        kind, name = int(resource.resource_type), resource.resource_name
        if named[(kind, name)] > 1:
            outcomes[index] = (ErrorCode.invalid_request, f"{name!r} appears more than once")
        elif kind == ResourceType.TOPIC and not authz.allowed(
            ctx, AclOperation.ALTER_CONFIGS, AclResource.TOPIC, name
        ):
            outcomes[index] = (ErrorCode.topic_authorization_failed, None)
        elif kind in (ResourceType.BROKER, ResourceType.BROKER_LOGGER) and not (
            authz.cluster_allowed(ctx, AclOperation.ALTER_CONFIGS)
        ):
            outcomes[index] = (ErrorCode.cluster_authorization_failed, None)
        elif kind == ResourceType.GROUP and not authz.allowed(
            ctx, AclOperation.ALTER_CONFIGS, AclResource.GROUP, name
        ):
            outcomes[index] = (ErrorCode.group_authorization_failed, None)
        elif kind == ResourceType.TOPIC:
            changes = [_change(config, incremental) for config in resource.configs]
            topics[index] = TopicConfigChanges(name, changes)
        elif kind == ResourceType.GROUP:
            changes = [_change(config, incremental) for config in resource.configs]
            groups[index] = GroupConfigChanges(
                name, [GroupConfigChange(c.name, c.operation, c.value) for c in changes]
            )
        elif kind == ResourceType.BROKER:
            outcomes[index] = _broker(ctx, name, [c.name for c in resource.configs])
        else:
            outcomes[index] = (ErrorCode.invalid_request, unsupported_resource(kind))
    if topics:
        message = AlterTopicConfigs(
            topics=list(topics.values()),
            replace=not incremental,
            validate_only=bool(request.validate_only),
        )
        answers = await _ask(ctx, message, len(topics), TopicResults)
        outcomes.update(zip(topics, answers, strict=True))
    if groups:
        altered = AlterGroupConfigs(list(groups.values()), incremental, bool(request.validate_only))
        answers = await _ask(ctx, altered, len(groups), GroupConfigResults)
        outcomes.update(zip(groups, answers, strict=True))
    response_class = element(schema, "responses")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        responses=tuple(
            build(
                response_class,
                error_code=outcomes[index][0],
                error_message=outcomes[index][1],
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for index, resource in enumerate(resources)
        ),
    )


def _change(config: Any, incremental: bool) -> ConfigChange:
    operation = int(config.config_operation) if incremental else int(AlterConfigOp.SET)
    return ConfigChange(name=config.name, operation=operation, value=config.value)


def _broker(ctx: RequestContext, name: str, changes: list[str]) -> Outcome:
    if name != "" and (problem := broker_name_error(ctx, name)) is not None:
        return ErrorCode.invalid_request, problem
    if not changes:
        return ErrorCode.none, None
    return (
        ErrorCode.policy_violation,
        f"KafScale's broker configuration is static: {', '.join(changes)} cannot be changed "
        "at run time. Set the KAFSCALE_* environment variables (or serve flags) and restart "
        "the broker; topic configs can be altered.",
    )


async def _ask(
    ctx: RequestContext,
    message: AlterTopicConfigs | AlterGroupConfigs,
    count: int,
    expected: type[TopicResults] | type[GroupConfigResults],
) -> list[Outcome]:
    """The coordinator's outcome for each of the ``count`` topics or groups of ``message``,
    once this broker's view holds the writes."""
    try:
        reply = await ctx.broker.coordinator.call(message)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        unavailable = "the coordinator is unavailable"  # the detail is logged, not sent
        return [(ErrorCode.request_timed_out, unavailable)] * count
    if not isinstance(reply, expected):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return [(ErrorCode.unknown_server_error, "unexpected reply")] * count
    await ctx.broker.coordinator.caught_up(reply.revision)
    return [(ErrorCode(r.error_code), r.error_message) for r in reply.results]
