"""Metadata (key 3), v0-v12: brokers, cluster id, controller, topics and their partitions.

Answered from the watched metadata view, never from etcd directly. Topic selection follows Kafka:
in v0 an empty list means all topics; from v1 a null list means all and an empty list none; from
v10 a topic may be named by id alone. Every partition is led by this broker (one broker owns all
partitions until scale-out arrives), with leader epoch 0 and itself as the only replica.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kafscale.frontend.context import RequestContext
from kafscale.metadata.records import BrokerRecord, TopicRecord
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 3
MIN_VERSION, MAX_VERSION = 0, 12

NO_UUID = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    snapshot = ctx.broker.view.snapshot
    topics = [
        _topic(ctx, schema, record, name, topic_id)
        for name, topic_id, record in _selected(ctx.version, request, snapshot.topics)
    ]
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        brokers=tuple(_broker(schema, b) for b in _brokers(ctx, snapshot.brokers)),
        cluster_id=snapshot.cluster_id,
        controller_id=ctx.broker.node_id,
        topics=tuple(topics),
    )


def _brokers(ctx: RequestContext, registered: dict[int, BrokerRecord]) -> list[BrokerRecord]:
    """Registered brokers; this one always included, even before its registration is seen."""
    config = ctx.broker.config
    brokers = dict(registered)
    brokers.setdefault(
        ctx.broker.node_id,
        BrokerRecord(
            node_id=ctx.broker.node_id,
            host=config.advertised_listener_host,
            port=config.broker_port,
        ),
    )
    return [brokers[node_id] for node_id in sorted(brokers)]


def _broker(schema: type[Any], record: BrokerRecord) -> Any:
    return build(
        nested(schema, "MetadataResponseBroker"),
        node_id=record.node_id,
        host=record.host,
        port=record.port,
        rack=record.rack,
    )


def _selected(
    version: int,
    request: Any,
    topics: dict[str, TopicRecord],
) -> list[tuple[str | None, uuid.UUID | None, TopicRecord | None]]:
    """(name, id, record or None if unknown) of each topic the request asks about."""
    if request.topics is None or (version == 0 and not request.topics):
        return [
            (name, uuid.UUID(record.topic_id), record) for name, record in sorted(topics.items())
        ]
    by_id = {uuid.UUID(record.topic_id): record for record in topics.values()}
    selected: list[tuple[str | None, uuid.UUID | None, TopicRecord | None]] = []
    for wanted in request.topics:
        name = wanted.name
        topic_id = getattr(wanted, "topic_id", None)
        if name is None and topic_id not in (None, NO_UUID):
            record = by_id.get(topic_id)
            selected.append((record.name if record else None, topic_id, record))
        else:
            record = topics.get(name) if name is not None else None
            selected.append((name, uuid.UUID(record.topic_id) if record else NO_UUID, record))
    return selected


def _topic(
    ctx: RequestContext,
    schema: type[Any],
    record: TopicRecord | None,
    name: str | None,
    topic_id: uuid.UUID | None,
) -> Any:
    topic_class = nested(schema, "MetadataResponseTopic")
    if record is None:
        error = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
        return build(
            topic_class, error_code=error, name=name, topic_id=topic_id or NO_UUID, partitions=()
        )
    partition_class = nested(schema, "MetadataResponsePartition")
    node = ctx.broker.node_id
    partitions = tuple(
        build(
            partition_class,
            error_code=ErrorCode.none,
            partition_index=index,
            leader_id=node,
            leader_epoch=0,
            replica_nodes=(node,),
            isr_nodes=(node,),
            offline_replicas=(),
        )
        for index in range(record.partitions)
    )
    return build(
        topic_class,
        error_code=ErrorCode.none,
        name=record.name,
        topic_id=uuid.UUID(record.topic_id),
        is_internal=False,
        partitions=partitions,
    )
