"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) in the frontend, from request bytes
to response bytes: what reaches the coordinator, what the client gets back, and their ACLs (READ
on the group and DESCRIBE on each named topic to heartbeat, DESCRIBE on the group to describe);
DescribeGroups v6 says GROUP_ID_NOT_FOUND where older versions see a Dead group."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema

from kafscale.frontend.dispatch import APIS
from kafscale.ipc import consumer_groups, messages
from kafscale.metadata.records import TopicRecord
from kafscale.protocol import codec
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType as AclResource
from tests.unit.frontend.test_group_acls import (
    ALICE_ACLS,
    GAF,
    NONE,
    TAF,
    GroupCoordinator,
    acl,
    describe_groups,
    send,
    setup,
)

ORDERS_ID = str(uuid.UUID(int=7))


class ConsumerCoordinator(GroupCoordinator):
    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        match request:
            case consumer_groups.ConsumerGroupHeartbeat():
                self.calls.append(request)
                return consumer_groups.ConsumerGroupHeartbeatResult(
                    0,
                    None,
                    request.member_id,
                    3,
                    5000,
                    [consumer_groups.TopicIdPartitions(ORDERS_ID, [0, 2])],
                )
            case consumer_groups.ConsumerGroupDescribe():
                self.calls.append(request)
                member = consumer_groups.ConsumerMemberDescription(
                    "m-1",
                    None,
                    None,
                    3,
                    "client",
                    "/10.1.2.3",
                    ["orders"],
                    None,
                    [consumer_groups.TopicIdPartitions(ORDERS_ID, [0, 2])],
                    [consumer_groups.TopicIdPartitions(ORDERS_ID, [0, 1, 2])],
                )
                classic = consumer_groups.ConsumerMemberDescription(
                    "m-2", None, None, 4, "client", "/10.1.2.4", ["orders"], None, [], [], True
                )
                return consumer_groups.ConsumerGroupsDescribed(
                    [
                        consumer_groups.ConsumerGroupDescription(
                            g, 0, None, "Reconciling", 4, 4, "uniform", [member, classic]
                        )
                        for g in request.group_ids
                    ]
                )
            case consumer_groups.AlterGroupConfigs():
                self.calls.append(request)
                return consumer_groups.GroupConfigResults(
                    [consumer_groups.GroupConfigResult(g.group_id, 0) for g in request.groups], 0
                )
        return await super().call(request, timeout)


def consumer_setup(*acls: Any, authorizer: str = "acl") -> tuple[Any, ConsumerCoordinator]:
    broker, plain = setup(*acls, authorizer=authorizer)
    coordinator = ConsumerCoordinator(plain.view)
    snapshot = broker.view.snapshot
    topics = dict(snapshot.topics)
    topics["orders"] = TopicRecord(name="orders", topic_id=ORDERS_ID, partitions=3)
    broker.view.snapshot = type(snapshot)(**{**snapshot.__dict__, "topics": topics})
    return broker.__class__(**{**broker.__dict__, "coordinator": coordinator}), coordinator


def heartbeat_request(version: int, group: str, names: tuple[str, ...] | None) -> Any:
    schema = load_request_schema(68, version)
    owned = codec.build(
        codec.element(schema, "topic_partitions"), topic_id=uuid.UUID(ORDERS_ID), partitions=(1,)
    )
    return codec.build(
        schema,
        group_id=group,
        member_id="m-1",
        member_epoch=2,
        instance_id="i-1",
        rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=-1),
        subscribed_topic_names=names,
        subscribed_topic_regex="ord.*",
        server_assignor="range",
        topic_partitions=(owned,),
    )


@pytest.mark.parametrize("version", [0, 1])
def test_a_heartbeat_reaches_the_coordinator_whole_and_its_answer_the_client(version: int) -> None:
    broker, coordinator = consumer_setup(*ALICE_ACLS)
    response = send(broker, heartbeat_request(version, "app", ("orders",)))
    [asked] = coordinator.calls
    assert isinstance(asked, consumer_groups.ConsumerGroupHeartbeat)
    assert (asked.version, asked.group_id, asked.member_id, asked.member_epoch) == (
        version,
        "app",
        "m-1",
        2,
    )
    assert (asked.instance_id, asked.rebalance_timeout_ms, asked.server_assignor) == (
        "i-1",
        -1,
        "range",
    )
    assert asked.subscribed_topic_names == ["orders"]
    assert asked.subscribed_topic_regex == ("ord.*" if version >= 1 else None)
    assert asked.topic_partitions == [consumer_groups.TopicIdPartitions(ORDERS_ID, [1])]
    assert asked.client_host == "/10.1.2.3"
    assert response.error_code == NONE
    assert (response.member_id, response.member_epoch) == ("m-1", 3)
    assert response.heartbeat_interval == datetime.timedelta(seconds=5)
    [given] = response.assignment.topic_partitions
    assert (given.topic_id, given.partitions) == (uuid.UUID(ORDERS_ID), (0, 2))


@pytest.mark.parametrize(
    ("group", "names", "error"),
    [
        ("secret", ("orders",), GAF),  # no READ on the group
        ("peek", ("orders",), GAF),  # DESCRIBE is not enough
        ("app", ("orders", "payments"), TAF),  # a topic it may not describe
    ],
)
def test_a_heartbeat_without_its_acls_is_refused_before_the_coordinator(
    group: str, names: tuple[str, ...], error: ErrorCode
) -> None:
    broker, coordinator = consumer_setup(*ALICE_ACLS)
    response = send(broker, heartbeat_request(1, group, names))
    assert response.error_code == error
    assert coordinator.calls == []
    if error == TAF:
        assert "payments" in response.error_message and "orders" not in response.error_message


def test_a_heartbeat_without_an_authorizer_is_unchanged() -> None:
    broker, coordinator = consumer_setup(authorizer="none")
    assert send(broker, heartbeat_request(1, "secret", ("payments",))).error_code == NONE
    assert len(coordinator.calls) == 1


@pytest.mark.parametrize("version", [0, 1])
def test_describe_names_topics_and_refuses_groups_it_may_not_see(version: int) -> None:
    broker, coordinator = consumer_setup(*ALICE_ACLS)
    schema = load_request_schema(69, version)
    request = codec.build(
        schema, group_ids=("secret", "app", "peek"), include_authorized_operations=False
    )
    response = send(broker, request)
    [asked] = coordinator.calls
    assert isinstance(asked, consumer_groups.ConsumerGroupDescribe)
    assert asked.group_ids == ["app", "peek"]
    secret, app, peek = response.groups
    assert (secret.group_id, secret.error_code) == ("secret", GAF)
    assert (app.group_state, app.group_epoch, app.assignor_name) == ("Reconciling", 4, "uniform")
    member, classic = app.members
    [owned] = member.assignment.topic_partitions
    assert (owned.topic_name, owned.partitions) == ("orders", (0, 2))
    assert member.target_assignment.topic_partitions[0].partitions == (0, 1, 2)
    if version >= 1:  # MemberType: 1 consumer, 0 classic (online migration)
        assert (member.member_type, classic.member_type) == (1, 0)
    assert peek.error_code == NONE


@pytest.mark.parametrize(("version", "expected"), [(5, NONE), (6, ErrorCode.group_id_not_found)])
def test_describe_groups_says_not_found_from_v6(version: int, expected: ErrorCode) -> None:
    class NotFound(GroupCoordinator):
        async def call(self, request: messages.Message, timeout: float = 30.0) -> Any:
            assert isinstance(request, messages.DescribeGroups)
            found = int(ErrorCode.group_id_not_found)
            return messages.GroupsDescribed(
                [
                    messages.GroupDescription(g, found, "Dead", "", "", [], "not a classic group")
                    for g in request.group_ids
                ]
            )

    broker, plain = setup(*ALICE_ACLS)
    broker = broker.__class__(**{**broker.__dict__, "coordinator": NotFound(plain.view)})
    [group] = send(broker, describe_groups(version, ["app"])).groups
    assert (group.error_code, group.group_state) == (expected, "Dead")


def test_both_apis_are_offered_at_versions_0_and_1() -> None:
    assert (APIS[68].min_version, APIS[68].max_version) == (0, 1)
    assert (APIS[69].min_version, APIS[69].max_version) == (0, 1)


def test_group_configs_are_altered_by_the_coordinator_with_alter_configs_on_the_group() -> None:
    broker, coordinator = consumer_setup(
        *ALICE_ACLS, acl(AclResource.GROUP, "app", AclOperation.ALTER_CONFIGS)
    )
    schema = load_request_schema(44, 1)
    resource_class = codec.element(schema, "resources")
    config_class = codec.element(resource_class, "configs")

    def resource(group: str) -> Any:
        config = codec.build(
            config_class, name="consumer.session.timeout.ms", config_operation=0, value="6000"
        )
        return codec.build(resource_class, resource_type=32, resource_name=group, configs=(config,))

    request = codec.build(
        schema, resources=(resource("app"), resource("peek")), validate_only=False
    )
    app, peek = send(broker, request).responses
    assert (app.error_code, peek.error_code) == (NONE, GAF)
    [asked] = coordinator.calls
    assert isinstance(asked, consumer_groups.AlterGroupConfigs)
    [changes] = asked.groups
    assert changes.group_id == "app" and changes.changes == [
        consumer_groups.GroupConfigChange("consumer.session.timeout.ms", 0, "6000")
    ]


def test_group_configs_are_described_from_the_view() -> None:
    broker, _ = consumer_setup(
        *ALICE_ACLS, acl(AclResource.GROUP, "app", AclOperation.DESCRIBE_CONFIGS)
    )
    snapshot = broker.view.snapshot
    broker.view.snapshot = type(snapshot)(
        **{**snapshot.__dict__, "group_configs": {"app": {"consumer.session.timeout.ms": "6000"}}}
    )
    schema = load_request_schema(32, 4)
    resource_class = codec.element(schema, "resources")
    request = codec.build(
        schema,
        resources=tuple(
            codec.build(resource_class, resource_type=32, resource_name=g, configuration_keys=None)
            for g in ("app", "peek")
        ),
        include_synonyms=False,
        include_documentation=False,
    )
    app, peek = send(broker, request).results
    assert peek.error_code == GAF
    described = {c.name: (c.value, c.config_source) for c in app.configs}
    assert len(described) == 17
    assert described["consumer.session.timeout.ms"] == ("6000", 8)  # GROUP_CONFIG
    # the broker's group.consumer.heartbeat.interval.ms, left at its default
    assert described["consumer.heartbeat.interval.ms"] == ("5000", 5)
    assert described["share.delivery.count.limit"] == ("5", 5)  # Kafka's default
