"""Metadata (key 3), v0-v12: brokers, cluster id, controller, topics and their partitions.

Answered from the watched metadata view, never from etcd directly. Topic selection follows Kafka:
in v0 an empty list means all topics; from v1 a null list means all and an empty list none; from
v10 a topic may be named by id alone. Unknown topics named in the request are created first when
auto-creation is on (``KAFSCALE_AUTO_CREATE_TOPICS`` and, from v4, the request's flag), with
``KAFSCALE_AUTO_CREATE_PARTITIONS`` partitions, and answered as existing topics. The brokers are
every registered one; each partition's leader and leader epoch come from its leader key
(``kafscale.frontend.leaders``), the leader being its only replica and in-sync replica. An offline
partition (no leader key yet, or its owner gone) is answered as Kafka's ``KRaftMetadataCache``
answers one whose leader is not alive: LEADER_NOT_AVAILABLE (retriable), leader -1, its leader
epoch when known (-1 without a key), and no replicas, since none is alive. Internal topics
(``__consumer_offsets``, which FindCoordinator creates) are marked ``is_internal`` by name, as
Kafka does. Authorized operations (v8+), when asked for, come from ``kafscale.frontend.authz``:
every operation without an authorizer, as Kafka reports them, else what the ACLs grant.

With ACLs on (``KAFSCALE_AUTHORIZER=acl``), as Kafka: asked for every topic, the topics the
principal may not DESCRIBE are left out; named, they are TOPIC_AUTHORIZATION_FAILED whether they
exist or not; a missing topic is auto-created only if the principal may CREATE it (on the
cluster or the topic), else it is TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.leaders import Leader, Leaders
from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.metadata.records import BrokerRecord, TopicRecord
from kafscale.metadata.topic_names import INTERNAL_TOPICS
from kafscale.protocol.acls import NOT_REQUESTED, AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode, MalformedRequest
from kafscale.security.authorizer import ResourceType

API_KEY = 3
MIN_VERSION, MAX_VERSION = 0, 12
FIRST_VERSION_BY_ID = 12  # Kafka's KafkaApis: topic ids in the request from v12 only

NO_UUID = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    if ctx.version < FIRST_VERSION_BY_ID:
        _check_names(ctx.version, request)
    snapshot = ctx.broker.view.snapshot
    every = _every_topic(ctx.version, request)
    selected = _selected(ctx.version, request, snapshot.topics)
    named = [name for name, _, _ in selected if name is not None]
    # All topics: the ones the principal may not DESCRIBE are left out, silently. Named ones
    # get TOPIC_AUTHORIZATION_FAILED, whether they exist or not (Kafka).
    described = authz.topics_allowed(ctx, AclOperation.DESCRIBE, named, count_denial=not every)
    errors: dict[str, TopicResult] = {}
    missing = [name for name, _, record in selected if record is None and name in described]
    if missing and _may_auto_create(ctx, request):
        creatable = [name for name in missing if authz.may_create_topic(ctx, name)]
        for uncreatable in set(missing) - set(creatable):
            errors[uncreatable] = TopicResult(
                uncreatable, int(ErrorCode.topic_authorization_failed)
            )
        results = (
            await ctx.broker.coordinator.create_topics(
                [TopicSpec(name=name, partitions=-1) for name in creatable]
            )
            if creatable
            else []
        )
        errors |= {r.name: r for r in results if r.name and r.error_code not in _CREATED}
        snapshot = ctx.broker.view.snapshot
        selected = _selected(ctx.version, request, snapshot.topics)
    leaders = Leaders(ctx, snapshot)
    topics = []
    for index, (name, topic_id, record) in enumerate(selected):
        failed = errors.get(name) if name is not None and record is None else None
        if name is not None and name not in described:
            if not every:
                # Asked by id, the answer carries the id and never the name (Kafka).
                by_id = request.topics[index].name is None
                topics.append(
                    _topic_error(
                        schema,
                        None if by_id else name,
                        ErrorCode.topic_authorization_failed,
                        topic_id if by_id and topic_id is not None else NO_UUID,
                    )
                )
        elif name is not None and failed is not None:
            topics.append(_topic_error(schema, name, ErrorCode(failed.error_code)))
        else:
            asks = _asks(request, "topic")
            operations = (
                authz.authorized_operations(ctx, ResourceType.TOPIC, record.name)
                if asks and record is not None
                else NOT_REQUESTED
            )
            topics.append(_topic(leaders, schema, record, name, topic_id, operations))
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        brokers=tuple(_broker(schema, b) for b in leaders.brokers.values()),
        cluster_id=snapshot.cluster_id,
        controller_id=ctx.broker.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=authz.authorized_operations(
            ctx, ResourceType.CLUSTER, authz.CLUSTER
        )
        if _asks(request, "cluster")
        else NOT_REQUESTED,
    )


def _check_names(version: int, request: Any) -> None:
    """v10 and v11 carry a topic id and a nullable name, but name topics only by name (their
    responses cannot hold a null name): as Kafka, refuse anything else (InvalidRequestException,
    the connection closes)."""
    for topic in request.topics or ():
        if topic.name is None:
            raise MalformedRequest(f"Metadata v{version}: a topic name cannot be null")
        if getattr(topic, "topic_id", None) is not None:
            raise MalformedRequest(f"Metadata v{version}: topic ids are not supported")


def _asks(request: Any, resource: str) -> bool:
    """Whether the request asks for the authorized operations of ``resource`` (v8+)."""
    return bool(getattr(request, f"include_{resource}_authorized_operations", False))


# Created now, or by someone else between our look and the coordinator's write.
_CREATED = (int(ErrorCode.none), int(ErrorCode.topic_already_exists))


def _may_auto_create(ctx: RequestContext, request: Any) -> bool:
    """Kafka's rule: the broker allows it and, from v4, so does the request."""
    allowed = ctx.version < 4 or bool(request.allow_auto_topic_creation)
    return allowed and ctx.broker.config.auto_create_topics


def _topic_error(
    schema: type[Any], name: str | None, error: ErrorCode, topic_id: uuid.UUID = NO_UUID
) -> Any:
    return build(
        nested(schema, "MetadataResponseTopic"),
        error_code=error,
        name=name,
        topic_id=topic_id,
        partitions=(),
    )


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
    if _every_topic(version, request):
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


def _every_topic(version: int, request: Any) -> bool:
    """Whether the request asks for every topic (null list; v0: an empty one)."""
    return request.topics is None or (version == 0 and not request.topics)


def _topic(
    leaders: Leaders,
    schema: type[Any],
    record: TopicRecord | None,
    name: str | None,
    topic_id: uuid.UUID | None,
    authorized_operations: int,
) -> Any:
    topic_class = nested(schema, "MetadataResponseTopic")
    if record is None:
        error = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
        return build(
            topic_class, error_code=error, name=name, topic_id=topic_id or NO_UUID, partitions=()
        )
    partition_class = nested(schema, "MetadataResponsePartition")
    partitions = tuple(
        _partition(partition_class, index, leaders.of(record.name, index))
        for index in range(record.partitions)
    )
    return build(
        topic_class,
        error_code=ErrorCode.none,
        name=record.name,
        topic_id=uuid.UUID(record.topic_id),
        is_internal=record.name in INTERNAL_TOPICS,
        partitions=partitions,
        topic_authorized_operations=authorized_operations,
    )


def _partition(partition_class: type[Any], index: int, leader: Leader) -> Any:
    replicas = (leader.node_id,) if leader.online else ()
    return build(
        partition_class,
        error_code=ErrorCode.none if leader.online else ErrorCode.leader_not_available,
        partition_index=index,
        leader_id=leader.node_id,
        leader_epoch=leader.epoch,
        replica_nodes=replicas,
        isr_nodes=replicas,
        offline_replicas=(),
    )
