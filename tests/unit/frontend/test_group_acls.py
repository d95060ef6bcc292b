"""ACLs on the consumer-group APIs (docs/design/security.md, section 6), end to end from request
bytes to response bytes: what a principal may not do is refused before the coordinator hears of
it, with Kafka's errors; with KAFSCALE_AUTHORIZER=none nothing changes."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from kio.index import load_request_schema
from prometheus_client import REGISTRY

from kafscale.frontend import requests
from kafscale.frontend.context import Broker, Session
from kafscale.ipc import messages
from kafscale.metadata.records import AclRecord, TopicRecord
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol import codec
from kafscale.protocol.acls import NOT_REQUESTED, AclOperation
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.sasl import Authentication
from kafscale.security.authorizer import AclPermissionType, PatternType, ResourceType
from tests.unit.frontend.test_requests import (
    FakeCoordinator,
    StaticView,
    decode_response,
    find_coordinator,
    make_broker,
)
from tests.unit.protocol.test_codec import request_frame

ALICE = "User:alice"
PEER = "10.1.2.3:50000"
GAF = ErrorCode.group_authorization_failed
TAF = ErrorCode.topic_authorization_failed
NONE = ErrorCode.none
# Groups: alice may READ "app" (so DESCRIBE it), only DESCRIBE "peek", only DELETE "doomed";
# nothing on "secret". Topics: READ on every topic starting with "o" ("orders", and "orphan",
# which does not exist); nothing on "payments" (which exists) or "ghost" (which does not).
GROUPS = ("app", "doomed", "peek", "secret")


def acl(
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
    principal: str = ALICE,
) -> AclRecord:
    return AclRecord(
        int(resource_type), name, int(pattern), principal, "*", int(operation), int(permission)
    )


ALICE_ACLS = (
    acl(ResourceType.GROUP, "app", AclOperation.READ),
    acl(ResourceType.GROUP, "peek", AclOperation.DESCRIBE),
    acl(ResourceType.GROUP, "doomed", AclOperation.DELETE),
    acl(ResourceType.TOPIC, "o", AclOperation.READ, pattern=PatternType.PREFIXED),
)


class GroupCoordinator(FakeCoordinator):
    """FakeCoordinator that also answers group requests, and records every one it gets."""

    def __init__(self, view: StaticView) -> None:
        super().__init__(view)
        self.calls: list[messages.Message] = []
        self.committed: dict[str, dict[tuple[str, int], int]] = {}

    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        self.calls.append(request)
        match request:
            case messages.JoinGroup():
                return messages.JoinGroupResult(
                    0, 1, "consumer", "range", leader="m-1", member_id="m-1"
                )
            case messages.SyncGroup():
                return messages.SyncGroupResult(0, "consumer", "range", b"plan")
            case messages.Heartbeat():
                return messages.GroupError(0)
            case messages.LeaveGroup():
                return messages.LeaveGroupResult(
                    0, [(m.member_id, m.group_instance_id, 0) for m in request.members]
                )
            case messages.OffsetCommit():
                for o in request.offsets:
                    if not o.error_code:
                        group = self.committed.setdefault(request.group_id, {})
                        group[(o.topic, o.partition)] = o.offset
                return messages.OffsetCommitResult([o.error_code for o in request.offsets])
            case messages.OffsetFetch():
                return messages.OffsetFetchResult([self._offsets(q) for q in request.groups])
            case messages.DescribeGroups():
                return messages.GroupsDescribed(
                    [
                        messages.GroupDescription(g, 0, "Stable", "consumer", "range", [])
                        for g in request.group_ids
                    ]
                )
            case messages.ListGroups():
                listed = [messages.GroupListing(g, "consumer", "Stable") for g in GROUPS]
                return messages.GroupsListed(listed)
            case messages.DeleteGroups():
                return messages.GroupsDeleted([(g, 0) for g in request.group_ids])
            case messages.OffsetDelete():
                return messages.OffsetsDeleted(0, [(t, p, 0) for t, p in request.partitions])
        raise AssertionError(f"unexpected {request!r}")

    async def caught_up(self, revision: int) -> None:
        return None

    def _offsets(self, query: messages.GroupOffsetsQuery) -> messages.GroupOffsets:
        committed = self.committed.get(query.group_id, {})
        wanted = sorted(committed) if query.partitions is None else query.partitions
        return messages.GroupOffsets(
            query.group_id,
            0,
            [messages.PartitionOffset(t, p, committed.get((t, p), -1)) for t, p in wanted],
        )

    def asked(self, kind: type[messages.Message]) -> list[Any]:
        return [call for call in self.calls if isinstance(call, kind)]


def setup(*acls: AclRecord, authorizer: str = "acl", **env: str) -> tuple[Broker, GroupCoordinator]:
    broker = make_broker(KAFSCALE_AUTHORIZER=authorizer, **env)
    view = broker.view
    assert isinstance(view, StaticView)
    topics = dict(view.snapshot.topics)
    topics["payments"] = TopicRecord(name="payments", topic_id="payments-id", partitions=2)
    view.snapshot = dataclasses.replace(
        view.snapshot, topics=topics, acls={record.digest: record for record in acls}
    )
    coordinator = GroupCoordinator(view)
    return dataclasses.replace(broker, coordinator=coordinator), coordinator


def send(broker: Broker, request: Any, principal: str = ALICE) -> Any:
    """The decoded response to ``request`` from a connection authenticated as ``principal``."""
    session = Session("PLAINTEXT", Authentication(False, {}, 0, anonymous=principal))
    frame = asyncio.run(requests.process(broker, request_frame(request), PEER, session))
    assert isinstance(frame, bytes)
    return decode_response(frame, request.__api_key__, request.__version__)[1]


def denials(api: str) -> float:
    value = REGISTRY.get_sample_value("kafscale_authorization_denied_total", {"api": api})
    return value or 0.0


# Requests ---------------------------------------------------------------------------------


def join_group(version: int, group: str) -> Any:
    schema = load_request_schema(11, version)
    protocol = codec.build(codec.element(schema, "protocols"), name="range", metadata=b"m")
    return codec.build(
        schema,
        group_id=group,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id="m-1",
        protocol_type="consumer",
        protocols=(protocol,),
    )


def sync_group(version: int, group: str) -> Any:
    schema = load_request_schema(14, version)
    plan = codec.build(codec.element(schema, "assignments"), member_id="m-1", assignment=b"p")
    return codec.build(
        schema,
        group_id=group,
        generation_id=1,
        member_id="m-1",
        protocol_type="consumer",
        protocol_name="range",
        assignments=(plan,),
    )


def heartbeat(version: int, group: str) -> Any:
    schema = load_request_schema(12, version)
    return codec.build(schema, group_id=group, generation_id=1, member_id="m-1")


def leave_group(version: int, group: str) -> Any:
    schema = load_request_schema(13, version)
    if version < 3:
        return codec.build(schema, group_id=group, member_id="m-1")
    member = codec.build(codec.element(schema, "members"), member_id="m-1")
    return codec.build(schema, group_id=group, members=(member,))


def offset_commit(version: int, group: str, topics: dict[str, Sequence[int]]) -> Any:
    schema = load_request_schema(8, version)
    topic_class = codec.element(schema, "topics")
    partition_class = codec.element(topic_class, "partitions")
    return codec.build(
        schema,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=tuple(
            codec.build(
                topic_class,
                name=name,
                partitions=tuple(
                    codec.build(
                        partition_class,
                        partition_index=p,
                        committed_offset=100 + p,
                        committed_metadata="",
                    )
                    for p in partitions
                ),
            )
            for name, partitions in topics.items()
        ),
    )


def offset_fetch(version: int, groups: dict[str, dict[str, Sequence[int]] | None]) -> Any:
    """``groups``: the topics (None: all) asked for, by group; one group before v8."""
    schema = load_request_schema(9, version)
    group_class = codec.element(schema, "groups") if version >= 8 else schema
    topic_class = codec.element(group_class, "topics")

    def topics(wanted: dict[str, Sequence[int]] | None) -> Any:
        if wanted is None:
            return None
        return tuple(
            codec.build(topic_class, name=name, partition_indexes=tuple(partitions))
            for name, partitions in wanted.items()
        )

    if version >= 8:
        return codec.build(
            schema,
            groups=tuple(
                codec.build(group_class, group_id=group, topics=topics(wanted))
                for group, wanted in groups.items()
            ),
            require_stable=False,
        )
    [(group, wanted)] = groups.items()
    return codec.build(schema, group_id=group, topics=topics(wanted))


def describe_groups(version: int, groups: Sequence[str], operations: bool = False) -> Any:
    return codec.build(
        load_request_schema(15, version),
        groups=tuple(groups),
        include_authorized_operations=operations,
    )


def list_groups(version: int) -> Any:
    return codec.build(load_request_schema(16, version))


def delete_groups(version: int, groups: Sequence[str]) -> Any:
    return codec.build(load_request_schema(42, version), groups_names=tuple(groups))


def offset_delete(group: str, topics: dict[str, Sequence[int]]) -> Any:
    schema = load_request_schema(47, 0)
    topic_class = codec.element(schema, "topics")
    partition_class = codec.element(topic_class, "partitions")
    return codec.build(
        schema,
        group_id=group,
        topics=tuple(
            codec.build(
                topic_class,
                name=name,
                partitions=tuple(codec.build(partition_class, partition_index=p) for p in ps),
            )
            for name, ps in topics.items()
        ),
    )


def partition_errors(response: Any) -> dict[tuple[str, int], int]:
    return {
        (t.name, int(p.partition_index)): int(p.error_code)
        for t in response.topics
        for p in t.partitions
    }


# FindCoordinator --------------------------------------------------------------------------


def lookup(broker: Broker, version: int, *groups: str) -> list[tuple[int, int]]:
    body = send(broker, find_coordinator(version, *groups))
    entries = body.coordinators if version >= 4 else [body]
    return [(int(e.error_code), int(e.node_id)) for e in entries]


@pytest.mark.parametrize("version", [0, 3, 4, 6])
def test_find_coordinator_without_describe_is_refused_and_creates_nothing(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    assert lookup(broker, version, "secret") == [(GAF, -1)]
    assert coordinator.created == []
    assert OFFSETS_TOPIC not in broker.view.snapshot.topics


@pytest.mark.parametrize("version", [0, 3, 4, 6])
def test_find_coordinator_with_describe_answers_and_creates_the_offsets_topic(
    version: int,
) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    [(error, _)] = lookup(broker, version, "peek")
    assert error == ErrorCode.coordinator_not_available  # being created, no owner yet
    assert coordinator.created == [OFFSETS_TOPIC]


@pytest.mark.parametrize("version", [4, 6])
def test_find_coordinator_batch_refuses_per_key(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    assert lookup(broker, version, "secret", "app", "secret") == [
        (GAF, -1),
        (ErrorCode.coordinator_not_available, -1),
        (GAF, -1),
    ]
    assert coordinator.created == [OFFSETS_TOPIC]


def test_find_coordinator_without_an_authorizer_is_unchanged() -> None:
    broker, coordinator = setup(authorizer="none")
    assert lookup(broker, 4, "secret") == [(ErrorCode.coordinator_not_available, -1)]
    assert coordinator.created == [OFFSETS_TOPIC]


# JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group ----------------------------

MEMBERSHIP: list[tuple[Callable[[int, str], Any], int, type[messages.Message]]] = [
    (join_group, 0, messages.JoinGroup),
    (join_group, 5, messages.JoinGroup),
    (join_group, 9, messages.JoinGroup),
    (sync_group, 0, messages.SyncGroup),
    (sync_group, 5, messages.SyncGroup),
    (heartbeat, 0, messages.Heartbeat),
    (heartbeat, 4, messages.Heartbeat),
    (leave_group, 0, messages.LeaveGroup),
    (leave_group, 3, messages.LeaveGroup),
    (leave_group, 5, messages.LeaveGroup),
]
MEMBERSHIP_IDS = [f"{make.__name__}-v{version}" for make, version, _ in MEMBERSHIP]


@pytest.mark.parametrize(("make", "version", "kind"), MEMBERSHIP, ids=MEMBERSHIP_IDS)
@pytest.mark.parametrize("group", ["secret", "peek", "doomed"])  # no ACL; DESCRIBE; DELETE
def test_membership_without_read_is_refused_before_the_coordinator(
    make: Callable[[int, str], Any], version: int, kind: type[messages.Message], group: str
) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, make(version, group))
    assert response.error_code == GAF
    assert getattr(response, "members", ()) == ()  # LeaveGroup v3+: top-level error only
    assert coordinator.calls == []


@pytest.mark.parametrize(("make", "version", "kind"), MEMBERSHIP, ids=MEMBERSHIP_IDS)
def test_membership_with_read_reaches_the_coordinator(
    make: Callable[[int, str], Any], version: int, kind: type[messages.Message]
) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, make(version, "app"))
    assert response.error_code == NONE
    [asked] = coordinator.calls
    assert isinstance(asked, kind) and asked.group_id == "app"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("make", "version", "kind"), MEMBERSHIP, ids=MEMBERSHIP_IDS)
def test_membership_without_an_authorizer_is_unchanged(
    make: Callable[[int, str], Any], version: int, kind: type[messages.Message]
) -> None:
    broker, coordinator = setup(authorizer="none")
    assert send(broker, make(version, "secret")).error_code == NONE
    assert [type(call) for call in coordinator.calls] == [kind]


def test_a_deny_acl_wins_and_a_super_user_needs_no_acl() -> None:
    deny = acl(
        ResourceType.GROUP,
        "a",
        AclOperation.READ,
        permission=AclPermissionType.DENY,
        pattern=PatternType.PREFIXED,
    )
    broker, coordinator = setup(*ALICE_ACLS, deny)
    assert send(broker, heartbeat(4, "app")).error_code == GAF
    broker, coordinator = setup(KAFSCALE_SUPER_USERS="User:root;User:alice")
    assert send(broker, heartbeat(4, "secret")).error_code == NONE
    assert len(coordinator.calls) == 1


def test_a_refused_group_request_is_counted() -> None:
    broker, _ = setup(*ALICE_ACLS)
    before = denials("Heartbeat")
    send(broker, heartbeat(4, "secret"))
    assert denials("Heartbeat") == before + 1


# OffsetCommit: READ on the group, READ on each topic --------------------------------------


@pytest.mark.parametrize("version", [2, 8, 9])
def test_offset_commit_without_group_read_refuses_every_partition(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    request = offset_commit(version, "peek", {"orders": [0, 1], "payments": [0], "ghost": [0]})
    assert partition_errors(send(broker, request)) == {
        ("orders", 0): GAF,
        ("orders", 1): GAF,
        ("payments", 0): GAF,
        ("ghost", 0): GAF,
    }
    assert coordinator.calls == []


@pytest.mark.parametrize("version", [2, 8, 9])
def test_offset_commit_refuses_unreadable_topics_and_commits_the_rest(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    request = offset_commit(
        version, "app", {"payments": [0], "orders": [0, 2], "ghost": [0], "orphan": [1]}
    )
    # payments exists, ghost does not: the same answer (existence is not revealed).
    assert partition_errors(send(broker, request)) == {
        ("payments", 0): TAF,
        ("orders", 0): NONE,
        ("orders", 2): NONE,
        ("ghost", 0): TAF,
        ("orphan", 1): ErrorCode.unknown_topic_or_partition,  # readable, so it may know
    }
    [commit] = coordinator.asked(messages.OffsetCommit)
    assert {o.topic for o in commit.offsets} == {"orders", "orphan"}
    assert coordinator.committed == {"app": {("orders", 0): 100, ("orders", 2): 102}}


def test_offset_commit_of_only_unreadable_topics_asks_nothing() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    request = offset_commit(9, "app", {"payments": [0, 1]})
    assert partition_errors(send(broker, request)) == {("payments", 0): TAF, ("payments", 1): TAF}
    assert coordinator.calls == []


def test_offset_commit_without_an_authorizer_is_unchanged() -> None:
    broker, coordinator = setup(authorizer="none")
    request = offset_commit(9, "secret", {"payments": [0], "ghost": [0]})
    assert partition_errors(send(broker, request)) == {
        ("payments", 0): NONE,
        ("ghost", 0): ErrorCode.unknown_topic_or_partition,
    }
    [commit] = coordinator.asked(messages.OffsetCommit)
    assert len(commit.offsets) == 2


# OffsetFetch: DESCRIBE on the group, DESCRIBE on each topic -------------------------------


def fetched(group: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """(offset, error) by partition."""
    return {
        (t.name, int(p.partition_index)): (int(p.committed_offset), int(p.error_code))
        for t in group.topics
        for p in t.partitions
    }


def committed(coordinator: GroupCoordinator, group: str) -> None:
    coordinator.committed[group] = {("orders", 0): 10, ("orders", 1): 11, ("payments", 0): 20}


def test_offset_fetch_v1_without_group_describe_refuses_each_partition() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, offset_fetch(1, {"secret": {"orders": [0, 1]}}))
    assert fetched(response) == {("orders", 0): (-1, GAF), ("orders", 1): (-1, GAF)}
    assert coordinator.calls == []


@pytest.mark.parametrize("version", [2, 5, 7])
@pytest.mark.parametrize("topics", [None, {"orders": [0]}])
def test_offset_fetch_without_group_describe_is_refused(
    version: int, topics: dict[str, Sequence[int]] | None
) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, offset_fetch(version, {"secret": topics}))
    assert response.error_code == GAF
    assert response.topics == ()
    assert coordinator.calls == []


@pytest.mark.parametrize("version", [8, 9])
def test_offset_fetch_batch_refuses_per_group_in_request_order(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    committed(coordinator, "peek")
    request = offset_fetch(version, {"secret": None, "peek": {"orders": [1]}, "doomed": None})
    groups = send(broker, request).groups
    assert [(g.group_id, g.error_code) for g in groups] == [
        ("secret", GAF),
        ("peek", NONE),
        ("doomed", NONE),  # DELETE implies DESCRIBE
    ]
    assert groups[0].topics == ()
    assert fetched(groups[1]) == {("orders", 1): (11, NONE)}
    [fetch] = coordinator.asked(messages.OffsetFetch)
    assert [q.group_id for q in fetch.groups] == ["peek", "doomed"]


def test_offset_fetch_batch_of_refused_groups_asks_nothing() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    groups = send(broker, offset_fetch(8, {"secret": None, "other": None})).groups
    assert [(g.group_id, g.error_code) for g in groups] == [("secret", GAF), ("other", GAF)]
    assert coordinator.calls == []


@pytest.mark.parametrize("version", [1, 2, 7, 8, 9])
def test_offset_fetch_refuses_named_topics_it_may_not_describe(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    committed(coordinator, "app")
    request = offset_fetch(version, {"app": {"orders": [0], "payments": [0], "ghost": [3]}})
    response = send(broker, request)
    group = response.groups[0] if version >= 8 else response
    assert fetched(group) == {
        ("orders", 0): (10, NONE),
        ("payments", 0): (-1, TAF),  # committed, but not shown
        ("ghost", 3): (-1, TAF),
    }
    [fetch] = coordinator.asked(messages.OffsetFetch)
    assert fetch.groups == [messages.GroupOffsetsQuery("app", [("orders", 0)])]


@pytest.mark.parametrize("version", [2, 7, 8, 9])
def test_offset_fetch_of_all_topics_leaves_out_those_it_may_not_describe(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    committed(coordinator, "app")
    before = denials("OffsetFetch")
    response = send(broker, offset_fetch(version, {"app": None}))
    group = response.groups[0] if version >= 8 else response
    assert group.error_code == NONE
    assert fetched(group) == {("orders", 0): (10, NONE), ("orders", 1): (11, NONE)}
    assert denials("OffsetFetch") == before  # silently: not a denial


@pytest.mark.parametrize("version", [2, 8])
def test_offset_fetch_without_an_authorizer_is_unchanged(version: int) -> None:
    broker, coordinator = setup(authorizer="none")
    committed(coordinator, "secret")
    response = send(broker, offset_fetch(version, {"secret": None}))
    group = response.groups[0] if version >= 8 else response
    assert fetched(group) == {
        ("orders", 0): (10, NONE),
        ("orders", 1): (11, NONE),
        ("payments", 0): (20, NONE),
    }


# DescribeGroups: DESCRIBE on each group, authorized operations -----------------------------

READ_BIT, DELETE_BIT, DESCRIBE_BIT = (
    1 << AclOperation.READ,
    1 << AclOperation.DELETE,
    1 << AclOperation.DESCRIBE,
)


@pytest.mark.parametrize("version", [0, 3, 5])
def test_describe_groups_refuses_per_group_in_request_order(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, describe_groups(version, ["app", "secret", "peek"]))
    assert [(g.group_id, g.error_code, g.group_state) for g in response.groups] == [
        ("app", NONE, "Stable"),
        ("secret", GAF, ""),
        ("peek", NONE, "Stable"),
    ]
    [describe] = coordinator.asked(messages.DescribeGroups)
    assert describe.group_ids == ["app", "peek"]


def test_describe_groups_of_refused_groups_asks_nothing() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, describe_groups(5, ["secret"]))
    assert [(g.group_id, g.error_code) for g in response.groups] == [("secret", GAF)]
    assert coordinator.calls == []


@pytest.mark.parametrize("version", [3, 5])
def test_describe_groups_authorized_operations_are_the_principals(version: int) -> None:
    broker, _ = setup(*ALICE_ACLS)
    request = describe_groups(version, ["app", "peek", "doomed", "secret"], operations=True)
    operations = {g.group_id: g.authorized_operations for g in send(broker, request).groups}
    assert operations == {
        "app": READ_BIT | DESCRIBE_BIT,  # READ implies DESCRIBE
        "peek": DESCRIBE_BIT,
        "doomed": DELETE_BIT | DESCRIBE_BIT,
        "secret": NOT_REQUESTED,  # refused: none given
    }
    request = describe_groups(version, ["app"], operations=False)
    assert [g.authorized_operations for g in send(broker, request).groups] == [NOT_REQUESTED]


def test_describe_groups_without_an_authorizer_gives_every_group_operation() -> None:
    broker, coordinator = setup(authorizer="none")
    request = describe_groups(5, ["secret"], operations=True)
    [group] = send(broker, request).groups
    assert (group.error_code, group.authorized_operations) == (
        NONE,
        READ_BIT | DESCRIBE_BIT | DELETE_BIT,
    )
    assert len(coordinator.calls) == 1


# ListGroups: every group with cluster DESCRIBE, else those it may DESCRIBE -----------------


@pytest.mark.parametrize("version", [0, 5])
def test_list_groups_lists_only_the_groups_the_principal_may_describe(version: int) -> None:
    broker, _ = setup(*ALICE_ACLS)
    before = denials("ListGroups")
    response = send(broker, list_groups(version))
    assert response.error_code == NONE
    assert [g.group_id for g in response.groups] == ["app", "doomed", "peek"]
    assert denials("ListGroups") == before  # silently: not a denial


@pytest.mark.parametrize(
    "acls",
    [
        (acl(ResourceType.CLUSTER, "kafka-cluster", AclOperation.DESCRIBE),),
        (acl(ResourceType.CLUSTER, "kafka-cluster", AclOperation.ALTER),),  # implies DESCRIBE
    ],
)
def test_list_groups_with_cluster_describe_lists_every_group(acls: tuple[AclRecord]) -> None:
    broker, _ = setup(*acls)
    assert [g.group_id for g in send(broker, list_groups(5)).groups] == list(GROUPS)


def test_list_groups_without_an_authorizer_lists_every_group() -> None:
    broker, _ = setup(authorizer="none")
    assert [g.group_id for g in send(broker, list_groups(5)).groups] == list(GROUPS)


# DeleteGroups: DELETE on each group ---------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2])
def test_delete_groups_refuses_groups_without_delete(version: int) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, delete_groups(version, ["app", "doomed", "secret"]))
    assert [(r.group_id, r.error_code) for r in response.results] == [
        ("app", GAF),  # READ does not imply DELETE
        ("doomed", NONE),
        ("secret", GAF),
    ]
    [delete] = coordinator.asked(messages.DeleteGroups)
    assert delete.group_ids == ["doomed"]


def test_delete_groups_of_refused_groups_asks_nothing() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, delete_groups(2, ["secret", "peek"]))
    assert [(r.group_id, r.error_code) for r in response.results] == [
        ("secret", GAF),
        ("peek", GAF),
    ]
    assert coordinator.calls == []


def test_delete_groups_without_an_authorizer_is_unchanged() -> None:
    broker, coordinator = setup(authorizer="none")
    response = send(broker, delete_groups(2, ["secret"]))
    assert [(r.group_id, r.error_code) for r in response.results] == [("secret", NONE)]
    assert len(coordinator.calls) == 1


# OffsetDelete: DELETE on the group, READ on each topic ------------------------------------


@pytest.mark.parametrize("group", ["app", "secret"])  # READ is not DELETE
def test_offset_delete_without_group_delete_is_refused(group: str) -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    response = send(broker, offset_delete(group, {"orders": [0]}))
    assert (response.error_code, response.topics) == (GAF, ())
    assert coordinator.calls == []


def test_offset_delete_refuses_topics_it_may_not_read() -> None:
    broker, coordinator = setup(*ALICE_ACLS)
    request = offset_delete("doomed", {"orders": [0], "payments": [1], "ghost": [0]})
    response = send(broker, request)
    assert response.error_code == NONE
    assert partition_errors(response) == {
        ("orders", 0): NONE,
        ("payments", 1): TAF,
        ("ghost", 0): TAF,
    }
    [delete] = coordinator.asked(messages.OffsetDelete)
    assert delete.partitions == [("orders", 0)]


def test_offset_delete_without_an_authorizer_is_unchanged() -> None:
    broker, coordinator = setup(authorizer="none")
    response = send(broker, offset_delete("secret", {"payments": [1], "ghost": [0]}))
    assert partition_errors(response) == {
        ("payments", 1): NONE,
        ("ghost", 0): ErrorCode.unknown_topic_or_partition,
    }
    [delete] = coordinator.asked(messages.OffsetDelete)
    assert delete.partitions == [("payments", 1)]
