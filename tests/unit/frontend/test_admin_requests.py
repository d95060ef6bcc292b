"""The operations APIs end to end from request bytes to response bytes: DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, CreatePartitions, DescribeCluster, SaslHandshake.

The coordinator's decisions are the real pure functions (``kafscale.coordinator.configs``)
applied to a static view, as ``FakeCoordinator`` does for topic creation."""

from __future__ import annotations

import datetime
from typing import Any

import msgspec
import pytest
from kio.index import load_request_schema

from kafscale.coordinator import configs as coordinator_configs
from kafscale.frontend.context import Broker
from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcError
from kafscale.metadata import topic_configs
from kafscale.metadata.records import TopicRecord
from kafscale.protocol import codec
from kafscale.protocol.configs import AlterConfigOp, ConfigSource, ConfigType, ResourceType
from kafscale.protocol.errors import ErrorCode
from tests.unit.frontend.test_requests import (
    FakeCoordinator,
    StaticView,
    create_topics_request,
    decode_response,
    make_broker,
    process,
)
from tests.unit.protocol.test_codec import request_frame

TOPIC, BROKER, BROKER_LOGGER = ResourceType.TOPIC, ResourceType.BROKER, ResourceType.BROKER_LOGGER


class AdminCoordinator(FakeCoordinator):
    """Applies AlterTopicConfigs and CreatePartitions to the view; ``calls`` records them."""

    def __init__(self, view: StaticView, broker_id: int) -> None:
        super().__init__(view)
        self.broker_id = broker_id
        self.calls: list[messages.Message] = []
        self.unreachable = False

    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        if self.unreachable:
            raise RpcError("no answer")
        self.calls.append(request)
        topics = self.view.snapshot.topics
        results = []
        if isinstance(request, messages.AlterTopicConfigs):
            for changes in request.topics:
                updated, result = coordinator_configs.alter_topic(
                    topics.get(changes.topic), changes, request.replace
                )
                self._apply(updated, request.validate_only)
                results.append(result)
        elif isinstance(request, messages.CreatePartitions):
            for increase in request.topics:
                updated, result = coordinator_configs.increase_partitions(
                    topics.get(increase.topic), increase, self.broker_id
                )
                self._apply(updated, request.validate_only)
                results.append(result)
        else:
            raise AssertionError(f"unexpected {request!r}")
        return messages.TopicResults(results=results, revision=0)

    async def caught_up(self, revision: int) -> None:
        pass

    def _apply(self, record: TopicRecord | None, validate_only: bool) -> None:
        if record is not None and not validate_only:
            self.view.snapshot.topics[record.name] = record


def admin_broker(**env: str) -> Broker:
    broker = make_broker(**env)
    coordinator = AdminCoordinator(broker.view, broker.node_id)  # type: ignore[arg-type]
    broker = Broker(broker.config, broker.view, broker.apis, coordinator, broker.shards)
    orders = broker.view.snapshot.topics["orders"]
    broker.view.snapshot.topics["orders"] = msgspec.structs.replace(  # type: ignore[index]
        orders, configs={"retention.ms": "3600000"}
    )
    return broker


def topics(broker: Broker) -> dict[str, TopicRecord]:
    return broker.view.snapshot.topics


def call(broker: Broker, request: Any, api_key: int) -> Any:
    frame = process(broker, request_frame(request))
    assert frame is not None
    return decode_response(frame, api_key, int(request.__version__))[1]


# -- DescribeConfigs ---------------------------------------------------------------------------


def describe_request(
    version: int,
    *resources: tuple[int, str, tuple[str, ...] | None],
    synonyms: bool = False,
    documentation: bool = False,
) -> Any:
    schema = load_request_schema(32, version)
    resource_class = codec.nested(schema, "DescribeConfigsResource")
    return codec.build(
        schema,
        resources=tuple(
            codec.build(resource_class, resource_type=t, resource_name=n, configuration_keys=k)
            for t, n, k in resources
        ),
        include_synonyms=synonyms,
        include_documentation=documentation,
    )


@pytest.mark.parametrize("version", range(1, 5))
def test_describe_configs_of_a_topic(version: int) -> None:
    request = describe_request(version, (TOPIC, "orders", None), synonyms=True, documentation=True)
    [result] = call(admin_broker(), request, 32).results
    assert (result.error_code, result.resource_name) == (ErrorCode.none, "orders")
    configs = {c.name: c for c in result.configs}
    assert list(configs) == sorted(topic_configs.CONFIGS)  # all 33 of Kafka 4.3's
    retention = configs["retention.ms"]
    assert (retention.value, retention.config_source) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
    )
    assert not retention.read_only and not retention.is_sensitive
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    segment = configs["segment.bytes"]
    assert (segment.value, segment.config_source) == ("4194304", ConfigSource.DEFAULT_CONFIG)
    assert configs["max.message.bytes"].value == "1048588"
    # Accepted without effect, described as Kafka describes it: the broker synonym's default,
    # or Kafka's own default with no synonym when Kafka has no broker config for it.
    insync = configs["min.insync.replicas"]
    assert (insync.value, insync.config_source, insync.read_only) == (
        "1",
        ConfigSource.DEFAULT_CONFIG,
        False,
    )
    assert [(s.name, s.value) for s in insync.synonyms] == [("min.insync.replicas", "1")]
    assert [(s.name, s.value) for s in configs["segment.ms"].synonyms] == [
        ("log.roll.ms", "604800000")
    ]
    tiered = configs["remote.storage.enable"]
    assert (tiered.value, tiered.config_source, tiered.synonyms) == (
        "false",
        ConfigSource.DEFAULT_CONFIG,
        (),
    )
    if version >= 3:
        assert retention.config_type == ConfigType.LONG
        assert configs["cleanup.policy"].config_type == ConfigType.LIST
        assert configs["min.cleanable.dirty.ratio"].config_type == ConfigType.DOUBLE
        assert tiered.config_type == ConfigType.BOOLEAN
        assert "KafScale: enforced." in retention.documentation
        assert "KafScale: accepted without effect. KafScale keeps no replicas" in (
            insync.documentation
        )


@pytest.mark.parametrize("version", [1, 4])
def test_describe_configs_filters_and_omits_what_was_not_asked(version: int) -> None:
    request = describe_request(version, (TOPIC, "orders", ("segment.bytes", "no.such.config")))
    [result] = call(admin_broker(), request, 32).results
    [config] = result.configs
    assert config.name == "segment.bytes" and config.synonyms == ()
    if version >= 3:
        assert config.documentation is None


def test_describe_configs_topic_default_follows_the_broker_setting() -> None:
    broker = admin_broker(KAFSCALE_SEGMENT_BYTES="8MiB")
    request = describe_request(4, (TOPIC, "orders", ("segment.bytes",)), synonyms=True)
    [config] = call(broker, request, 32).results[0].configs
    assert (config.value, config.config_source) == ("8388608", ConfigSource.STATIC_BROKER_CONFIG)
    assert [(s.name, s.value, s.source) for s in config.synonyms] == [
        ("log.segment.bytes", "8388608", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.segment.bytes", "4194304", ConfigSource.DEFAULT_CONFIG),
    ]


def test_describe_configs_of_this_broker() -> None:
    broker = admin_broker(KAFSCALE_S3_ACCESS_KEY="key", KAFSCALE_S3_SECRET_KEY="secret")
    request = describe_request(4, (BROKER, "3", None), (BROKER, "", None), documentation=True)
    this, defaults = call(broker, request, 32).results
    assert this.error_code == ErrorCode.none and defaults.error_code == ErrorCode.none
    assert defaults.configs == ()  # no dynamic cluster-wide defaults
    configs = {c.name: c for c in this.configs}
    assert all(c.read_only for c in this.configs)
    expected = {
        "broker.id": ("3", ConfigSource.STATIC_BROKER_CONFIG),
        "node.id": ("3", ConfigSource.STATIC_BROKER_CONFIG),
        "log.segment.bytes": ("4194304", ConfigSource.DEFAULT_CONFIG),
        "message.max.bytes": ("1048588", ConfigSource.DEFAULT_CONFIG),
        "compression.type": ("producer", ConfigSource.DEFAULT_CONFIG),
        "auto.create.topics.enable": ("true", ConfigSource.DEFAULT_CONFIG),
        "num.partitions": ("1", ConfigSource.DEFAULT_CONFIG),
        "socket.request.max.bytes": ("104857600", ConfigSource.DEFAULT_CONFIG),
        "listeners": ("PLAINTEXT://127.0.0.1:19092", ConfigSource.STATIC_BROKER_CONFIG),
        "kafscale.compression.codec": ("snappy", ConfigSource.DEFAULT_CONFIG),
        "kafscale.flush.interval.ms": ("50", ConfigSource.DEFAULT_CONFIG),  # auto, local store
        "kafscale.s3.access.key": (None, ConfigSource.STATIC_BROKER_CONFIG),
        "kafscale.s3.secret.key": (None, ConfigSource.STATIC_BROKER_CONFIG),
    }
    assert {name: (configs[name].value, configs[name].config_source) for name in expected} == (
        expected
    )
    secret = configs["kafscale.s3.secret.key"]
    assert secret.is_sensitive and secret.config_type == ConfigType.PASSWORD
    assert "KAFSCALE_FLUSH_INTERVAL_MS" in configs["kafscale.flush.interval.ms"].documentation


def test_describe_configs_errors_per_resource() -> None:
    request = describe_request(
        4,
        (TOPIC, "ghost", None),
        (TOPIC, "bad name", None),
        (BROKER, "4", None),
        (BROKER, "x", None),
        (BROKER_LOGGER, "3", None),
        (TOPIC, "orders", ("cleanup.policy",)),
    )
    results = call(admin_broker(), request, 32).results
    assert [(r.resource_name, r.error_code) for r in results] == [
        ("ghost", ErrorCode.unknown_topic_or_partition),
        ("bad name", ErrorCode.invalid_topic_exception),
        ("4", ErrorCode.invalid_request),
        ("x", ErrorCode.invalid_request),
        ("3", ErrorCode.invalid_request),
        ("orders", ErrorCode.none),
    ]
    assert (
        results[2].error_message
        == "Unexpected broker id, expected 3 or empty string, but received 4"
    )
    assert all(r.configs == () for r in results[:5])


# -- AlterConfigs and IncrementalAlterConfigs ---------------------------------------------------


def alter_request(
    version: int, *resources: tuple[int, str, dict[str, str | None]], validate_only: bool = False
) -> Any:
    schema = load_request_schema(33, version)
    resource_class = codec.nested(schema, "AlterConfigsResource")
    config_class = codec.nested(schema, "AlterableConfig")
    return codec.build(
        schema,
        resources=tuple(
            codec.build(
                resource_class,
                resource_type=kind,
                resource_name=name,
                configs=tuple(codec.build(config_class, name=k, value=v) for k, v in cs.items()),
            )
            for kind, name, cs in resources
        ),
        validate_only=validate_only,
    )


@pytest.mark.parametrize("version", range(3))
def test_alter_configs_replaces_the_topics_configs(version: int) -> None:
    broker = admin_broker()
    request = alter_request(
        version,
        (TOPIC, "orders", {"max.message.bytes": "2048", "compression.type": None}),
        (TOPIC, "ghost", {"retention.ms": "1"}),
        (BROKER, "3", {"log.segment.bytes": "1048576"}),
        (BROKER, "", {}),
        (BROKER_LOGGER, "3", {"kafka": "DEBUG"}),
    )
    responses = call(broker, request, 33).responses
    assert [(r.resource_type, r.resource_name, r.error_code) for r in responses] == [
        (TOPIC, "orders", ErrorCode.none),
        (TOPIC, "ghost", ErrorCode.unknown_topic_or_partition),
        (BROKER, "3", ErrorCode.policy_violation),
        (BROKER, "", ErrorCode.none),
        (BROKER_LOGGER, "3", ErrorCode.invalid_request),
    ]
    assert "log.segment.bytes" in responses[2].error_message
    assert "KAFSCALE_" in responses[2].error_message
    # retention.ms was set before: replacing drops it.
    assert topics(broker)["orders"].configs == {"max.message.bytes": "2048"}


@pytest.mark.parametrize(
    ("configs", "error", "named"),
    [
        ({"segment.ms": "0"}, ErrorCode.invalid_config, "segment.ms"),
        ({"no.such.config": "1"}, ErrorCode.invalid_config, "no.such.config"),
        ({"message.format.version": "3.0"}, ErrorCode.invalid_config, "message.format.version"),
        ({"segment.bytes": "1024"}, ErrorCode.invalid_config, "segment.bytes"),
        ({"cleanup.policy": "compact,shred"}, ErrorCode.invalid_config, "cleanup.policy"),
    ],
)
def test_alter_configs_refuses_what_kafscale_does_not_honour(
    configs: dict[str, str | None], error: ErrorCode, named: str
) -> None:
    broker = admin_broker()
    [response] = call(broker, alter_request(2, (TOPIC, "orders", configs)), 33).responses
    assert response.error_code == error and named in response.error_message
    assert topics(broker)["orders"].configs == {"retention.ms": "3600000"}


def test_alter_configs_validate_only_and_duplicates_change_nothing() -> None:
    broker = admin_broker()
    request = alter_request(1, (TOPIC, "orders", {"segment.bytes": "1048576"}), validate_only=True)
    assert call(broker, request, 33).responses[0].error_code == ErrorCode.none
    twice = alter_request(1, (TOPIC, "orders", {}), (TOPIC, "orders", {"retention.ms": "5"}))
    assert [r.error_code for r in call(broker, twice, 33).responses] == [
        ErrorCode.invalid_request,
        ErrorCode.invalid_request,
    ]
    assert topics(broker)["orders"].configs == {"retention.ms": "3600000"}


def incremental_request(
    version: int, *resources: tuple[int, str, list[tuple[str, int, str | None]]]
) -> Any:
    schema = load_request_schema(44, version)
    resource_class = codec.nested(schema, "AlterConfigsResource")
    config_class = codec.nested(schema, "AlterableConfig")
    return codec.build(
        schema,
        resources=tuple(
            codec.build(
                resource_class,
                resource_type=kind,
                resource_name=name,
                configs=tuple(
                    codec.build(config_class, name=n, config_operation=op, value=v)
                    for n, op, v in changes
                ),
            )
            for kind, name, changes in resources
        ),
        validate_only=False,
    )


SET, DELETE, APPEND, SUBTRACT = (int(op) for op in AlterConfigOp)


@pytest.mark.parametrize("version", range(2))
def test_incremental_alter_configs(version: int) -> None:
    broker = admin_broker()
    request = incremental_request(
        version,
        (
            TOPIC,
            "orders",
            [
                ("segment.bytes", SET, "2097152"),
                ("retention.ms", DELETE, None),
                ("cleanup.policy", APPEND, "delete"),
            ],
        ),
    )
    assert call(broker, request, 44).responses[0].error_code == ErrorCode.none
    assert topics(broker)["orders"].configs == {
        "segment.bytes": "2097152",
        "cleanup.policy": "delete",
    }


def test_incremental_alter_configs_of_configs_without_effect_and_an_emptied_list() -> None:
    broker = admin_broker()
    changes: list[tuple[str, int, str | None]] = [
        ("min.insync.replicas", SET, "2"),
        ("file.delete.delay.ms", SET, "1000"),
        ("cleanup.policy", SUBTRACT, "delete"),
    ]
    request = incremental_request(1, (TOPIC, "orders", changes))
    assert call(broker, request, 44).responses[0].error_code == ErrorCode.none
    assert topics(broker)["orders"].configs == {
        "retention.ms": "3600000",
        "min.insync.replicas": "2",
        "file.delete.delay.ms": "1000",
        "cleanup.policy": "",
    }
    described = describe_request(4, (TOPIC, "orders", ("cleanup.policy", "min.insync.replicas")))
    configs = {c.name: c for c in call(broker, described, 32).results[0].configs}
    assert (configs["cleanup.policy"].value, configs["cleanup.policy"].config_source) == (
        "",
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
    )
    assert configs["min.insync.replicas"].value == "2"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ([("retention.ms", APPEND, "5")], ErrorCode.invalid_config, "type is not LIST"),
        ([("cleanup.policy", APPEND, "shred")], ErrorCode.invalid_config, "cleanup.policy"),
        ([("retention.ms", SET, None)], ErrorCode.invalid_request, "Null value"),
        (
            [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)],
            ErrorCode.invalid_request,
            "duplicate",
        ),
        ([("retention.ms", 9, "1")], ErrorCode.invalid_request, "operation"),
        ([("min.insync.replicas", SET, "0")], ErrorCode.invalid_config, "min.insync.replicas"),
    ],
)
def test_incremental_alter_configs_refusals(
    changes: list[tuple[str, int, str | None]], error: ErrorCode, message: str
) -> None:
    broker = admin_broker()
    [response] = call(broker, incremental_request(1, (TOPIC, "orders", changes)), 44).responses
    assert response.error_code == error and message in response.error_message
    assert topics(broker)["orders"].configs == {"retention.ms": "3600000"}


def test_alter_configs_when_the_coordinator_is_unreachable() -> None:
    broker = admin_broker()
    broker.coordinator.unreachable = True  # type: ignore[attr-defined]
    request = incremental_request(1, (TOPIC, "orders", [("retention.ms", DELETE, None)]))
    [response] = call(broker, request, 44).responses
    assert response.error_code == ErrorCode.request_timed_out
    assert response.error_code.retriable


# -- CreatePartitions --------------------------------------------------------------------------


def partitions_request(
    version: int, *topics: tuple[str, int, list[list[int]] | None], validate_only: bool = False
) -> Any:
    schema = load_request_schema(37, version)
    topic_class = codec.nested(schema, "CreatePartitionsTopic")
    assignment_class = codec.nested(schema, "CreatePartitionsAssignment")
    return codec.build(
        schema,
        topics=tuple(
            codec.build(
                topic_class,
                name=name,
                count=count,
                assignments=None
                if assignments is None
                else tuple(codec.build(assignment_class, broker_ids=tuple(a)) for a in assignments),
            )
            for name, count, assignments in topics
        ),
        timeout=datetime.timedelta(seconds=30),
        validate_only=validate_only,
    )


@pytest.mark.parametrize("version", range(4))
def test_create_partitions(version: int) -> None:
    broker = admin_broker()
    topics(broker)["two"] = TopicRecord(name="two", topic_id="t2", partitions=2)
    topics(broker)["three"] = TopicRecord(name="three", topic_id="t3", partitions=3)
    request = partitions_request(
        version,
        ("orders", 5, None),
        ("two", 4, [[3], [3]]),
        ("three", 5, [[3], [4]]),
        ("ghost", 2, None),
    )
    results = call(broker, request, 37).results
    assert [(r.name, r.error_code) for r in results] == [
        ("orders", ErrorCode.none),
        ("two", ErrorCode.none),
        ("three", ErrorCode.invalid_replica_assignment),
        ("ghost", ErrorCode.unknown_topic_or_partition),
    ]
    assert "[3]" in results[2].error_message
    assert [topics(broker)[n].partitions for n in ("orders", "two", "three")] == [5, 4, 3]


@pytest.mark.parametrize(
    ("count", "assignments", "error", "message"),
    [
        (3, None, ErrorCode.invalid_partitions, "already has 3"),
        (2, None, ErrorCode.invalid_partitions, "would not be an increase"),
        (5, [[3]], ErrorCode.invalid_replica_assignment, "add 2 additional"),
        (4, [[3, 4]], ErrorCode.invalid_replica_assignment, "[3, 4]"),
        (4, [[]], ErrorCode.invalid_replica_assignment, "[]"),
    ],
)
def test_create_partitions_refusals(
    count: int, assignments: list[list[int]] | None, error: ErrorCode, message: str
) -> None:
    broker = admin_broker()
    [result] = call(broker, partitions_request(3, ("orders", count, assignments)), 37).results
    assert result.error_code == error and message in result.error_message
    assert topics(broker)["orders"].partitions == 3


def test_create_partitions_validate_only_and_duplicates() -> None:
    broker = admin_broker()
    dry = partitions_request(3, ("orders", 6, None), validate_only=True)
    assert call(broker, dry, 37).results[0].error_code == ErrorCode.none
    twice = partitions_request(3, ("orders", 6, None), ("orders", 7, None))
    assert [r.error_code for r in call(broker, twice, 37).results] == [
        ErrorCode.invalid_request,
        ErrorCode.invalid_request,
    ]
    assert topics(broker)["orders"].partitions == 3


# -- DescribeCluster, SaslHandshake, CreateTopics' configs -------------------------------------


@pytest.mark.parametrize("version", range(3))
def test_describe_cluster(version: int) -> None:
    schema = load_request_schema(60, version)
    request = codec.build(
        schema,
        include_cluster_authorized_operations=True,
        endpoint_type=1,
        include_fenced_brokers=False,
    )
    response = call(admin_broker(), request, 60)
    assert response.error_code == ErrorCode.none
    assert (response.cluster_id, response.controller_id) == ("abcdefghijklmnopqrstuv", 3)
    assert [(b.broker_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (3, "127.0.0.1", 19092, None),
        (4, "10.0.0.4", 9092, "r1"),
    ]
    assert response.cluster_authorized_operations == 8096  # every cluster operation
    if version >= 1:
        assert response.endpoint_type == 1
        controllers = codec.build(
            schema,
            include_cluster_authorized_operations=False,
            endpoint_type=2,
            include_fenced_brokers=False,
        )
        refused = call(admin_broker(), controllers, 60)
        assert refused.error_code == ErrorCode.unsupported_endpoint_type


@pytest.mark.parametrize("version", range(2))
def test_sasl_handshake_offers_no_mechanism(version: int) -> None:
    request = codec.build(load_request_schema(17, version), mechanism="PLAIN")
    response = call(admin_broker(), request, 17)
    assert response.error_code == ErrorCode.unsupported_sasl_mechanism
    assert response.mechanisms == ()


def test_create_topics_describes_configs_like_describe_configs() -> None:
    broker = admin_broker(KAFSCALE_SEGMENT_BYTES="2MiB")
    request = create_topics_request(7, ("fresh", 1, 1, {"segment.bytes": "1048576"}))
    [topic] = call(broker, request, 19).topics
    configs = {c.name: (c.value, c.config_source) for c in topic.configs}
    assert configs["segment.bytes"] == ("1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert configs["retention.ms"] == ("604800000", ConfigSource.DEFAULT_CONFIG)
    assert topics(broker)["fresh"].configs == {"segment.bytes": "1048576"}


@pytest.mark.parametrize("version", [8, 10, 12])
def test_metadata_reports_every_operation_when_asked(version: int) -> None:
    schema = load_request_schema(3, version)
    topic_class = codec.nested(schema, "MetadataRequestTopic")
    for asked in (True, False):
        request = codec.build(
            schema,
            topics=(codec.build(topic_class, name="orders", topic_id=None),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=asked,
            include_topic_authorized_operations=asked,
        )
        response = call(admin_broker(), request, 3)
        [topic] = response.topics
        assert topic.topic_authorized_operations == (3576 if asked else -(2**31))
        if version <= 10:
            assert response.cluster_authorized_operations == (8096 if asked else -(2**31))
