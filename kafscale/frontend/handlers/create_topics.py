"""CreateTopics (key 19), v2-v7: partitions, configs, validate-only; topic ids from v7.

The coordinator validates and writes (``kafscale.coordinator.topics``); this module translates.
Replica assignments are accepted (one broker leads everything, durability comes from S3) but, as
in Kafka, they exclude an explicit partition count or replication factor. From v5 the response
describes the created topic: partitions, replication factor and every config with its source, as
DescribeConfigs does (``kafscale.frontend.configs``).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.configs import topic_configs_of
from kafscale.frontend.context import RequestContext
from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 19
MIN_VERSION, MAX_VERSION = 2, 7


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    specs: list[TopicSpec] = []
    refused: dict[int, TopicResult] = {}
    for index, topic in enumerate(request.topics):
        spec, problem = _spec(topic)
        if not authz.may_create_topic(ctx, topic.name):  # CREATE on the cluster or the topic
            refused[index] = TopicResult(
                name=topic.name, error_code=int(ErrorCode.topic_authorization_failed)
            )
        elif problem is not None:
            refused[index] = problem
        else:
            specs.append(spec)
    created = (
        await ctx.broker.coordinator.create_topics(specs, request.validate_only) if specs else []
    )
    answers = iter(created)
    results = [refused.get(index) or next(answers) for index in range(len(request.topics))]
    topics = tuple(_result(ctx, schema, result) for result in results)
    return build(schema, throttle_time=datetime.timedelta(0), topics=topics)


def _spec(topic: Any) -> tuple[TopicSpec, TopicResult | None]:
    configs = {config.name: config.value for config in topic.configs}
    partitions, replication_factor = int(topic.num_partitions), int(topic.replication_factor)
    if topic.assignments:
        if partitions != -1 or replication_factor != -1:
            message = "replica assignments exclude numPartitions and replicationFactor"
            error = TopicResult(
                name=topic.name, error_code=int(ErrorCode.invalid_request), error_message=message
            )
            return TopicSpec(name=topic.name, partitions=0), error
        partitions = len(topic.assignments)
        replication_factor = max(len(a.broker_ids) for a in topic.assignments) or -1
    spec = TopicSpec(
        name=topic.name,
        partitions=partitions,
        replication_factor=replication_factor,
        configs=configs,
    )
    return spec, None


def _describes_configs(schema: type[Any]) -> bool:
    """Whether this response version describes configs (v5+)."""
    return bool(schema.__version__ >= 5)


def _result(ctx: RequestContext, schema: type[Any], result: TopicResult) -> Any:
    ok = result.error_code == 0
    configs = None
    # Kafka tells the new topic's configs, partitions and replication only with DESCRIBE_CONFIGS
    # on it.
    described = not ok or authz.allowed(
        ctx,
        AclOperation.DESCRIBE_CONFIGS,
        ResourceType.TOPIC,
        result.name or "",
        count_denial=False,
    )
    if ok and described and _describes_configs(schema):
        config_class = nested(schema, "CreatableTopicConfigs")
        configs = tuple(
            build(
                config_class,
                name=entry.name,
                value=entry.value,
                read_only=entry.read_only,
                is_sensitive=entry.sensitive,
                config_source=int(entry.source),
            )
            for entry in topic_configs_of(result.configs, ctx.broker.config)
        )
    return build(
        nested(schema, "CreatableTopicResult"),
        name=result.name or "",
        topic_id=uuid.UUID(result.topic_id) if ok and result.topic_id else uuid.UUID(int=0),
        error_code=ErrorCode(result.error_code),
        error_message=result.error_message,
        topic_config_error_code=0 if described else ErrorCode.topic_authorization_failed,
        num_partitions=result.partitions if ok and described else -1,
        replication_factor=result.replication_factor if ok and described else -1,
        configs=configs,
    )
