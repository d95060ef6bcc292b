"""DescribeConfigs (key 32), v1-v4: the configs of topics and of this broker.

Answered from the watched metadata view and the broker's own configuration
(``kafscale.frontend.configs`` says what is described and with which source). Per resource, as
Kafka's broker does: a topic must exist (UNKNOWN_TOPIC_OR_PARTITION) and have a legal name
(INVALID_TOPIC_EXCEPTION); a broker is named by this broker's id, or by "" for the cluster-wide
dynamic defaults, of which KafScale has none (an empty list); a group need not exist (its
configs are its own or Kafka's defaults); any other broker id, and every other resource type,
is INVALID_REQUEST. ``configuration_keys`` null or empty means every config;
unknown names are left out. Synonyms are sent when asked (v1+), documentation when asked (v3+).
"""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.configs import (
    Described,
    broker_configs,
    group_configs_of,
    topic_configs_of,
)
from kafscale.frontend.context import RequestContext
from kafscale.metadata.topic_names import name_error
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.configs import ResourceType
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType as AclResource

API_KEY = 32
MIN_VERSION, MAX_VERSION = 1, 4


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    synonyms = bool(request.include_synonyms)
    documentation = bool(getattr(request, "include_documentation", False))
    results = []
    for resource in request.resources:
        error, message, entries = describe(ctx, int(resource.resource_type), resource.resource_name)
        wanted = resource.configuration_keys
        if wanted:
            entries = [entry for entry in entries if entry.name in wanted]
        results.append(
            build(
                nested(schema, "DescribeConfigsResult"),
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(_config(schema, e, synonyms, documentation) for e in entries),
            )
        )
    return build(schema, throttle_time=datetime.timedelta(0), results=tuple(results))


def describe(
    ctx: RequestContext, resource_type: int, name: str
) -> tuple[ErrorCode, str | None, list[Described]]:
    """The error (or none), its message, and the configs of one resource."""
    if resource_type == ResourceType.TOPIC and not authz.allowed(
        ctx, AclOperation.DESCRIBE_CONFIGS, AclResource.TOPIC, name
    ):
        return ErrorCode.topic_authorization_failed, None, []
    if resource_type in (ResourceType.BROKER, ResourceType.BROKER_LOGGER) and not (
        authz.cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS)
    ):
        return ErrorCode.cluster_authorization_failed, None, []
    if resource_type == ResourceType.TOPIC:
        if (problem := name_error(name)) is not None:
            return ErrorCode.invalid_topic_exception, problem, []
        record = ctx.broker.view.snapshot.topics.get(name)
        if record is None:
            message = f"The topic '{name}' does not exist."
            return ErrorCode.unknown_topic_or_partition, message, []
        return ErrorCode.none, None, topic_configs_of(record.configs, ctx.broker.config)
    if resource_type == ResourceType.GROUP:
        if not authz.allowed(ctx, AclOperation.DESCRIBE_CONFIGS, AclResource.GROUP, name):
            return ErrorCode.group_authorization_failed, None, []
        if not name:
            return ErrorCode.invalid_group_id, "Group id must not be empty", []
        return (
            ErrorCode.none,
            None,
            group_configs_of(
                ctx.broker.view.snapshot.group_configs.get(name, {}), ctx.broker.config
            ),
        )
    if resource_type == ResourceType.BROKER:
        if name == "":
            return ErrorCode.none, None, []  # no dynamic cluster-wide defaults
        if (problem := broker_name_error(ctx, name)) is not None:
            return ErrorCode.invalid_request, problem, []
        return ErrorCode.none, None, broker_configs(ctx.broker.config)
    return ErrorCode.invalid_request, unsupported_resource(resource_type), []


def broker_name_error(ctx: RequestContext, name: str) -> str | None:
    """Why ``name`` does not name this broker (Kafka's words), or None."""
    try:
        broker_id = int(name)
    except ValueError:
        return f"Broker id must be an integer, but it is: {name}"
    if broker_id != ctx.broker.node_id:
        return (
            f"Unexpected broker id, expected {ctx.broker.node_id} or empty string, "
            f"but received {name}"
        )
    return None


def unsupported_resource(resource_type: int) -> str:
    try:
        kind = ResourceType(resource_type).name
    except ValueError:
        kind = str(resource_type)
    return f"KafScale does not serve configs of resource type {kind}: only TOPIC, BROKER and GROUP"


def _config(schema: type[Any], entry: Described, synonyms: bool, documentation: bool) -> Any:
    synonym_class = nested(schema, "DescribeConfigsSynonym")
    return build(
        nested(schema, "DescribeConfigsResourceResult"),
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=int(entry.source),
        is_sensitive=entry.sensitive,
        synonyms=tuple(
            build(synonym_class, name=s.name, value=s.value, source=int(s.source))
            for s in (entry.synonyms if synonyms else ())
        ),
        config_type=int(entry.type),
        documentation=entry.documentation if documentation else None,
    )
