"""The frontend's request processing, end to end from request bytes to response bytes."""

import asyncio
import dataclasses
import datetime
import io
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from kafscale import config as configuration
from kafscale.coordinator import topics
from kafscale.frontend import requests
from kafscale.frontend.context import Broker
from kafscale.frontend.dispatch import APIS
from kafscale.ipc import messages
from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.metadata.records import BrokerRecord, LeaderRecord, TopicRecord
from kafscale.metadata.view import Snapshot
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode, MalformedRequest, UnknownApi
from tests.unit.protocol.test_codec import request_frame

ORDERS_ID = uuid.uuid4()
ORDERS_EPOCH = 5  # the leader epoch of every partition of "orders", all led by this broker (3)


@dataclass
class StaticView:
    snapshot: Snapshot


class NoShards:
    """Shards are separate processes; request tests here never reach them."""

    def owner(self, topic_id: str, partition: int) -> int:
        raise AssertionError("no shard expected")

    async def append(self, *args: object, **kwargs: object) -> messages.Appended:
        raise AssertionError("no shard expected")


class FakeCoordinator:
    """The coordinator's decisions (kafscale.coordinator.topics) applied to a StaticView."""

    def __init__(
        self, view: StaticView, default_partitions: int = 1, offsets_partitions: int = 5
    ) -> None:
        self.view = view
        self.default_partitions = default_partitions
        self.offsets_partitions = offsets_partitions
        self.created: list[str] = []
        self.producer_ids = 4000

    async def create_topics(
        self, specs: Sequence[TopicSpec], validate_only: bool = False
    ) -> list[TopicResult]:
        outcomes = topics.check_creations(
            specs, self.view.snapshot.topics, [], self.default_partitions, self.offsets_partitions
        )
        for outcome in outcomes:
            if outcome.record is not None and not validate_only:
                self.view.snapshot.topics[outcome.record.name] = outcome.record
                self.created.append(outcome.record.name)
        return [outcome.result for outcome in outcomes]

    async def allocate_producer_id(self) -> int:
        self.producer_ids += 1
        return self.producer_ids

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[TopicResult]:
        outcomes = topics.check_deletions(names, topic_ids, self.view.snapshot.topics)
        for _, record in outcomes:
            if record is not None:
                del self.view.snapshot.topics[record.name]
        return [result for result, _ in outcomes]


def make_broker(**env: str) -> Broker:
    config = configuration.load({"KAFSCALE_BROKER_ID": "3", "KAFSCALE_BROKER_PORT": "19092", **env})
    snapshot = Snapshot(
        revision=5,
        cluster_id="abcdefghijklmnopqrstuv",
        brokers={
            3: BrokerRecord(node_id=3, host="127.0.0.1", port=19092),
            4: BrokerRecord(node_id=4, host="10.0.0.4", port=9092, rack="r1"),
        },
        topics={"orders": TopicRecord(name="orders", topic_id=str(ORDERS_ID), partitions=3)},
        leaders={
            ("orders", p): LeaderRecord(owner=3, epoch=ORDERS_EPOCH, lease=1, run_id="r")
            for p in range(3)
        },
    )
    view = StaticView(snapshot)
    return Broker(config, view, APIS, FakeCoordinator(view), NoShards())


def process(broker: Broker, frame: bytes) -> bytes | None:
    return asyncio.run(requests.process(broker, frame, "test:1"))


def decode_response(frame: bytes, api_key: int, version: int) -> tuple[int, Any]:
    schema = load_response_schema(api_key, version)
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4
    header, header_size = entity_reader(schema.__header_schema__)(frame, 4)
    body, body_size = entity_reader(schema)(frame, 4 + header_size)
    assert 4 + header_size + body_size == len(frame)
    return int(header.correlation_id), body


def api_versions_request(
    version: int, name: str = "kafscale-tests", software_version: str = "1.0"
) -> Any:
    return codec.build(
        load_request_schema(18, version),
        client_software_name=name,
        client_software_version=software_version,
    )


@pytest.mark.parametrize("version", range(5))
def test_api_versions_lists_exactly_the_dispatch_table(version: int) -> None:
    frame = process(make_broker(), request_frame(api_versions_request(version), 11))
    assert frame is not None
    correlation_id, response = decode_response(frame, 18, version)
    assert correlation_id == 11
    assert response.error_code == ErrorCode.none
    advertised = {
        int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
    }
    assert advertised == {
        0: (0, 11),
        1: (4, 17),
        2: (1, 10),
        3: (0, 12),
        8: (2, 9),
        9: (1, 9),
        10: (0, 6),
        11: (0, 9),
        12: (0, 4),
        13: (0, 5),
        14: (0, 5),
        15: (0, 6),
        16: (0, 5),
        17: (0, 1),
        18: (0, 4),
        19: (2, 7),
        20: (1, 6),
        21: (0, 2),
        22: (0, 5),
        23: (2, 4),
        32: (1, 4),
        33: (0, 2),
        35: (1, 4),
        36: (0, 2),
        37: (0, 3),
        42: (0, 2),
        44: (0, 1),
        47: (0, 0),
        29: (1, 3),
        30: (1, 3),
        31: (1, 3),
        48: (0, 1),
        50: (0, 0),
        51: (0, 0),
        60: (0, 2),
        68: (0, 1),
        69: (0, 1),
    }


def test_api_versions_newer_than_ours_gets_the_v0_answer_kip_511() -> None:
    # A v9 request: we cannot parse its body, so only the header prefix is read.
    frame = struct.pack(">hhi", 18, 9, 77) + b"\x00\x05hello\x00garbage"
    response_frame = process(make_broker(), frame)
    assert response_frame is not None
    correlation_id, response = decode_response(response_frame, 18, 0)
    assert correlation_id == 77
    assert response.error_code == ErrorCode.unsupported_version
    assert {int(k.api_key) for k in response.api_keys} == set(APIS)


def test_api_versions_with_invalid_software_name_is_invalid_request() -> None:
    frame = process(make_broker(), request_frame(api_versions_request(3, name="bad name!")))
    assert frame is not None
    _, response = decode_response(frame, 18, 3)
    assert response.error_code == ErrorCode.invalid_request


def metadata(version: int, topics: list[str | uuid.UUID] | None) -> Any:
    schema = load_request_schema(3, version)
    topic_class = codec.nested(schema, "MetadataRequestTopic")
    entries = (
        None
        if topics is None
        else tuple(
            codec.build(topic_class, name=None, topic_id=t)
            if isinstance(t, uuid.UUID)
            else codec.build(topic_class, name=t, topic_id=None)
            for t in topics
        )
    )
    return codec.build(
        schema,
        topics=entries,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@pytest.mark.parametrize("version", range(13))
def test_metadata_all_topics_every_version(version: int) -> None:
    all_topics: list[str | uuid.UUID] | None = [] if version == 0 else None
    frame = process(make_broker(), request_frame(metadata(version, all_topics)))
    assert frame is not None
    _, response = decode_response(frame, 3, version)
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (3, "127.0.0.1", 19092),
        (4, "10.0.0.4", 9092),
    ]
    if version >= 2:
        assert response.cluster_id == "abcdefghijklmnopqrstuv"
    if version >= 1:
        assert response.controller_id == 3
    [topic] = response.topics
    assert topic.name == "orders" and topic.error_code == ErrorCode.none
    assert [p.partition_index for p in topic.partitions] == [0, 1, 2]
    assert all(p.error_code == ErrorCode.none for p in topic.partitions)
    assert all(p.leader_id == 3 and tuple(p.replica_nodes) == (3,) for p in topic.partitions)
    assert all(tuple(p.isr_nodes) == (3,) for p in topic.partitions)
    if version >= 7:
        assert all(p.leader_epoch == ORDERS_EPOCH for p in topic.partitions)
    if version >= 10:
        assert topic.topic_id == ORDERS_ID


def test_metadata_v1_empty_list_means_no_topics() -> None:
    frame = process(make_broker(), request_frame(metadata(1, [])))
    assert frame is not None
    assert decode_response(frame, 3, 1)[1].topics == ()


@pytest.mark.parametrize("version", [0, 4, 9, 12])
def test_metadata_unknown_topic(version: int) -> None:
    broker = make_broker(KAFSCALE_AUTO_CREATE_TOPICS="false")
    frame = process(broker, request_frame(metadata(version, ["orders", "nope"])))
    assert frame is not None
    _, response = decode_response(frame, 3, version)
    errors = {t.name: t.error_code for t in response.topics}
    assert errors == {"orders": ErrorCode.none, "nope": ErrorCode.unknown_topic_or_partition}


def test_metadata_v12_by_topic_id() -> None:
    unknown = uuid.uuid4()
    frame = process(make_broker(), request_frame(metadata(12, [ORDERS_ID, unknown])))
    assert frame is not None
    _, response = decode_response(frame, 3, 12)
    assert [(t.name, t.topic_id, t.error_code) for t in response.topics] == [
        ("orders", ORDERS_ID, ErrorCode.none),
        (None, unknown, ErrorCode.unknown_topic_id),
    ]


def test_this_broker_is_listed_even_before_its_registration_is_seen() -> None:
    broker = make_broker()
    broker.view.snapshot.brokers.clear()  # type: ignore[attr-defined]
    frame = process(broker, request_frame(metadata(12, None)))
    assert frame is not None
    _, response = decode_response(frame, 3, 12)
    assert [(b.node_id, b.port) for b in response.brokers] == [(3, 19092)]


def test_unimplemented_api_gets_an_error_response_not_a_hang_up() -> None:
    # DescribeDelegationToken v1: known to Kafka, not implemented (no delegation tokens).
    request = codec.build(load_request_schema(41, 1), owners=None)
    frame = process(make_broker(), request_frame(request, 5))
    assert frame is not None
    correlation_id, response = decode_response(frame, 41, 1)
    assert correlation_id == 5
    assert response.error_code == ErrorCode.unsupported_version


def test_metadata_version_outside_our_range_gets_an_error_response() -> None:
    request = codec.build(
        load_request_schema(3, 13),
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    frame = process(make_broker(), request_frame(request))
    assert frame is not None
    _, response = decode_response(frame, 3, 13)
    assert response.error_code == ErrorCode.unsupported_version


def test_unknown_api_key_raises_the_decode_error() -> None:
    with pytest.raises(UnknownApi):
        process(make_broker(), struct.pack(">hhi", 4242, 0, 1) + b"\0\0")


def test_version_kafka_never_defined_raises_the_decode_error() -> None:
    with pytest.raises(MalformedRequest):
        process(make_broker(), struct.pack(">hhi", 3, 400, 1) + b"\0\0")


def test_malformed_body_raises_the_decode_error() -> None:
    with pytest.raises(MalformedRequest):
        process(make_broker(), struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff")


def test_correlation_id_and_header_versions_follow_the_request() -> None:
    # Metadata v9 is flexible: request header v2, response header v1 (tagged fields).
    frame = process(make_broker(), request_frame(metadata(9, None), correlation_id=-5))
    assert frame is not None
    assert decode_response(frame, 3, 9)[0] == -5
    buffer = io.BytesIO(frame)
    buffer.seek(8)
    assert buffer.read(1) == b"\x00"  # empty tagged fields of response header v1


def metadata_asking_creation(version: int, names: list[str], allow: bool) -> Any:
    request = metadata(version, list(names))
    if version >= 4:
        request = dataclasses.replace(request, allow_auto_topic_creation=allow)
    return request


@pytest.mark.parametrize("version", [0, 3, 4, 12])
def test_metadata_auto_creates_unknown_topics(version: int) -> None:
    broker = make_broker(KAFSCALE_AUTO_CREATE_PARTITIONS="3")
    broker.coordinator.default_partitions = 3  # type: ignore[attr-defined]
    frame = process(
        broker, request_frame(metadata_asking_creation(version, ["fresh", "bad name"], allow=True))
    )
    assert frame is not None
    _, response = decode_response(frame, 3, version)
    by_name = {t.name: t for t in response.topics}
    assert by_name["fresh"].error_code == ErrorCode.none
    assert len(by_name["fresh"].partitions) == 3
    assert by_name["bad name"].error_code == ErrorCode.invalid_topic_exception


def test_metadata_v4_request_can_refuse_auto_creation() -> None:
    broker = make_broker()
    frame = process(broker, request_frame(metadata_asking_creation(4, ["fresh"], allow=False)))
    assert frame is not None
    [topic] = decode_response(frame, 3, 4)[1].topics
    assert topic.error_code == ErrorCode.unknown_topic_or_partition
    assert broker.coordinator.created == []  # type: ignore[attr-defined]


def create_topics_request(
    version: int, *specs: tuple[str, int, int, dict[str, str]], validate_only: bool = False
) -> Any:
    schema = load_request_schema(19, version)
    topic_class = codec.nested(schema, "CreatableTopic")
    config_class = codec.nested(schema, "CreatableTopicConfig")
    entries = tuple(
        codec.build(
            topic_class,
            name=name,
            num_partitions=partitions,
            replication_factor=replication,
            assignments=(),
            configs=tuple(codec.build(config_class, name=k, value=v) for k, v in configs.items()),
        )
        for name, partitions, replication, configs in specs
    )
    return codec.build(
        schema, topics=entries, timeout=datetime.timedelta(seconds=30), validate_only=validate_only
    )


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics(version: int) -> None:
    broker = make_broker()
    request = create_topics_request(
        version,
        ("events", 4, 1, {"max.message.bytes": "2048"}),
        ("orders", 1, 1, {}),
        ("bad/name", 1, 1, {}),
        ("zero", 0, 1, {}),
        ("conf", 1, 1, {"cleanup.policy": "compact,shred"}),
        ("nonsense", 1, 1, {"no.such.config": "1"}),
        ("rf0", 1, 0, {}),
    )
    frame = process(broker, request_frame(request))
    assert frame is not None
    _, response = decode_response(frame, 19, version)
    errors = {t.name: t.error_code for t in response.topics}
    assert errors == {
        "events": ErrorCode.none,
        "orders": ErrorCode.topic_already_exists,
        "bad/name": ErrorCode.invalid_topic_exception,
        "zero": ErrorCode.invalid_partitions,
        "conf": ErrorCode.invalid_config,
        "nonsense": ErrorCode.invalid_config,
        "rf0": ErrorCode.invalid_replication_factor,
    }
    events = broker.view.snapshot.topics["events"]
    assert events.partitions == 4 and events.configs == {"max.message.bytes": "2048"}
    [created] = [t for t in response.topics if t.name == "events"]
    if version >= 5:
        assert created.num_partitions == 4 and created.replication_factor == 1
        configs = {c.name: (c.value, c.config_source) for c in created.configs}
        assert configs["max.message.bytes"] == ("2048", 1)
        assert configs["cleanup.policy"] == ("delete", 5)
    if version >= 7:
        assert str(created.topic_id) == events.topic_id


def test_create_topics_validate_only_creates_nothing() -> None:
    broker = make_broker()
    frame = process(
        broker, request_frame(create_topics_request(7, ("dry", 2, -1, {}), validate_only=True))
    )
    assert frame is not None
    [topic] = decode_response(frame, 19, 7)[1].topics
    assert topic.error_code == ErrorCode.none and topic.num_partitions == 2
    assert "dry" not in broker.view.snapshot.topics


def test_create_topics_duplicate_in_one_request_is_invalid() -> None:
    frame = process(
        make_broker(),
        request_frame(create_topics_request(4, ("twice", 1, 1, {}), ("twice", 2, 1, {}))),
    )
    assert frame is not None
    assert [t.error_code for t in decode_response(frame, 19, 4)[1].topics] == [
        ErrorCode.invalid_request,
        ErrorCode.invalid_request,
    ]


@pytest.mark.parametrize("version", range(1, 7))
def test_delete_topics(version: int) -> None:
    broker = make_broker()
    schema = load_request_schema(20, version)
    if version >= 6:
        state = codec.nested(schema, "DeleteTopicState")
        request = codec.build(
            schema,
            timeout=datetime.timedelta(seconds=5),
            topics=(
                codec.build(state, name="orders", topic_id=uuid.UUID(int=0)),
                codec.build(state, name="ghost", topic_id=uuid.UUID(int=0)),
                codec.build(state, name=None, topic_id=uuid.UUID(int=7)),
            ),
        )
    else:
        request = codec.build(
            schema, timeout=datetime.timedelta(seconds=5), topic_names=("orders", "ghost")
        )
    frame = process(broker, request_frame(request))
    assert frame is not None
    _, response = decode_response(frame, 20, version)
    errors = [(r.name, r.error_code) for r in response.responses]
    expected = [("orders", ErrorCode.none), ("ghost", ErrorCode.unknown_topic_or_partition)]
    if version >= 6:
        expected.append((None, ErrorCode.unknown_topic_id))
    assert errors == expected
    assert "orders" not in broker.view.snapshot.topics


@pytest.mark.parametrize("version", range(6))
def test_init_producer_id(version: int) -> None:
    schema = load_request_schema(22, version)
    broker = make_broker()
    ids = []
    for correlation_id in range(2):
        request = codec.build(
            schema,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
        frame = process(broker, request_frame(request, correlation_id))
        assert frame is not None
        _, response = decode_response(frame, 22, version)
        assert (response.error_code, response.producer_epoch) == (ErrorCode.none, 0)
        ids.append(response.producer_id)
    assert ids == [4001, 4002]
    transactional = codec.build(
        schema,
        transactional_id="tx-1",
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    frame = process(broker, request_frame(transactional))
    assert frame is not None
    _, response = decode_response(frame, 22, version)
    assert (response.error_code, response.producer_id) == (ErrorCode.unsupported_version, -1)


def legacy_produce(version: int, acks: int) -> bytes:
    message_set = b"\x00" * 26
    return (
        struct.pack(">hhih", 0, version, 51, 4)
        + b"test"
        + struct.pack(">hii", acks, 1000, 1)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">i", 2)
        + struct.pack(">ii", 0, len(message_set))
        + message_set
        + struct.pack(">ii", 1, len(message_set))
        + message_set
    )


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_is_refused_with_unsupported_version(version: int) -> None:
    frame = process(make_broker(), legacy_produce(version, acks=1))
    assert frame is not None
    (length, correlation_id, topics) = struct.unpack_from(">iii", frame)
    assert (length, correlation_id, topics) == (len(frame) - 4, 51, 1)
    pos = 12
    (name_length,) = struct.unpack_from(">h", frame, pos)
    assert frame[pos + 2 : pos + 2 + name_length] == b"orders"
    pos += 2 + name_length
    (partitions,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    results = []
    for _ in range(partitions):
        results.append(struct.unpack_from(">ihq", frame, pos))
        pos += 14 + (8 if version >= 2 else 0)
    assert results == [
        (0, ErrorCode.unsupported_version, -1),
        (1, ErrorCode.unsupported_version, -1),
    ]
    assert len(frame) == pos + (4 if version >= 1 else 0)


def test_produce_v0_with_acks_0_gets_no_answer() -> None:
    assert process(make_broker(), legacy_produce(0, acks=0)) is None


def test_truncated_produce_v0_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        process(make_broker(), legacy_produce(1, acks=1)[:-10])


def find_coordinator(version: int, *groups: str, key_type: int = 0) -> Any:
    schema = load_request_schema(10, version)
    if version >= 4:
        return codec.build(schema, key_type=key_type, coordinator_keys=groups)
    return codec.build(schema, key=groups[0], key_type=key_type)


@pytest.mark.parametrize("version", [0, 3, 4, 6])
def test_a_group_lookup_creates_consumer_offsets_as_an_internal_topic(version: int) -> None:
    # franz-go's TestConsumeRegex: after FindCoordinator, Metadata must list __consumer_offsets
    # with is_internal (Kafka creates it on the first lookup), so regex consumers leave it out.
    broker = make_broker(KAFSCALE_AUTO_CREATE_TOPICS="false")
    coordinator = broker.coordinator
    assert isinstance(coordinator, FakeCoordinator)
    process(broker, request_frame(find_coordinator(version, "g")))
    process(broker, request_frame(find_coordinator(version, "h")))
    assert coordinator.created == ["__consumer_offsets"]  # once, whatever auto-creation says
    frame = process(broker, request_frame(metadata(12, None)))
    assert frame is not None
    listed = {
        t.name: (t.is_internal, len(t.partitions)) for t in decode_response(frame, 3, 12)[1].topics
    }
    assert listed == {"orders": (False, 3), "__consumer_offsets": (True, 5)}


def test_a_transaction_coordinator_lookup_creates_nothing() -> None:
    broker = make_broker()
    frame = process(broker, request_frame(find_coordinator(4, "txn", key_type=1)))
    assert frame is not None
    [found] = decode_response(frame, 10, 4)[1].coordinators
    assert found.error_code == ErrorCode.invalid_request
    assert isinstance(broker.coordinator, FakeCoordinator) and broker.coordinator.created == []


def test_produce_to_an_internal_topic_is_refused_and_creates_nothing() -> None:
    broker = make_broker()
    schema = load_request_schema(0, 9)
    partition = codec.build(codec.nested(schema, "PartitionProduceData"), index=0, records=b"x")
    topic = codec.build(
        codec.nested(schema, "TopicProduceData"),
        name="__consumer_offsets",
        partition_data=(partition,),
    )
    request = codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(topic,),
    )
    frame = process(broker, request_frame(request))
    assert frame is not None
    [answered] = decode_response(frame, 0, 9)[1].responses
    [result] = answered.partition_responses
    assert result.error_code == ErrorCode.invalid_topic_exception
    assert isinstance(broker.coordinator, FakeCoordinator) and broker.coordinator.created == []
