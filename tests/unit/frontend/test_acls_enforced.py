"""ACLs enforced on every non-group API (``KAFSCALE_AUTHORIZER=acl``), end to end from request
bytes to response bytes, as Kafka's ``KafkaApis`` enforces them.

The broker's view is static: its ACLs are ``AclRecord``s put in the snapshot, and a change of ACLs
replaces the snapshot as the real view does (``authz`` rebuilds its authorizer when the
snapshot's ACL dict is another one). Requests run as a principal through
``requests.process(broker, frame, peer, Session(...))``. The coordinator and the shards are fakes
that record every call, so "reaches nothing" is checked, not assumed.

Covered, for each API of the table ``CASES`` (Produce; Fetch v12 by name, v13 and v17 by id;
ListOffsets; OffsetForLeaderEpoch; Metadata for every topic and for named ones; CreateTopics
with cluster or topic CREATE; DeleteTopics by name (v5, v6) and by id; CreatePartitions;
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs of a topic and of the broker;
InitProducerId with IDEMPOTENT_WRITE or, KIP-679, WRITE on a topic; DescribeCluster's authorized
operations; Describe/AlterUserScramCredentials; DescribeClientQuotas):

- no ACL for the principal (none at all, or only another principal's): Kafka's error, nothing
  reaches the coordinator or a shard, and ``kafscale_authorization_denied_total{api}`` grows
  (not for what a listing leaves out silently);
- the same broker serves it once an ALLOW ACL exists (the view's change applies at once), and
  the request reaches exactly what it should;
- a DENY beats the ALLOW; super users bypass even a DENY; with
  ``KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND=true`` resources without ACLs are allowed;
- ``KAFSCALE_AUTHORIZER=none`` serves it as before.

Then the details: an unknown topic is TOPIC_AUTHORIZATION_FAILED when not authorized (Produce,
Fetch, Metadata, DeleteTopics, DescribeConfigs), never created without CREATE (Produce,
Metadata); implied operations (READ implies DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS,
DESCRIBE does not imply READ); PREFIXED ACLs; hosts; DeleteTopics by id does not tell the name;
KIP-430 bits in Metadata and DescribeCluster; KIP-679 for InitProducerId.

Finally ``test_every_api_has_an_authorization_decision`` walks ``dispatch.APIS``: each key is
tested here, is an ACL API (tests/unit/frontend/test_acl_apis.py), a group API (checked by the
group ACL tests), or explicitly needs no authorization.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import prometheus_client
import pytest
from kio.index import load_request_schema

from kafscale import config as configuration
from kafscale.coordinator.credentials import plan
from kafscale.frontend import requests
from kafscale.frontend.context import Broker, Session
from kafscale.frontend.dispatch import APIS
from kafscale.ipc import messages
from kafscale.ipc.log_admin import LogStartMoveResult, LogStartMoves, MoveLogStart
from kafscale.metadata.records import (
    AclRecord,
    BrokerRecord,
    LeaderRecord,
    ScramRecord,
    TopicRecord,
)
from kafscale.metadata.view import Snapshot
from kafscale.protocol import codec
from kafscale.protocol.acls import AclOperation as Op
from kafscale.protocol.configs import AlterConfigOp
from kafscale.protocol.configs import ResourceType as ConfigResource
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.sasl import Authentication
from kafscale.security.authorizer import AclPermissionType as Perm
from kafscale.security.authorizer import PatternType as Pat
from kafscale.security.authorizer import ResourceType as Res
from tests.unit.frontend.test_admin_requests import (
    AdminCoordinator,
    alter_request,
    incremental_request,
    partitions_request,
)
from tests.unit.frontend.test_admin_requests import describe_request as describe_configs_request
from tests.unit.frontend.test_leaders import RecordingShards, epochs_request, list_offsets_request
from tests.unit.frontend.test_requests import StaticView, create_topics_request, decode_response
from tests.unit.frontend.test_scram_admin import SHA256, upsertion
from tests.unit.frontend.test_scram_admin import alter_request as alter_scram_request
from tests.unit.frontend.test_scram_admin import describe_request as describe_scram_request
from tests.unit.protocol.test_codec import request_frame

ALICE, BOB = "User:alice", "User:bob"
PEER = "10.0.0.9:5555"
CLUSTER = "kafka-cluster"
ORDERS_ID, PAYMENTS_ID, SECRET_ID = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
NO_UUID = uuid.UUID(int=0)
TAF = ErrorCode.topic_authorization_failed
CAF = ErrorCode.cluster_authorization_failed
OK = ErrorCode.none
NOT_REQUESTED = -(2**31)
TOPIC, BROKER = int(ConfigResource.TOPIC), int(ConfigResource.BROKER)
SET = int(AlterConfigOp.SET)

# The keys of the APIs whose checks are tested elsewhere, or that need none.
GROUP_APIS = {8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69}  # test_group_acls.py and
# test_consumer_group_apis.py
ACL_APIS = {29, 30, 31}  # tests/unit/frontend/test_acl_apis.py
NEEDS_NO_AUTHORIZATION = {18, 17, 36}  # ApiVersions, SaslHandshake, SaslAuthenticate


def bits(*operations: Op) -> int:
    return sum(1 << op for op in operations)


EVERY_CLUSTER_OPERATION = bits(
    Op.CREATE,
    Op.CLUSTER_ACTION,
    Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS,
    Op.IDEMPOTENT_WRITE,
    Op.ALTER,
    Op.DESCRIBE,
)
EVERY_TOPIC_OPERATION = bits(
    Op.READ,
    Op.WRITE,
    Op.CREATE,
    Op.DESCRIBE,
    Op.DELETE,
    Op.ALTER,
    Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS,
)


# -- ACLs --------------------------------------------------------------------------------------


def allow(
    resource: Res,
    name: str,
    operation: Op,
    principal: str = ALICE,
    pattern: Pat = Pat.LITERAL,
    host: str = "*",
) -> AclRecord:
    return AclRecord(
        int(resource), name, int(pattern), principal, host, int(operation), int(Perm.ALLOW)
    )


def deny(
    resource: Res,
    name: str,
    operation: Op,
    principal: str = ALICE,
    pattern: Pat = Pat.LITERAL,
    host: str = "*",
) -> AclRecord:
    return msgspec.structs.replace(
        allow(resource, name, operation, principal, pattern, host), permission_type=int(Perm.DENY)
    )


def on_cluster(operation: Op, principal: str = ALICE) -> AclRecord:
    return allow(Res.CLUSTER, CLUSTER, operation, principal)


def on_topic(name: str, operation: Op, principal: str = ALICE) -> AclRecord:
    return allow(Res.TOPIC, name, operation, principal)


def for_principal(records: Sequence[AclRecord], principal: str) -> list[AclRecord]:
    return [msgspec.structs.replace(r, principal=principal) for r in records]


def grant(broker: Broker, *records: AclRecord) -> None:
    """Add ACLs as the view does: a new snapshot with a new ACL dict."""
    view = cast(StaticView, broker.view)
    acls = {**view.snapshot.acls, **{r.digest: r for r in records}}
    view.snapshot = dataclasses.replace(view.snapshot, acls=acls)


def revoke_all(broker: Broker) -> None:
    view = cast(StaticView, broker.view)
    view.snapshot = dataclasses.replace(view.snapshot, acls={})


# -- the broker and its recording fakes --------------------------------------------------------

Trail = list[tuple[str, tuple[object, ...]]]


class RecordingCoordinator(AdminCoordinator):
    """AdminCoordinator (topic configs and partitions applied to the view) that also answers
    AlterScramCredentials with the real ``plan``; ``asked`` records every call and what it
    carried."""

    def __init__(self, view: StaticView) -> None:
        super().__init__(view, broker_id=3)
        self.asked: Trail = []

    async def create_topics(
        self, specs: Sequence[messages.TopicSpec], validate_only: bool = False
    ) -> list[messages.TopicResult]:
        self.asked.append(("create_topics", tuple(s.name for s in specs)))
        return await super().create_topics(specs, validate_only)

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[messages.TopicResult]:
        self.asked.append(("delete_topics", (*names, *topic_ids)))
        return await super().delete_topics(names, topic_ids)

    async def allocate_producer_id(self) -> int:
        self.asked.append(("allocate_producer_id", ("a producer id",)))
        return await super().allocate_producer_id()

    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        if isinstance(request, messages.AlterScramCredentials):
            self.asked.append(("AlterScramCredentials", tuple(c.user for c in request.changes)))
            credentials = self.view.snapshot.credentials
            results, writes = plan(credentials, request.changes)
            for key, record in writes.items():
                if record is None:
                    del credentials[key]
                else:
                    credentials[key] = record
            return messages.ScramCredentialsAltered(results, 0)
        if isinstance(request, MoveLogStart):
            self.asked.append(("MoveLogStart", tuple(m.topic for m in request.partitions)))
            return LogStartMoves([LogStartMoveResult(0, m.offset) for m in request.partitions])
        if isinstance(request, messages.AlterTopicConfigs):
            self.asked.append(("AlterTopicConfigs", tuple(t.topic for t in request.topics)))
        elif isinstance(request, messages.CreatePartitions):
            self.asked.append(("CreatePartitions", tuple(t.topic for t in request.topics)))
        else:
            self.asked.append((type(request).__name__, ("?",)))
        return await super().call(request, timeout)


def snapshot(*acls: AclRecord) -> Snapshot:
    return Snapshot(
        revision=5,
        cluster_id="abcdefghijklmnopqrstuv",
        brokers={
            3: BrokerRecord(node_id=3, host="127.0.0.1", port=19092),
            4: BrokerRecord(node_id=4, host="10.0.0.4", port=9092),
        },
        topics={
            "orders": TopicRecord(name="orders", topic_id=str(ORDERS_ID), partitions=3),
            "payments": TopicRecord(name="payments", topic_id=str(PAYMENTS_ID), partitions=1),
            "secret": TopicRecord(name="secret", topic_id=str(SECRET_ID), partitions=1),
        },
        leaders={
            **{
                ("orders", p): LeaderRecord(owner=3, epoch=5, lease=1, run_id="r") for p in range(3)
            },
            ("payments", 0): LeaderRecord(owner=3, epoch=2, lease=1, run_id="r"),
            ("secret", 0): LeaderRecord(owner=3, epoch=1, lease=1, run_id="r"),
        },
        credentials={("carol", "SCRAM-SHA-256"): ScramRecord(b"salt", b"s" * 32, b"k" * 32, 4096)},
        acls={r.digest: r for r in acls},
    )


def make_broker(*acls: AclRecord, authorizer: str = "acl", **env: str) -> Broker:
    config = configuration.load(
        {
            "KAFSCALE_BROKER_ID": "3",
            "KAFSCALE_BROKER_PORT": "19092",
            "KAFSCALE_AUTHORIZER": authorizer,
            **env,
        }
    )
    view = StaticView(snapshot(*acls))
    shards = cast(Any, RecordingShards())
    return Broker(config, view, APIS, RecordingCoordinator(view), shards)


def session(principal: str) -> Session:
    return Session("PLAINTEXT", Authentication(False, {}, 0, anonymous=principal))


def run(broker: Broker, request: Any, principal: str = ALICE, peer: str = PEER) -> Any:
    api_key = int(request.__api_key__)
    answer = asyncio.run(requests.process(broker, request_frame(request), peer, session(principal)))
    assert answer is not None
    frame = answer if isinstance(answer, bytes) else b"".join(bytes(c) for c in answer)
    return decode_response(frame, api_key, int(request.__version__))[1]


def trail(broker: Broker) -> Trail:
    """What reached the coordinator and the shards, in that order; calls that carried nothing
    (an empty CreateTopics or DeleteTopics) are left out here and tested on their own."""
    coordinator = cast(RecordingCoordinator, broker.coordinator)
    shards = cast(RecordingShards, broker.shards)
    asked = [(kind, carried) for kind, carried in coordinator.asked if carried]
    return asked + [(f"shard:{api}", (partition,)) for api, partition in shards.sent]


def forget(broker: Broker) -> None:
    cast(RecordingCoordinator, broker.coordinator).asked.clear()
    cast(RecordingShards, broker.shards).sent.clear()


def denials(api: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "kafscale_authorization_denied_total", {"api": api}
    )
    return value or 0.0


# -- requests and what to read of their responses ---------------------------------------------


def produce(topic: str = "orders", partitions: Sequence[int] = (0,), version: int = 9) -> Any:
    schema = load_request_schema(0, version)
    data = tuple(
        codec.build(codec.nested(schema, "PartitionProduceData"), index=p, records=b"batch")
        for p in partitions
    )
    entry = codec.build(codec.nested(schema, "TopicProduceData"), name=topic, partition_data=data)
    return codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(entry,),
    )


def produced(response: Any) -> list[tuple[str, int, ErrorCode]]:
    return [
        (t.name, int(p.index), ErrorCode(p.error_code))
        for t in response.responses
        for p in t.partition_responses
    ]


def fetch(
    version: int, topic: str = "orders", topic_id: uuid.UUID = ORDERS_ID, partitions: int = 1
) -> Any:
    schema = load_request_schema(1, version)
    wanted = tuple(
        codec.build(
            codec.nested(schema, "FetchPartition"),
            partition=p,
            current_leader_epoch=-1,
            fetch_offset=0,
            partition_max_bytes=1 << 20,
        )
        for p in range(partitions)
    )
    entry = codec.build(
        codec.nested(schema, "FetchTopic"), topic=topic, topic_id=topic_id, partitions=wanted
    )
    return codec.build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(entry,),
        forgotten_topics_data=(),
        rack_id="",
    )


def fetched(response: Any) -> list[tuple[int, ErrorCode]]:
    return [
        (int(p.partition_index), ErrorCode(p.error_code))
        for t in response.responses
        for p in t.partitions
    ]


def offsets_listed(response: Any) -> list[tuple[int, ErrorCode]]:
    return [
        (int(p.partition_index), ErrorCode(p.error_code))
        for t in response.topics
        for p in t.partitions
    ]


def epochs_answered(response: Any) -> list[tuple[int, ErrorCode]]:
    return [
        (int(p.partition), ErrorCode(p.error_code)) for t in response.topics for p in t.partitions
    ]


def metadata(
    topics: Sequence[str | uuid.UUID] | None,
    version: int = 12,
    *,
    create: bool = False,
    operations: bool = False,
) -> Any:
    schema = load_request_schema(3, version)
    entry = codec.nested(schema, "MetadataRequestTopic")
    return codec.build(
        schema,
        topics=None
        if topics is None
        else tuple(
            codec.build(entry, name=None, topic_id=t)
            if isinstance(t, uuid.UUID)
            else codec.build(entry, name=t, topic_id=None)
            for t in topics
        ),
        allow_auto_topic_creation=create,
        include_cluster_authorized_operations=operations,
        include_topic_authorized_operations=operations,
    )


def listed_names(response: Any) -> list[tuple[str, ErrorCode]]:
    return [(t.name, ErrorCode(t.error_code)) for t in response.topics]


def create_topics(*names: str) -> Any:
    return create_topics_request(7, *((name, 1, 1, {}) for name in names))


def topics_created(response: Any) -> list[tuple[str, ErrorCode]]:
    return [(t.name, ErrorCode(t.error_code)) for t in response.topics]


def delete_topics(*topics: str | uuid.UUID, version: int = 6) -> Any:
    schema = load_request_schema(20, version)
    timeout = datetime.timedelta(seconds=5)
    if version < 6:
        return codec.build(schema, timeout=timeout, topic_names=tuple(map(str, topics)))
    state = codec.nested(schema, "DeleteTopicState")
    return codec.build(
        schema,
        timeout=timeout,
        topics=tuple(
            codec.build(state, name=None, topic_id=t)
            if isinstance(t, uuid.UUID)
            else codec.build(state, name=t, topic_id=NO_UUID)
            for t in topics
        ),
    )


def topics_deleted(response: Any) -> list[tuple[str | None, uuid.UUID | str, ErrorCode]]:
    """(name, id, error); the zero id decodes as None, and before v6 there is no id ("n/a")."""
    return [
        (r.name, getattr(r, "topic_id", "n/a") or NO_UUID, ErrorCode(r.error_code))
        for r in response.responses
    ]


def configs_described(response: Any) -> list[tuple[int, str, ErrorCode]]:
    return [
        (int(r.resource_type), r.resource_name, ErrorCode(r.error_code)) for r in response.results
    ]


def configs_altered(response: Any) -> list[tuple[int, str, ErrorCode]]:
    return [
        (int(r.resource_type), r.resource_name, ErrorCode(r.error_code)) for r in response.responses
    ]


def partitions_created(response: Any) -> list[tuple[str, ErrorCode]]:
    return [(r.name, ErrorCode(r.error_code)) for r in response.results]


def init_producer_id(version: int = 4) -> Any:
    return codec.build(
        load_request_schema(22, version),
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )


def producer_id_given(response: Any) -> list[tuple[ErrorCode, int]]:
    return [(ErrorCode(response.error_code), int(response.producer_id))]


def describe_cluster(version: int = 1) -> Any:
    return codec.build(
        load_request_schema(60, version),
        include_cluster_authorized_operations=True,
        endpoint_type=1,
        include_fenced_brokers=False,
    )


def cluster_operations(response: Any) -> list[tuple[ErrorCode, int]]:
    return [(ErrorCode(response.error_code), int(response.cluster_authorized_operations))]


def scram_described(response: Any) -> list[tuple[ErrorCode, list[str]]]:
    return [(ErrorCode(response.error_code), [r.user for r in response.results])]


def scram_altered(response: Any) -> list[tuple[str, ErrorCode]]:
    return [(r.user, ErrorCode(r.error_code)) for r in response.results]


def delete_records(topic: str = "orders", version: int = 2) -> Any:
    schema = load_request_schema(21, version)
    topic_class = codec.element(schema, "topics")
    return codec.build(
        schema,
        topics=(
            codec.build(
                topic_class,
                name=topic,
                partitions=(
                    codec.build(
                        codec.element(topic_class, "partitions"), partition_index=0, offset=5
                    ),
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
    )


def records_deleted(response: Any) -> list[tuple[str, ErrorCode, int]]:
    return [
        (t.name, ErrorCode(p.error_code), int(p.low_watermark))
        for t in response.topics
        for p in t.partitions
    ]


def describe_log_dirs(version: int = 4) -> Any:
    return codec.build(load_request_schema(35, version), topics=None)


def log_dirs_described(response: Any) -> list[tuple[ErrorCode, int]]:
    return [(ErrorCode(response.error_code), len(response.results))]


def describe_quotas(version: int = 1) -> Any:
    return codec.build(load_request_schema(48, version), components=(), strict=False)


def quotas_described(response: Any) -> list[tuple[ErrorCode, object]]:
    return [(ErrorCode(response.error_code), response.entries)]


# -- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One API as a principal sees it: ``denied`` without an ACL, ``served`` with ``grants``
    (reaching exactly ``reaches``), ``unrestricted`` (default: ``served``) when nothing is
    checked (no authorizer, a super user, allow-everyone without ACLs). ``counted``: whether
    the denial counts in ``kafscale_authorization_denied_total`` (a silent omission does not).
    """

    id: str
    api: str
    request: Callable[[], Any]
    outcome: Callable[[Any], list[Any]]
    denied: list[Any]
    grants: tuple[AclRecord, ...]
    served: list[Any]
    reaches: Trail = dataclasses.field(default_factory=list)
    unrestricted: list[Any] | None = None
    counted: bool = True

    @property
    def api_key(self) -> int:
        return int(self.request().__api_key__)

    @property
    def free(self) -> list[Any]:
        return self.served if self.unrestricted is None else self.unrestricted


CASES = [
    Case(
        "produce",
        "Produce",
        lambda: produce("orders", [0, 1]),
        produced,
        [("orders", 0, TAF), ("orders", 1, TAF)],
        (on_topic("orders", Op.WRITE),),
        [("orders", 0, OK), ("orders", 1, OK)],
        [("shard:produce", (0,)), ("shard:produce", (1,))],
    ),
    Case(
        "produce v3",
        "Produce",
        lambda: produce("orders", [0], version=3),
        produced,
        [("orders", 0, TAF)],
        (on_topic("orders", Op.WRITE),),
        [("orders", 0, OK)],
        [("shard:produce", (0,))],
    ),
    Case(
        "fetch v12 by name",
        "Fetch",
        lambda: fetch(12, partitions=2),
        fetched,
        [(0, TAF), (1, TAF)],
        (on_topic("orders", Op.READ),),
        [(0, OK), (1, OK)],
        [("shard:fetch", (0,)), ("shard:fetch", (1,))],
    ),
    Case(
        "fetch v13 by id",
        "Fetch",
        lambda: fetch(13, topic="", topic_id=ORDERS_ID),
        fetched,
        [(0, TAF)],
        (on_topic("orders", Op.READ),),
        [(0, OK)],
        [("shard:fetch", (0,))],
    ),
    Case(
        "fetch v17 by id",
        "Fetch",
        lambda: fetch(17, topic="", topic_id=ORDERS_ID),
        fetched,
        [(0, TAF)],
        (on_topic("orders", Op.READ),),
        [(0, OK)],
        [("shard:fetch", (0,))],
    ),
    Case(
        "list offsets",
        "ListOffsets",
        lambda: list_offsets_request(7, {0: -1, 1: -1}),
        offsets_listed,
        [(0, TAF), (1, TAF)],
        (on_topic("orders", Op.DESCRIBE),),
        [(0, OK), (1, OK)],
        [("shard:offsets", (0,)), ("shard:offsets", (1,))],
    ),
    Case(
        "offset for leader epoch",
        "OffsetForLeaderEpoch",
        lambda: epochs_request(4, (0, -1, 5)),
        epochs_answered,
        [(0, TAF)],
        (on_topic("orders", Op.DESCRIBE),),
        [(0, OK)],
        [("shard:offsets", (0,))],
    ),
    Case(
        "metadata of every topic",
        "Metadata",
        lambda: metadata(None),
        listed_names,
        [],
        (on_topic("orders", Op.DESCRIBE),),
        [("orders", OK)],
        unrestricted=[("orders", OK), ("payments", OK), ("secret", OK)],
        counted=False,
    ),
    Case(
        "metadata v0 of every topic",
        "Metadata",
        lambda: metadata([], version=0),
        listed_names,
        [],
        (on_topic("payments", Op.DESCRIBE),),
        [("payments", OK)],
        unrestricted=[("orders", OK), ("payments", OK), ("secret", OK)],
        counted=False,
    ),
    Case(
        "metadata of named topics",
        "Metadata",
        lambda: metadata(["orders", "payments"]),
        listed_names,
        [("orders", TAF), ("payments", TAF)],
        (on_topic("orders", Op.DESCRIBE), on_topic("payments", Op.DESCRIBE)),
        [("orders", OK), ("payments", OK)],
    ),
    Case(
        "create topics, cluster CREATE",
        "CreateTopics",
        lambda: create_topics("fresh"),
        topics_created,
        [("fresh", TAF)],
        (on_cluster(Op.CREATE),),
        [("fresh", OK)],
        [("create_topics", ("fresh",))],
    ),
    Case(
        "create topics, topic CREATE",
        "CreateTopics",
        lambda: create_topics("fresh", "fresh-2"),
        topics_created,
        [("fresh", TAF), ("fresh-2", TAF)],
        (on_topic("fresh", Op.CREATE), on_topic("fresh-2", Op.CREATE)),
        [("fresh", OK), ("fresh-2", OK)],
        [("create_topics", ("fresh", "fresh-2"))],
    ),
    Case(
        "delete topics v6 by name",
        "DeleteTopics",
        lambda: delete_topics("orders"),
        topics_deleted,
        [("orders", NO_UUID, TAF)],
        (on_topic("orders", Op.DELETE),),
        [("orders", ORDERS_ID, OK)],
        [("delete_topics", ("orders",))],
    ),
    Case(
        "delete topics v6 by id",
        "DeleteTopics",
        lambda: delete_topics(ORDERS_ID),
        topics_deleted,
        [(None, ORDERS_ID, TAF)],  # by id, the name is not told
        (on_topic("orders", Op.DELETE),),
        [("orders", ORDERS_ID, OK)],
        [("delete_topics", (str(ORDERS_ID),))],
    ),
    Case(
        "delete topics v5",
        "DeleteTopics",
        lambda: delete_topics("orders", version=5),
        topics_deleted,
        [("orders", "n/a", TAF)],
        (on_topic("orders", Op.DELETE),),
        [("orders", "n/a", OK)],
        [("delete_topics", ("orders",))],
    ),
    Case(
        "create partitions",
        "CreatePartitions",
        lambda: partitions_request(3, ("orders", 5, None)),
        partitions_created,
        [("orders", TAF)],
        (on_topic("orders", Op.ALTER),),
        [("orders", OK)],
        [("CreatePartitions", ("orders",))],
    ),
    Case(
        "delete records",
        "DeleteRecords",
        delete_records,
        records_deleted,
        [("orders", TAF, -1)],
        (on_topic("orders", Op.DELETE),),
        [("orders", OK, 5)],
        [("MoveLogStart", ("orders",))],
    ),
    Case(
        "describe log dirs",
        "DescribeLogDirs",
        describe_log_dirs,
        log_dirs_described,
        [(CAF, 0)],
        (on_cluster(Op.DESCRIBE),),
        [(OK, 0)],  # the unit broker has no log dirs (Broker.log_dirs None)
    ),
    Case(
        "describe configs of a topic",
        "DescribeConfigs",
        lambda: describe_configs_request(4, (TOPIC, "orders", None)),
        configs_described,
        [(TOPIC, "orders", TAF)],
        (on_topic("orders", Op.DESCRIBE_CONFIGS),),
        [(TOPIC, "orders", OK)],
    ),
    Case(
        "describe configs of the broker",
        "DescribeConfigs",
        lambda: describe_configs_request(4, (BROKER, "3", None)),
        configs_described,
        [(BROKER, "3", CAF)],
        (on_cluster(Op.DESCRIBE_CONFIGS),),
        [(BROKER, "3", OK)],
    ),
    Case(
        "alter configs of a topic",
        "AlterConfigs",
        lambda: alter_request(2, (TOPIC, "orders", {"retention.ms": "1000"})),
        configs_altered,
        [(TOPIC, "orders", TAF)],
        (on_topic("orders", Op.ALTER_CONFIGS),),
        [(TOPIC, "orders", OK)],
        [("AlterTopicConfigs", ("orders",))],
    ),
    Case(
        "alter configs of the broker",
        "AlterConfigs",
        lambda: alter_request(2, (BROKER, "", {})),
        configs_altered,
        [(BROKER, "", CAF)],
        (on_cluster(Op.ALTER_CONFIGS),),
        [(BROKER, "", OK)],
    ),
    Case(
        "incremental alter configs of a topic",
        "IncrementalAlterConfigs",
        lambda: incremental_request(1, (TOPIC, "orders", [("retention.ms", SET, "1000")])),
        configs_altered,
        [(TOPIC, "orders", TAF)],
        (on_topic("orders", Op.ALTER_CONFIGS),),
        [(TOPIC, "orders", OK)],
        [("AlterTopicConfigs", ("orders",))],
    ),
    Case(
        "incremental alter configs of the broker",
        "IncrementalAlterConfigs",
        lambda: incremental_request(1, (BROKER, "", [])),
        configs_altered,
        [(BROKER, "", CAF)],
        (on_cluster(Op.ALTER_CONFIGS),),
        [(BROKER, "", OK)],
    ),
    Case(
        "init producer id, cluster IDEMPOTENT_WRITE",
        "InitProducerId",
        init_producer_id,
        producer_id_given,
        [(CAF, -1)],
        (on_cluster(Op.IDEMPOTENT_WRITE),),
        [(OK, 4001)],
        [("allocate_producer_id", ("a producer id",))],
    ),
    Case(
        "init producer id, topic WRITE (KIP-679)",
        "InitProducerId",
        init_producer_id,
        producer_id_given,
        [(CAF, -1)],
        (on_topic("orders", Op.WRITE),),
        [(OK, 4001)],
        [("allocate_producer_id", ("a producer id",))],
    ),
    Case(
        "describe cluster",
        "DescribeCluster",
        describe_cluster,
        cluster_operations,
        [(OK, 0)],
        (on_cluster(Op.DESCRIBE), on_cluster(Op.ALTER)),
        [(OK, bits(Op.DESCRIBE, Op.ALTER))],
        unrestricted=[(OK, EVERY_CLUSTER_OPERATION)],
        counted=False,
    ),
    Case(
        "describe user scram credentials",
        "DescribeUserScramCredentials",
        lambda: describe_scram_request(None),
        scram_described,
        [(CAF, [])],
        (on_cluster(Op.DESCRIBE),),
        [(OK, ["carol"])],
    ),
    Case(
        "alter user scram credentials",
        "AlterUserScramCredentials",
        lambda: alter_scram_request(upsertions=[upsertion("bob", SHA256, "bob-password")]),
        scram_altered,
        [("bob", CAF)],
        (on_cluster(Op.ALTER),),
        [("bob", OK)],
        [("AlterScramCredentials", ("bob",))],
    ),
    Case(
        "describe client quotas",
        "DescribeClientQuotas",
        describe_quotas,
        quotas_described,
        [(CAF, None)],
        (on_cluster(Op.DESCRIBE_CONFIGS),),
        [(OK, ())],
    ),
]
BY_ID = {case.id: case for case in CASES}


def cases(*marked: tuple[str, pytest.MarkDecorator]) -> list[Any]:
    marks = dict(marked)
    return [
        pytest.param(case, id=case.id, marks=[marks[case.id]] if case.id in marks else [])
        for case in CASES
    ]


def outcome(broker: Broker, case: Case, principal: str = ALICE) -> list[Any]:
    return case.outcome(run(broker, case.request(), principal))


# -- every API: denied by default, served once allowed -----------------------------------------


@pytest.mark.parametrize("case", cases())
def test_denied_without_an_acl_and_reaches_nothing(case: Case) -> None:
    broker = make_broker()
    before = denials(case.api)
    assert outcome(broker, case) == case.denied
    assert trail(broker) == []
    if case.counted:
        assert denials(case.api) > before
    else:
        assert denials(case.api) == before


@pytest.mark.parametrize("case", cases())
def test_another_principal_s_acls_grant_nothing(case: Case) -> None:
    broker = make_broker(*for_principal(case.grants, BOB))
    assert outcome(broker, case) == case.denied
    assert trail(broker) == []
    # ... and bob is served with them.
    assert outcome(broker, case, BOB) == case.served
    assert trail(broker) == case.reaches


@pytest.mark.parametrize("case", cases())
def test_served_once_an_allow_acl_exists(case: Case) -> None:
    broker = make_broker()
    assert outcome(broker, case) == case.denied
    grant(broker, *case.grants)
    before = denials(case.api)
    assert outcome(broker, case) == case.served
    assert trail(broker) == case.reaches
    assert denials(case.api) == before
    if case.reaches:
        return
    # Answered from the view: taken back, it is denied again at once.
    revoke_all(broker)
    assert outcome(broker, case) == case.denied


@pytest.mark.parametrize("case", cases())
def test_unchanged_without_an_authorizer(case: Case) -> None:
    broker = make_broker(*for_principal(case.grants, BOB), authorizer="none")
    before = denials(case.api)
    assert outcome(broker, case) == case.free
    assert trail(broker) == case.reaches
    assert denials(case.api) == before


@pytest.mark.parametrize(
    "case",
    cases(),
)
def test_a_deny_beats_the_allow(case: Case) -> None:
    denies = [
        msgspec.structs.replace(g, operation=int(Op.ALL), permission_type=int(Perm.DENY))
        for g in case.grants
    ]
    broker = make_broker(*case.grants, *denies)
    assert outcome(broker, case) == case.denied
    assert trail(broker) == []


@pytest.mark.parametrize("case", cases())
def test_a_wildcard_deny_beats_the_allow(case: Case) -> None:
    denies = [
        msgspec.structs.replace(
            g,
            resource_name=CLUSTER if g.resource_type == Res.CLUSTER else "*",
            principal="User:*",
            permission_type=int(Perm.DENY),
        )
        for g in case.grants
    ]
    broker = make_broker(*case.grants, *denies)
    assert outcome(broker, case) == case.denied
    assert trail(broker) == []


@pytest.mark.parametrize("case", cases())
def test_super_users_bypass_even_a_deny(case: Case) -> None:
    everything_denied = [
        deny(Res.TOPIC, "*", Op.ALL),
        deny(Res.CLUSTER, CLUSTER, Op.ALL),
    ]
    broker = make_broker(*everything_denied, KAFSCALE_SUPER_USERS=f"User:ops;{ALICE}")
    assert outcome(broker, case) == case.free
    assert trail(broker) == case.reaches
    assert outcome(broker, case, BOB) == case.denied  # not a super user


@pytest.mark.parametrize("case", cases())
def test_allow_everyone_if_no_acl_found(case: Case) -> None:
    broker = make_broker(KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND="true")
    assert outcome(broker, case) == case.free
    assert trail(broker) == case.reaches


def test_the_table_covers_each_api_it_names() -> None:
    by_api: dict[str, set[int]] = {}
    for case in CASES:
        by_api.setdefault(case.api, set()).add(case.api_key)
        assert APIS[case.api_key].name == case.api
        assert APIS[case.api_key].supports(int(case.request().__version__))
    assert all(len(keys) == 1 for keys in by_api.values())


# -- Produce -----------------------------------------------------------------------------------


def test_produce_to_a_topic_that_does_not_exist_is_not_authorized_and_not_created() -> None:
    broker = make_broker(on_topic("orders", Op.WRITE), on_cluster(Op.DESCRIBE))
    assert produced(run(broker, produce("fresh", [0, 1]))) == [
        ("fresh", 0, TAF),
        ("fresh", 1, TAF),
    ]
    assert trail(broker) == [] and "fresh" not in broker.view.snapshot.topics


def test_produce_to_a_missing_topic_without_create_is_not_created() -> None:
    broker = make_broker(on_topic("fresh", Op.WRITE))
    assert produced(run(broker, produce("fresh"))) == [
        ("fresh", 0, ErrorCode.unknown_topic_or_partition)
    ]
    assert trail(broker) == [] and "fresh" not in broker.view.snapshot.topics


def test_produce_with_create_but_without_write_creates_nothing() -> None:
    broker = make_broker(on_topic("fresh", Op.CREATE), on_cluster(Op.CREATE))
    assert produced(run(broker, produce("fresh"))) == [("fresh", 0, TAF)]
    assert trail(broker) == []


@pytest.mark.parametrize(
    "create",
    [on_topic("fresh", Op.CREATE), on_cluster(Op.CREATE), on_topic("fr", Op.CREATE)],
    ids=["topic CREATE", "cluster CREATE", "not this topic"],
)
def test_produce_auto_creates_with_create_on_the_cluster_or_the_topic(create: AclRecord) -> None:
    broker = make_broker(on_topic("fresh", Op.WRITE), create)
    run(broker, produce("fresh"))
    if create.resource_name == "fr":
        assert trail(broker) == [] and "fresh" not in broker.view.snapshot.topics
    else:
        assert trail(broker) == [("create_topics", ("fresh",))]
        assert "fresh" in broker.view.snapshot.topics


def test_produce_is_decided_per_topic() -> None:
    broker = make_broker(on_topic("orders", Op.WRITE))
    schema = load_request_schema(0, 9)
    data = codec.build(codec.nested(schema, "PartitionProduceData"), index=0, records=b"batch")
    entries = tuple(
        codec.build(codec.nested(schema, "TopicProduceData"), name=n, partition_data=(data,))
        for n in ("payments", "orders", "ghost")
    )
    request = codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=entries,
    )
    assert sorted(produced(run(broker, request))) == [
        ("ghost", 0, TAF),
        ("orders", 0, OK),
        ("payments", 0, TAF),
    ]
    assert trail(broker) == [("shard:produce", (0,))]


@pytest.mark.parametrize(
    ("acl", "expected"),
    [
        (allow(Res.TOPIC, "ord", Op.WRITE, pattern=Pat.PREFIXED), OK),
        (allow(Res.TOPIC, "orders", Op.WRITE, pattern=Pat.PREFIXED), OK),
        (allow(Res.TOPIC, "orders-", Op.WRITE, pattern=Pat.PREFIXED), TAF),
        (allow(Res.TOPIC, "x", Op.WRITE, pattern=Pat.PREFIXED), TAF),
        (allow(Res.TOPIC, "*", Op.WRITE), OK),
        (allow(Res.TOPIC, "*", Op.WRITE, principal="User:*"), OK),
        (allow(Res.TOPIC, "orders", Op.ALL), OK),
        (allow(Res.TOPIC, "orders", Op.READ), TAF),
        (allow(Res.TOPIC, "orders", Op.DESCRIBE), TAF),
        (allow(Res.GROUP, "orders", Op.WRITE), TAF),
        (allow(Res.TRANSACTIONAL_ID, "orders", Op.WRITE), TAF),
        (allow(Res.TOPIC, "orders", Op.WRITE, host="10.0.0.9"), OK),
        (allow(Res.TOPIC, "orders", Op.WRITE, host="10.0.0.8"), TAF),
        (allow(Res.TOPIC, "orders", Op.WRITE, principal="Group:alice"), TAF),
    ],
    ids=lambda v: repr(v) if isinstance(v, ErrorCode) else None,
)
def test_which_acls_grant_produce(acl: AclRecord, expected: ErrorCode) -> None:
    broker = make_broker(acl)
    assert produced(run(broker, produce())) == [("orders", 0, expected)]


def test_a_prefixed_deny_beats_a_literal_allow() -> None:
    broker = make_broker(
        on_topic("orders", Op.WRITE), deny(Res.TOPIC, "ord", Op.WRITE, pattern=Pat.PREFIXED)
    )
    assert produced(run(broker, produce())) == [("orders", 0, TAF)]
    assert trail(broker) == []


def test_a_deny_of_another_operation_does_not_deny() -> None:
    broker = make_broker(on_topic("orders", Op.WRITE), deny(Res.TOPIC, "orders", Op.READ))
    assert produced(run(broker, produce())) == [("orders", 0, OK)]


@pytest.mark.parametrize(
    ("peer", "host", "expected"),
    [
        ("[::1]:5555", "::1", OK),
        ("[::1]:5555", "127.0.0.1", TAF),
        ("10.0.0.9:5555", "10.0.0.9", OK),
        ("10.0.0.19:5555", "10.0.0.9", TAF),
    ],
)
def test_acl_hosts_are_the_client_s_address(peer: str, host: str, expected: ErrorCode) -> None:
    broker = make_broker(allow(Res.TOPIC, "orders", Op.WRITE, host=host))
    assert produced(run(broker, produce(), peer=peer)) == [("orders", 0, expected)]


def test_allow_everyone_stops_at_a_resource_with_acls() -> None:
    broker = make_broker(
        on_topic("orders", Op.WRITE, BOB), KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND="true"
    )
    assert produced(run(broker, produce("orders"))) == [("orders", 0, TAF)]
    assert produced(run(broker, produce("payments"))) == [("payments", 0, OK)]


# -- Fetch, ListOffsets, OffsetForLeaderEpoch ----------------------------------------------------


@pytest.mark.parametrize("operation", [Op.DESCRIBE, Op.WRITE, Op.CREATE, Op.DESCRIBE_CONFIGS])
def test_only_read_or_all_grants_fetch(operation: Op) -> None:
    broker = make_broker(on_topic("orders", operation))
    assert fetched(run(broker, fetch(12))) == [(0, TAF)]
    grant(broker, on_topic("orders", Op.ALL))
    assert fetched(run(broker, fetch(12))) == [(0, OK)]


def test_fetch_of_an_unknown_topic() -> None:
    broker = make_broker(on_topic("orders", Op.READ))
    assert fetched(run(broker, fetch(12, topic="ghost"))) == [(0, TAF)]  # existence not told
    grant(broker, on_topic("ghost", Op.READ))
    assert fetched(run(broker, fetch(12, topic="ghost"))) == [
        (0, ErrorCode.unknown_topic_or_partition)
    ]
    # By id: an unknown id has no name to authorize.
    assert fetched(run(broker, fetch(13, topic="", topic_id=uuid.uuid4()))) == [
        (0, ErrorCode.unknown_topic_id)
    ]
    assert trail(broker) == []


def test_fetch_by_id_is_authorized_on_the_topic_the_id_names() -> None:
    broker = make_broker(on_topic("orders", Op.READ))
    assert fetched(run(broker, fetch(13, topic="", topic_id=SECRET_ID))) == [(0, TAF)]
    assert fetched(run(broker, fetch(13, topic="", topic_id=ORDERS_ID))) == [(0, OK)]


@pytest.mark.parametrize("operation", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE])
def test_operations_implying_describe_grant_offset_lookups(operation: Op) -> None:
    broker = make_broker(on_topic("orders", operation))
    assert offsets_listed(run(broker, list_offsets_request(7, {0: -1}))) == [(0, OK)]
    assert epochs_answered(run(broker, epochs_request(4, (0, -1, 5)))) == [(0, OK)]


@pytest.mark.parametrize("operation", [Op.CREATE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS])
def test_other_operations_do_not_grant_offset_lookups(operation: Op) -> None:
    broker = make_broker(on_topic("orders", operation))
    assert offsets_listed(run(broker, list_offsets_request(7, {0: -1}))) == [(0, TAF)]
    assert epochs_answered(run(broker, epochs_request(4, (0, -1, 5)))) == [(0, TAF)]
    assert trail(broker) == []


# -- Metadata ----------------------------------------------------------------------------------


def test_metadata_of_every_topic_leaves_out_the_undescribable_silently() -> None:
    broker = make_broker(
        on_topic("orders", Op.READ), allow(Res.TOPIC, "pay", Op.DESCRIBE, pattern=Pat.PREFIXED)
    )
    before = denials("Metadata")
    response = run(broker, metadata(None))
    assert listed_names(response) == [("orders", OK), ("payments", OK)]
    assert [len(t.partitions) for t in response.topics] == [3, 1]
    assert denials("Metadata") == before


@pytest.mark.parametrize("auto_create", ["true", "false"])
def test_metadata_of_named_topics_never_tells_whether_they_exist(auto_create: str) -> None:
    broker = make_broker(on_topic("orders", Op.DESCRIBE), KAFSCALE_AUTO_CREATE_TOPICS=auto_create)
    before = denials("Metadata")
    response = run(broker, metadata(["orders", "secret", "ghost"], create=True))
    assert listed_names(response) == [("orders", OK), ("secret", TAF), ("ghost", TAF)]
    assert [(t.topic_id or NO_UUID, t.partitions) for t in response.topics[1:]] == [
        (NO_UUID, ())
    ] * 2
    assert denials("Metadata") == before + 2
    assert trail(broker) == []


def test_metadata_by_id_does_not_tell_the_name() -> None:
    broker = make_broker(on_topic("orders", Op.DESCRIBE))
    response = run(broker, metadata([SECRET_ID, ORDERS_ID]))
    assert [(t.name, t.topic_id, ErrorCode(t.error_code)) for t in response.topics] == [
        (None, SECRET_ID, TAF),
        ("orders", ORDERS_ID, OK),
    ]


def test_metadata_by_id_of_an_unauthorized_topic_is_refused() -> None:
    broker = make_broker(on_topic("orders", Op.DESCRIBE))
    response = run(broker, metadata([SECRET_ID, ORDERS_ID]))
    assert [ErrorCode(t.error_code) for t in response.topics] == [TAF, OK]
    assert response.topics[0].partitions == ()


@pytest.mark.parametrize(
    ("acls", "expected", "created"),
    [
        pytest.param([], TAF, False, id="no ACL"),
        pytest.param([on_topic("fresh", Op.DESCRIBE)], TAF, False, id="DESCRIBE without CREATE"),
        pytest.param([on_topic("fresh", Op.CREATE)], TAF, False, id="CREATE without DESCRIBE"),
        pytest.param(
            [on_topic("fresh", Op.DESCRIBE), on_topic("fresh", Op.CREATE)],
            OK,
            True,
            id="DESCRIBE and topic CREATE",
        ),
        pytest.param(
            [on_topic("fresh", Op.DESCRIBE), on_cluster(Op.CREATE)],
            OK,
            True,
            id="DESCRIBE and cluster CREATE",
        ),
        pytest.param(
            [
                allow(Res.TOPIC, "fr", Op.DESCRIBE, pattern=Pat.PREFIXED),
                allow(Res.TOPIC, "fr", Op.CREATE, pattern=Pat.PREFIXED),
            ],
            OK,
            True,
            id="prefixed",
        ),
        pytest.param(
            [on_topic("fresh", Op.DESCRIBE), on_topic("other", Op.CREATE)],
            TAF,
            False,
            id="CREATE on another topic",
        ),
    ],
)
def test_metadata_auto_creates_only_with_create(
    acls: list[AclRecord], expected: ErrorCode, created: bool
) -> None:
    broker = make_broker(*acls)
    response = run(broker, metadata(["fresh"], create=True))
    assert listed_names(response) == [("fresh", expected)]
    assert ("fresh" in broker.view.snapshot.topics) == created
    assert trail(broker) == ([("create_topics", ("fresh",))] if created else [])


def test_metadata_does_not_create_when_the_request_says_no() -> None:
    broker = make_broker(on_topic("fresh", Op.DESCRIBE), on_cluster(Op.CREATE))
    response = run(broker, metadata(["fresh"], create=False))
    assert listed_names(response) == [("fresh", ErrorCode.unknown_topic_or_partition)]
    assert trail(broker) == []


@pytest.mark.parametrize(
    ("acls", "topic_bits", "cluster_bits"),
    [
        pytest.param([on_topic("orders", Op.DESCRIBE)], bits(Op.DESCRIBE), 0, id="describe"),
        pytest.param(
            [on_topic("orders", Op.READ), on_cluster(Op.IDEMPOTENT_WRITE)],
            bits(Op.READ, Op.DESCRIBE),
            bits(Op.IDEMPOTENT_WRITE),
            id="read implies describe",
        ),
        pytest.param(
            [on_topic("orders", Op.ALTER_CONFIGS), on_cluster(Op.ALTER_CONFIGS)],
            0,  # not listed: ALTER_CONFIGS does not imply DESCRIBE
            bits(Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS),
            id="alter configs implies describe configs",
        ),
        pytest.param(
            [on_topic("orders", Op.ALL), deny(Res.TOPIC, "orders", Op.DELETE)],
            EVERY_TOPIC_OPERATION & ~bits(Op.DELETE),
            0,
            id="all but a denied one",
        ),
        pytest.param(
            [on_topic("orders", Op.ALL), on_cluster(Op.ALL)],
            EVERY_TOPIC_OPERATION,
            EVERY_CLUSTER_OPERATION,
            id="all",
        ),
    ],
)
def test_metadata_authorized_operations_come_from_the_acls(
    acls: list[AclRecord], topic_bits: int, cluster_bits: int
) -> None:
    broker = make_broker(*acls)
    response = run(broker, metadata(None, version=10, operations=True))
    listed = {t.name: t.topic_authorized_operations for t in response.topics}
    assert listed == ({"orders": topic_bits} if topic_bits else {})
    assert response.cluster_authorized_operations == cluster_bits
    unasked = run(broker, metadata(None, version=10, operations=False))
    assert unasked.cluster_authorized_operations == NOT_REQUESTED
    assert all(t.topic_authorized_operations == NOT_REQUESTED for t in unasked.topics)


def test_metadata_authorized_operations_without_an_authorizer_are_every_operation() -> None:
    broker = make_broker(authorizer="none")
    response = run(broker, metadata(["orders"], version=10, operations=True))
    assert [t.topic_authorized_operations for t in response.topics] == [EVERY_TOPIC_OPERATION]
    assert response.cluster_authorized_operations == EVERY_CLUSTER_OPERATION


# -- CreateTopics, DeleteTopics ----------------------------------------------------------------


def test_create_topics_is_decided_per_topic() -> None:
    broker = make_broker(
        allow(Res.TOPIC, "team-", Op.CREATE, pattern=Pat.PREFIXED),
        deny(Res.TOPIC, "team-secret", Op.CREATE),
    )
    response = run(broker, create_topics("team-a", "team-secret", "other", "orders"))
    assert topics_created(response) == [
        ("team-a", OK),
        ("team-secret", TAF),
        ("other", TAF),
        ("orders", TAF),  # exists, but that is not told
    ]
    assert trail(broker) == [("create_topics", ("team-a",))]


def test_create_topics_tells_configs_only_with_describe_configs() -> None:
    broker = make_broker(on_cluster(Op.CREATE))
    [created] = run(broker, create_topics("fresh")).topics
    assert created.error_code == OK
    assert created.topic_config_error_code == TAF
    assert not created.configs


def test_create_topics_tells_configs_with_describe_configs() -> None:
    broker = make_broker(on_cluster(Op.CREATE), on_topic("fresh", Op.DESCRIBE_CONFIGS))
    [created] = run(broker, create_topics("fresh")).topics
    assert (created.error_code, created.topic_config_error_code) == (OK, OK)
    assert {c.name for c in created.configs} >= {"retention.ms", "cleanup.policy"}


def test_delete_topics_is_decided_per_topic_and_never_tells_existence() -> None:
    broker = make_broker(on_topic("payments", Op.DELETE))
    ghost_id = uuid.uuid4()
    response = run(broker, delete_topics("orders", "ghost", "payments", SECRET_ID, ghost_id))
    assert sorted(topics_deleted(response), key=repr) == sorted(
        [
            ("orders", NO_UUID, TAF),
            ("ghost", NO_UUID, TAF),
            (None, SECRET_ID, TAF),
            ("payments", PAYMENTS_ID, OK),
            (None, ghost_id, ErrorCode.unknown_topic_id),
        ],
        key=repr,
    )
    assert set(broker.view.snapshot.topics) == {"orders", "secret"}


@pytest.mark.parametrize(
    "request_of", [lambda: create_topics("fresh"), lambda: delete_topics("orders", ORDERS_ID)]
)
def test_a_request_refused_whole_asks_the_coordinator_nothing(
    request_of: Callable[[], Any],
) -> None:
    broker = make_broker()
    run(broker, request_of())
    assert cast(RecordingCoordinator, broker.coordinator).asked == []


# -- configs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        (Op.DESCRIBE_CONFIGS, OK),
        (Op.ALTER_CONFIGS, OK),
        (Op.ALL, OK),
        (Op.DESCRIBE, TAF),
        (Op.ALTER, TAF),
        (Op.READ, TAF),
    ],
)
def test_which_operations_grant_describe_configs(operation: Op, expected: ErrorCode) -> None:
    broker = make_broker(on_topic("orders", operation), on_cluster(operation))
    response = run(
        broker, describe_configs_request(4, (TOPIC, "orders", None), (BROKER, "3", None))
    )
    cluster_expected = OK if expected is OK else CAF
    assert configs_described(response) == [
        (TOPIC, "orders", expected),
        (BROKER, "3", cluster_expected),
    ]
    assert all(bool(r.configs) == (r.error_code == 0) for r in response.results)


def test_describe_configs_of_an_unknown_topic_does_not_tell() -> None:
    broker = make_broker(on_topic("orders", Op.DESCRIBE_CONFIGS))
    response = run(broker, describe_configs_request(4, (TOPIC, "ghost", None)))
    assert configs_described(response) == [(TOPIC, "ghost", TAF)]
    assert response.results[0].configs == ()


def test_alter_configs_is_decided_per_resource() -> None:
    broker = make_broker(on_topic("orders", Op.ALTER_CONFIGS))
    request = incremental_request(
        1,
        (TOPIC, "orders", [("retention.ms", SET, "1000")]),
        (TOPIC, "payments", [("retention.ms", SET, "1000")]),
        (BROKER, "", []),
    )
    assert configs_altered(run(broker, request)) == [
        (TOPIC, "orders", OK),
        (TOPIC, "payments", TAF),
        (BROKER, "", CAF),
    ]
    assert trail(broker) == [("AlterTopicConfigs", ("orders",))]
    assert broker.view.snapshot.topics["orders"].configs == {"retention.ms": "1000"}
    assert broker.view.snapshot.topics["payments"].configs == {}


@pytest.mark.parametrize("operation", [Op.DESCRIBE_CONFIGS, Op.ALTER, Op.WRITE])
def test_alter_configs_needs_alter_configs(operation: Op) -> None:
    broker = make_broker(on_topic("orders", operation))
    request = alter_request(2, (TOPIC, "orders", {"retention.ms": "1000"}))
    assert configs_altered(run(broker, request)) == [(TOPIC, "orders", TAF)]
    assert trail(broker) == []


# -- InitProducerId (KIP-679) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acls", "expected"),
    [
        pytest.param([on_topic("payments", Op.WRITE)], OK, id="WRITE on any topic"),
        pytest.param(
            [allow(Res.TOPIC, "team-", Op.WRITE, pattern=Pat.PREFIXED)], OK, id="prefixed"
        ),
        pytest.param([on_topic("nonexistent", Op.ALL)], OK, id="ALL on a topic"),
        pytest.param(
            [on_topic("*", Op.WRITE, principal="User:*")], OK, id="everyone on every topic"
        ),
        pytest.param([on_topic("orders", Op.READ)], CAF, id="READ"),
        pytest.param([on_topic("orders", Op.WRITE, principal=BOB)], CAF, id="bob's WRITE"),
        pytest.param(
            [allow(Res.TOPIC, "orders", Op.WRITE, host="10.0.0.8")], CAF, id="another host"
        ),
        pytest.param([allow(Res.GROUP, "orders", Op.WRITE)], CAF, id="not a topic"),
        pytest.param([allow(Res.TRANSACTIONAL_ID, "orders", Op.WRITE)], CAF, id="transactional id"),
        pytest.param(
            [on_topic("orders", Op.WRITE), deny(Res.TOPIC, "*", Op.WRITE)],
            CAF,
            id="a DENY on every topic",
        ),
        pytest.param(
            [on_topic("orders", Op.WRITE), deny(Res.TOPIC, "*", Op.ALL, principal="User:*")],
            CAF,
            id="everyone denied ALL on every topic",
        ),
        pytest.param(
            [on_topic("orders", Op.WRITE), deny(Res.TOPIC, "payments", Op.WRITE)],
            OK,
            id="a DENY on another topic",
        ),
        pytest.param(
            [on_cluster(Op.IDEMPOTENT_WRITE), deny(Res.TOPIC, "*", Op.WRITE)],
            OK,
            id="IDEMPOTENT_WRITE whatever the topics",
        ),
        pytest.param([on_cluster(Op.ALL)], OK, id="cluster ALL"),
        pytest.param([on_cluster(Op.CLUSTER_ACTION)], CAF, id="other cluster operation"),
        pytest.param(
            [on_topic("orders", Op.WRITE), deny(Res.TOPIC, "orders", Op.WRITE)],
            CAF,
            id="the only ALLOW denied (literal)",
        ),
        pytest.param(
            [on_topic("orders", Op.WRITE), deny(Res.TOPIC, "or", Op.WRITE, pattern=Pat.PREFIXED)],
            CAF,
            id="the only ALLOW denied (prefix)",
        ),
    ],
)
def test_init_producer_id_kip_679(acls: list[AclRecord], expected: ErrorCode) -> None:
    broker = make_broker(*acls)
    [(code, producer_id)] = producer_id_given(run(broker, init_producer_id()))
    assert code == expected
    assert (producer_id > 0) == (expected is OK)
    assert bool(trail(broker)) == (expected is OK)


def test_init_producer_id_with_allow_everyone_and_unrelated_acls() -> None:
    broker = make_broker(
        on_cluster(Op.ALTER, principal="User:ops"),  # the cluster has ACLs: no free IDEMPOTENT
        on_topic("orders", Op.WRITE, principal=BOB),  # some topic has ACLs, none for alice
        KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND="true",
    )
    assert produced(run(broker, produce("payments"))) == [("payments", 0, OK)]  # she may write
    assert producer_id_given(run(broker, init_producer_id())) == [(OK, 4001)]


def test_init_producer_id_denial_is_counted_once() -> None:
    broker = make_broker()
    before = denials("InitProducerId")
    run(broker, init_producer_id())
    assert denials("InitProducerId") == before + 1


# -- DescribeCluster -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acls", "expected"),
    [
        ([], 0),
        ([on_cluster(Op.ALTER_CONFIGS)], bits(Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS)),
        ([on_cluster(Op.ALTER)], bits(Op.ALTER, Op.DESCRIBE)),
        ([on_cluster(Op.ALL)], EVERY_CLUSTER_OPERATION),
        (
            [on_cluster(Op.ALL), deny(Res.CLUSTER, CLUSTER, Op.ALTER)],
            EVERY_CLUSTER_OPERATION & ~bits(Op.ALTER),
        ),
        ([on_cluster(Op.ALL, principal="User:*")], EVERY_CLUSTER_OPERATION),
        ([on_topic("orders", Op.ALL)], 0),
    ],
)
def test_describe_cluster_operations_come_from_the_acls(
    acls: list[AclRecord], expected: int
) -> None:
    broker = make_broker(*acls)
    response = run(broker, describe_cluster())
    assert (response.error_code, response.cluster_authorized_operations) == (OK, expected)
    assert [b.broker_id for b in response.brokers] == [3, 4]  # served whatever the ACLs
    unasked = codec.build(
        load_request_schema(60, 1),
        include_cluster_authorized_operations=False,
        endpoint_type=1,
        include_fenced_brokers=False,
    )
    assert run(broker, unasked).cluster_authorized_operations == NOT_REQUESTED


# -- SCRAM credentials and quotas ----------------------------------------------------------------


def test_alter_user_scram_credentials_refuses_every_user_and_writes_nothing() -> None:
    broker = make_broker(on_cluster(Op.DESCRIBE), on_cluster(Op.ALTER_CONFIGS))
    request = alter_scram_request(
        deletions=[("carol", SHA256)], upsertions=[upsertion("bob", SHA256, "bob-password")]
    )
    assert scram_altered(run(broker, request)) == [("carol", CAF), ("bob", CAF)]
    assert trail(broker) == []
    assert set(broker.view.snapshot.credentials) == {("carol", "SCRAM-SHA-256")}


def test_cluster_describe_does_not_grant_quotas_and_describe_configs_does() -> None:
    broker = make_broker(on_cluster(Op.DESCRIBE))
    assert quotas_described(run(broker, describe_quotas(0))) == [(CAF, None)]
    grant(broker, on_cluster(Op.ALTER_CONFIGS))  # implies DESCRIBE_CONFIGS
    assert quotas_described(run(broker, describe_quotas(0))) == [(OK, ())]


# -- the authorizer's cache -----------------------------------------------------------------------


def test_the_authorizer_follows_each_broker_s_settings() -> None:
    plain = make_broker()
    privileged = Broker(
        configuration.load(
            {
                "KAFSCALE_BROKER_ID": "3",
                "KAFSCALE_AUTHORIZER": "acl",
                "KAFSCALE_SUPER_USERS": ALICE,
            }
        ),
        plain.view,
        APIS,
        plain.coordinator,
        plain.shards,
    )
    assert produced(run(plain, produce())) == [("orders", 0, TAF)]
    assert produced(run(privileged, produce())) == [("orders", 0, OK)]


# -- every API has a decision --------------------------------------------------------------------


def test_every_api_has_an_authorization_decision() -> None:
    tested_here = {case.api_key for case in CASES}
    decided = tested_here | ACL_APIS | GROUP_APIS | NEEDS_NO_AUTHORIZATION
    undecided = {key: api.name for key, api in APIS.items() if key not in decided}
    assert undecided == {}, f"APIs without an authorization decision: {undecided}"
    # No set claims an API that is gone, and none claims one another set claims.
    assert decided <= set(APIS)
    groups = [tested_here, ACL_APIS, GROUP_APIS, NEEDS_NO_AUTHORIZATION]
    assert sum(map(len, groups)) == len(decided)
    assert {APIS[k].name for k in NEEDS_NO_AUTHORIZATION} == {
        "ApiVersions",
        "SaslHandshake",
        "SaslAuthenticate",
    }
