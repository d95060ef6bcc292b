"""Partition leadership as clients see it (issue 16): Metadata from the leader keys, and
Produce, Fetch, ListOffsets and OffsetForLeaderEpoch refused for partitions this broker does not
lead or asked for at another leader epoch, with KIP-951's current leader and node endpoints.

This broker is 3. Topic "orders" has four partitions: 0 led by this broker (epoch 5), 1 by
broker 4 (epoch 7), 2 by nobody (no leader key), 3 by broker 9, whose registration is gone
(epoch 2)."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from kio.index import load_request_schema

from kafscale import config as configuration
from kafscale.frontend import requests
from kafscale.frontend.context import Broker, RequestContext, Session
from kafscale.frontend.dispatch import APIS
from kafscale.frontend.leaders import NO_EPOCH, NO_LEADER, Leader, Leaders, live_brokers
from kafscale.ipc import messages
from kafscale.ipc.rpc import Reply
from kafscale.metadata.records import BrokerRecord, LeaderRecord, TopicRecord
from kafscale.metadata.view import Snapshot
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from tests.unit.frontend.test_requests import FakeCoordinator, StaticView, decode_response
from tests.unit.protocol.test_codec import request_frame

ORDERS_ID = uuid.uuid4()
OURS, THEIRS, NOBODY, GONE = 0, 1, 2, 3  # partitions of "orders"
NOT_LEADER = ErrorCode.not_leader_or_follower
FENCED = ErrorCode.fenced_leader_epoch
UNKNOWN_EPOCH = ErrorCode.unknown_leader_epoch
BROKER_4 = ("10.0.0.4", 9092, "r1")


def leader_key(owner: int, epoch: int) -> LeaderRecord:
    return LeaderRecord(owner=owner, epoch=epoch, lease=owner + 100, run_id=f"run-{owner}")


def snapshot() -> Snapshot:
    return Snapshot(
        revision=9,
        cluster_id="abcdefghijklmnopqrstuv",
        brokers={
            3: BrokerRecord(node_id=3, host="127.0.0.1", port=19092),
            4: BrokerRecord(node_id=4, host=BROKER_4[0], port=BROKER_4[1], rack=BROKER_4[2]),
        },
        topics={"orders": TopicRecord(name="orders", topic_id=str(ORDERS_ID), partitions=4)},
        leaders={
            ("orders", OURS): leader_key(3, 5),
            ("orders", THEIRS): leader_key(4, 7),
            ("orders", GONE): leader_key(9, 2),
        },
    )


@dataclass
class RecordingShards:
    """One shard; records what reaches it. Appends and fetches succeed, unless the partition is
    in ``refused`` (the shard's own NOT_LEADER_OR_FOLLOWER); offsets are answered with fixed
    values (an epoch query: its epoch, ending at 100 + epoch)."""

    sent: list[tuple[str, int]] = field(default_factory=list)  # (api, partition)
    epoch_queries: list[int | None] = field(default_factory=list)
    refused: set[int] = field(default_factory=set)

    def owner(self, topic_id: str, partition: int) -> int:
        return 0

    async def append(
        self, shard: int, request: messages.Append, records: Sequence[bytes], timeout: float
    ) -> messages.Appended:
        self.sent += [("produce", e.partition) for e in request.entries]
        return messages.Appended(results=[self._appended(e.partition) for e in request.entries])

    def _appended(self, partition: int) -> messages.AppendResult:
        if partition in self.refused:
            return messages.AppendResult(error_code=int(NOT_LEADER))
        return messages.AppendResult(base_offset=10)

    async def fetch(self, shard: int, request: messages.Fetch, timeout: float) -> Reply:
        self.sent += [("fetch", e.partition) for e in request.entries]
        results = [
            messages.FetchResult(error_code=int(NOT_LEADER))
            if e.partition in self.refused
            else messages.FetchResult(high_watermark=3, log_start_offset=0)
            for e in request.entries
        ]
        return Reply(messages.Fetched(results=results))

    async def release(self, shard: int, fetch_id: int) -> None:
        pass

    async def list_offsets(
        self, shard: int, request: messages.ListOffsets, timeout: float
    ) -> messages.OffsetsListed:
        self.sent += [("offsets", q.partition) for q in request.queries]
        self.epoch_queries += [q.leader_epoch for q in request.queries]
        return messages.OffsetsListed(
            results=[
                messages.OffsetAnswer(offset=42, leader_epoch=5)
                if q.leader_epoch is None
                else messages.OffsetAnswer(offset=100 + q.leader_epoch, leader_epoch=q.leader_epoch)
                for q in request.queries
            ]
        )


def make_broker(node_id: int = 3, view: Snapshot | None = None) -> Broker:
    config = configuration.load(
        {"KAFSCALE_BROKER_ID": str(node_id), "KAFSCALE_BROKER_PORT": "19092"}
    )
    static = StaticView(view if view is not None else snapshot())
    return Broker(config, static, APIS, FakeCoordinator(static), cast(Any, RecordingShards()))


def shards(broker: Broker) -> RecordingShards:
    assert isinstance(broker.shards, RecordingShards)
    return broker.shards


def call(broker: Broker, request: Any, api_key: int) -> Any:
    answer = asyncio.run(requests.process(broker, request_frame(request), "test:1"))
    assert answer is not None
    frame = answer if isinstance(answer, bytes) else b"".join(bytes(c) for c in answer)
    return decode_response(frame, api_key, int(request.__version__))[1]


def context(broker: Broker) -> RequestContext:
    return RequestContext(broker, codec.RequestHeader(3, 12, 1, None), "test:1")


# -- kafscale.frontend.leaders ----------------------------------------------------------------


def test_each_partition_s_leader_comes_from_its_leader_key() -> None:
    leaders = Leaders(context(make_broker()))
    assert [leaders.of("orders", p) for p in range(4)] == [
        Leader(3, 5),
        Leader(4, 7),
        Leader(NO_LEADER, NO_EPOCH),  # no key: offline, epoch unknown
        Leader(NO_LEADER, 2),  # its owner is not registered: offline at the key's epoch
    ]
    assert leaders.of("unknown", 0) == Leader()


def test_this_broker_leads_its_partitions_before_its_registration_is_seen() -> None:
    view = snapshot()
    del view.brokers[3]
    leaders = Leaders(context(make_broker(view=view)))
    assert leaders.of("orders", OURS) == Leader(3, 5)
    assert leaders.check("orders", OURS) is None


@pytest.mark.parametrize(
    ("partition", "current_epoch", "expected"),
    [
        (OURS, -1, None),  # no epoch: no check
        (OURS, 5, None),
        (OURS, 4, FENCED),  # the client knows an older leader
        (OURS, 6, UNKNOWN_EPOCH),  # the client knows a newer leader than this broker has seen
        (THEIRS, -1, NOT_LEADER),
        (THEIRS, 7, NOT_LEADER),
        (THEIRS, 6, FENCED),  # the epoch first, as Kafka's Partition.getLocalLog
        (THEIRS, 8, UNKNOWN_EPOCH),
        (NOBODY, -1, NOT_LEADER),
        (NOBODY, 3, NOT_LEADER),  # no epoch to compare with
        (GONE, 2, NOT_LEADER),
        (GONE, 1, FENCED),
        (GONE, 3, UNKNOWN_EPOCH),
    ],
)
def test_check(partition: int, current_epoch: int, expected: ErrorCode | None) -> None:
    leaders = Leaders(context(make_broker()))
    assert leaders.check("orders", partition, current_epoch) == expected


def test_only_live_leaders_named_in_refusals_have_endpoints() -> None:
    leaders = Leaders(context(make_broker()))
    assert leaders.node_endpoints() == []
    for partition in (THEIRS, NOBODY, GONE, THEIRS):
        leaders.current_leader("orders", partition)
    assert [(b.node_id, b.host, b.port, b.rack) for b in leaders.node_endpoints()] == [
        (4, *BROKER_4)
    ]


# -- Metadata ---------------------------------------------------------------------------------


def metadata_request(version: int) -> Any:
    schema = load_request_schema(3, version)
    return codec.build(
        schema,
        topics=() if version == 0 else None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@pytest.mark.parametrize("version", range(13))
def test_metadata_leaders_epochs_and_offline_partitions(version: int) -> None:
    response = call(make_broker(), metadata_request(version), 3)
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (3, "127.0.0.1", 19092),
        (4, BROKER_4[0], BROKER_4[1]),
    ]
    [topic] = response.topics
    assert topic.error_code == ErrorCode.none
    got = [
        (p.partition_index, p.error_code, p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes))
        for p in topic.partitions
    ]
    offline = ErrorCode.leader_not_available
    assert got == [
        (OURS, ErrorCode.none, 3, (3,), (3,)),
        (THEIRS, ErrorCode.none, 4, (4,), (4,)),
        (NOBODY, offline, -1, (), ()),
        (GONE, offline, -1, (), ()),
    ]
    if version >= 7:
        assert [p.leader_epoch for p in topic.partitions] == [5, 7, -1, 2]


def test_every_broker_answers_the_same_leaders() -> None:
    view = snapshot()
    ours = call(make_broker(3, view), metadata_request(12), 3)
    theirs = call(make_broker(4, view), metadata_request(12), 3)
    assert ours.topics == theirs.topics and ours.brokers == theirs.brokers


# -- Produce ----------------------------------------------------------------------------------


def produce_request(version: int, partitions: Sequence[int]) -> Any:
    schema = load_request_schema(0, version)
    data = tuple(
        codec.build(codec.nested(schema, "PartitionProduceData"), index=p, records=b"batch")
        for p in partitions
    )
    topic = codec.build(
        codec.nested(schema, "TopicProduceData"), name="orders", partition_data=data
    )
    return codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(topic,),
    )


def produced(response: Any) -> dict[int, Any]:
    [topic] = response.responses
    return {int(p.index): p for p in topic.partition_responses}


@pytest.mark.parametrize("version", [3, 9, 10, 11])
def test_produce_to_a_partition_this_broker_does_not_lead(version: int) -> None:
    broker = make_broker()
    response = call(broker, produce_request(version, range(4)), 0)
    results = produced(response)
    assert {p: r.error_code for p, r in results.items()} == {
        OURS: ErrorCode.none,
        THEIRS: NOT_LEADER,
        NOBODY: NOT_LEADER,
        GONE: NOT_LEADER,
    }
    assert shards(broker).sent == [("produce", OURS)]  # nothing else reached the shard
    if version < 10:
        assert not hasattr(results[THEIRS], "current_leader")
        return
    # KIP-951: where each refused partition's leader is, and how to reach it.
    leaders = {
        p: (r.current_leader.leader_id, r.current_leader.leader_epoch) for p, r in results.items()
    }
    assert leaders == {OURS: (-1, -1), THEIRS: (4, 7), NOBODY: (-1, -1), GONE: (-1, 2)}
    assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
        (4, *BROKER_4)
    ]


def test_produce_refused_by_the_shard_names_this_broker_from_the_view() -> None:
    # The view says this broker leads, the shard has not opened the partition (yet): the
    # client is told to come back here, at the epoch the view knows.
    broker = make_broker()
    shards(broker).refused.add(OURS)
    response = call(broker, produce_request(11, [OURS]), 0)
    result = produced(response)[OURS]
    assert result.error_code == NOT_LEADER
    assert (result.current_leader.leader_id, result.current_leader.leader_epoch) == (3, 5)
    assert [(n.node_id, n.port) for n in response.node_endpoints] == [(3, 19092)]


def test_produce_without_refusals_names_no_endpoints() -> None:
    response = call(make_broker(), produce_request(11, [OURS]), 0)
    assert response.node_endpoints == ()


# -- Fetch ------------------------------------------------------------------------------------


def fetch_request(version: int, epochs: dict[int, int]) -> Any:
    """A fetch of every partition in ``epochs`` (partition: current leader epoch)."""
    schema = load_request_schema(1, version)
    partitions = tuple(
        codec.build(
            codec.nested(schema, "FetchPartition"),
            partition=p,
            current_leader_epoch=epoch,
            fetch_offset=0,
            partition_max_bytes=1 << 20,
        )
        for p, epoch in epochs.items()
    )
    topic = codec.build(
        codec.nested(schema, "FetchTopic"),
        topic="orders",
        topic_id=ORDERS_ID,
        partitions=partitions,
    )
    return codec.build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(topic,),
        forgotten_topics_data=(),
        rack_id="",
    )


def fetched(response: Any) -> dict[int, Any]:
    [topic] = response.responses
    return {int(p.partition_index): p for p in topic.partitions}


@pytest.mark.parametrize("version", [4, 9, 11, 12, 15, 16, 17])
def test_fetch_from_a_partition_this_broker_does_not_lead(version: int) -> None:
    broker = make_broker()
    epochs = {OURS: -1, THEIRS: -1, NOBODY: -1, GONE: -1}
    results = fetched(call(broker, fetch_request(version, epochs), 1))
    assert {p: r.error_code for p, r in results.items()} == {
        OURS: ErrorCode.none,
        THEIRS: NOT_LEADER,
        NOBODY: NOT_LEADER,
        GONE: NOT_LEADER,
    }
    assert results[OURS].high_watermark == 3
    assert shards(broker).sent == [("fetch", OURS)]


@pytest.mark.parametrize("version", [9, 11, 12, 15, 16, 17])
def test_fetch_compares_the_client_s_leader_epoch(version: int) -> None:
    # v9 brought CurrentLeaderEpoch into the request.
    broker = make_broker()
    epochs = {OURS: 4, THEIRS: 8, GONE: 1}
    results = fetched(call(broker, fetch_request(version, epochs), 1))
    assert {p: r.error_code for p, r in results.items()} == {
        OURS: FENCED,
        THEIRS: UNKNOWN_EPOCH,
        GONE: FENCED,
    }
    assert shards(broker).sent == []
    assert fetched(call(broker, fetch_request(version, {OURS: 5}), 1))[OURS].error_code == 0


@pytest.mark.parametrize("version", [11, 12, 15, 16, 17])
def test_fetch_refusals_name_the_current_leader_kip_951(version: int) -> None:
    broker = make_broker()
    shards(broker).refused.add(OURS)
    epochs = {OURS: -1, THEIRS: -1, NOBODY: -1, GONE: 1}
    response = call(broker, fetch_request(version, epochs), 1)
    results = fetched(response)
    if version < 12:  # no tagged fields before v12
        assert not hasattr(results[THEIRS], "current_leader")
        return
    leaders = {
        p: (r.current_leader.leader_id, r.current_leader.leader_epoch) for p, r in results.items()
    }
    # NOT_LEADER_OR_FOLLOWER (the shard's too) and FENCED_LEADER_EPOCH name the leader.
    assert leaders == {OURS: (3, 5), THEIRS: (4, 7), NOBODY: (-1, -1), GONE: (-1, 2)}
    endpoints = [
        (n.node_id, n.host, n.port, n.rack) for n in getattr(response, "node_endpoints", ())
    ]
    if version >= 16:
        assert endpoints == [(3, "127.0.0.1", 19092, None), (4, *BROKER_4)]
    else:
        assert not hasattr(response, "node_endpoints")


def test_fetch_unknown_epoch_names_no_leader() -> None:
    # Only NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH carry the hint (KafkaApis).
    response = call(make_broker(), fetch_request(17, {THEIRS: 8}), 1)
    result = fetched(response)[THEIRS]
    assert result.error_code == UNKNOWN_EPOCH
    assert (result.current_leader.leader_id, response.node_endpoints) == (-1, ())


# -- ListOffsets ------------------------------------------------------------------------------


def list_offsets_request(version: int, epochs: dict[int, int]) -> Any:
    schema = load_request_schema(2, version)
    partitions = tuple(
        codec.build(
            codec.nested(schema, "ListOffsetsPartition"),
            partition_index=p,
            current_leader_epoch=epoch,
            timestamp=-1,
        )
        for p, epoch in epochs.items()
    )
    topic = codec.build(
        codec.nested(schema, "ListOffsetsTopic"), name="orders", partitions=partitions
    )
    return codec.build(
        schema,
        replica_id=-1,
        isolation_level=0,
        topics=(topic,),
        timeout=datetime.timedelta(seconds=5),
    )


def listed(response: Any) -> dict[int, tuple[int, int, int]]:
    [topic] = response.topics
    return {
        int(p.partition_index): (p.error_code, p.offset, getattr(p, "leader_epoch", -1))
        for p in topic.partitions
    }


@pytest.mark.parametrize("version", [1, 4, 10])
def test_list_offsets_leadership(version: int) -> None:
    broker = make_broker()
    epochs = {OURS: -1, THEIRS: -1, NOBODY: -1, GONE: -1}
    assert listed(call(broker, list_offsets_request(version, epochs), 2)) == {
        OURS: (ErrorCode.none, 42, 5 if version >= 4 else -1),
        THEIRS: (NOT_LEADER, -1, -1),
        NOBODY: (NOT_LEADER, -1, -1),
        GONE: (NOT_LEADER, -1, -1),
    }
    assert shards(broker).sent == [("offsets", OURS)]


@pytest.mark.parametrize("version", [4, 10])
def test_list_offsets_compares_the_client_s_leader_epoch(version: int) -> None:
    # v4 brought CurrentLeaderEpoch into the request.
    broker = make_broker()
    answers = listed(call(broker, list_offsets_request(version, {OURS: 4, THEIRS: 8}), 2))
    assert {p: a[0] for p, a in answers.items()} == {OURS: FENCED, THEIRS: UNKNOWN_EPOCH}
    answers = listed(call(broker, list_offsets_request(version, {OURS: 6, GONE: 2}), 2))
    assert {p: a[0] for p, a in answers.items()} == {OURS: UNKNOWN_EPOCH, GONE: NOT_LEADER}
    assert shards(broker).sent == []


# -- OffsetForLeaderEpoch ---------------------------------------------------------------------


def epochs_request(version: int, *asked: tuple[int, int, int]) -> Any:
    """(partition, current leader epoch, leader epoch) of each partition asked."""
    schema = load_request_schema(23, version)
    partitions = tuple(
        codec.build(
            codec.nested(schema, "OffsetForLeaderPartition"),
            partition=p,
            current_leader_epoch=current,
            leader_epoch=epoch,
        )
        for p, current, epoch in asked
    )
    topic = codec.build(
        codec.nested(schema, "OffsetForLeaderTopic"), topic="orders", partitions=partitions
    )
    return codec.build(schema, replica_id=-1, topics=(topic,))


def epoch_ends(response: Any) -> list[tuple[int, int, int, int]]:
    [topic] = response.topics
    return [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in topic.partitions]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_asks_the_shard_for_the_epoch_s_end(version: int) -> None:
    broker = make_broker()
    # The shard answers from the partition's epoch history (tests/unit/shards).
    for current_epoch, epoch in ((5, 3), (-1, 0)):
        response = call(broker, epochs_request(version, (OURS, current_epoch, epoch)), 23)
        assert epoch_ends(response) == [(OURS, 0, epoch, 100 + epoch)]
    assert shards(broker).epoch_queries == [3, 0]


@pytest.mark.parametrize("version", [2, 4])
def test_offset_for_leader_epoch_leadership_and_epochs(version: int) -> None:
    broker = make_broker()
    asked = [(THEIRS, -1, 7), (NOBODY, -1, 0), (GONE, 2, 2)]
    response = call(broker, epochs_request(version, *asked), 23)
    assert epoch_ends(response) == [
        (THEIRS, NOT_LEADER, -1, -1),
        (NOBODY, NOT_LEADER, -1, -1),
        (GONE, NOT_LEADER, -1, -1),
    ]
    for current_epoch, error in ((4, FENCED), (6, UNKNOWN_EPOCH)):
        response = call(broker, epochs_request(version, (OURS, current_epoch, 4)), 23)
        assert epoch_ends(response) == [(OURS, error, -1, -1)]
    assert shards(broker).sent == []


def test_brokers_are_described_at_the_endpoint_of_the_request_s_listener() -> None:
    """Issue 17: a broker registers every listener; a request sees the brokers at the endpoints
    of the listener it came in on, and a broker without that listener is left out (Kafka)."""
    config = configuration.load(
        {
            "KAFSCALE_BROKER_ID": "3",
            "KAFSCALE_LISTENERS": "INTERNAL://10.0.0.3:9092,EXTERNAL://10.0.0.3:9094",
            "KAFSCALE_ADVERTISED_LISTENERS": "EXTERNAL://b3.example.com:19094",
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        }
    )
    registered = {
        4: BrokerRecord(
            4, "10.0.0.4", 9092, listeners={"INTERNAL": ("10.0.0.4", 9092), "EXTERNAL": ("b4", 1)}
        ),
        5: BrokerRecord(5, "10.0.0.5", 9092),  # registered before listeners: PLAINTEXT only
    }
    static = StaticView(Snapshot(brokers=registered))
    broker = Broker(config, static, APIS, FakeCoordinator(static), cast(Any, RecordingShards()))

    def seen(listener: str) -> list[tuple[int, str, int]]:
        ctx = RequestContext(
            broker, codec.RequestHeader(3, 12, 1, None), "test:1", Session(listener)
        )
        return [(b.node_id, b.host, b.port) for b in live_brokers(ctx, registered)]

    assert seen("EXTERNAL") == [(3, "b3.example.com", 19094), (4, "b4", 1)]
    assert seen("INTERNAL") == [(3, "10.0.0.3", 9092), (4, "10.0.0.4", 9092)]
    assert seen("PLAINTEXT") == [(5, "10.0.0.5", 9092)]
