"""CreateAcls (key 30), DescribeAcls (key 29) and DeleteAcls (key 31), v1-v3, end to end from
request bytes to response bytes, as ``kafka-acls --add/--list/--remove`` uses them.

The coordinator is the real ``AclAdmin`` over a real embedded SQLite metadata store, and the
broker's view is a real ``MetadataView`` following that store: what CreateAcls writes is what
DescribeAcls lists and what the authorizer then decides with. Requests run as a principal through
``requests.process(broker, frame, peer, Session(...))``.

Covered:

- ``KAFSCALE_AUTHORIZER=none``: SECURITY_DISABLED (with a message) for all three, per creation,
  for the whole description and per deletion filter; the coordinator is never asked.
- a principal without cluster ALTER / DESCRIBE: CLUSTER_AUTHORIZATION_FAILED, nothing asked of
  the coordinator; one with cluster DESCRIBE may list but not change; one with cluster ALTER
  (granted with CreateAcls itself) may change and list (ALTER implies DESCRIBE).
- a super user (``KAFSCALE_SUPER_USERS``) creates, lists -- every binding, grouped by resource
  pattern (type, name, pattern type), the group's entries with principal, host, operation and
  permission -- and deletes; each DeleteAcls filter result lists every field of what it removed
  (a binding two filters select under both); the answers wait until the broker's view holds
  the change.
- invalid bindings (a CLUSTER resource not named kafka-cluster, an empty name, pattern ANY or
  MATCH, operation ANY, permission ANY, resource type ANY, a principal without ':'):
  INVALID_REQUEST with Kafka's message, while the valid ones of the same request are created.
- DescribeAcls with a MATCH filter (the literal name, the literal wildcard and the prefixes that
  apply; not other names or prefixes) and with exact filters; a filter with an UNKNOWN code is
  INVALID_REQUEST (DescribeAcls as a whole, DeleteAcls per filter while the others apply).
- the coordinator unreachable: REQUEST_TIMED_OUT for the bindings and filters it was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from kafscale import config as configuration
from kafscale.coordinator.acls import AclAdmin
from kafscale.frontend import requests
from kafscale.frontend.context import Broker, Session
from kafscale.frontend.coordinator import CoordinatorFailed
from kafscale.frontend.dispatch import APIS
from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming, RpcError
from kafscale.metadata import records
from kafscale.metadata.records import AclRecord, Keys
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.view import MetadataView
from kafscale.protocol import codec
from kafscale.protocol.acls import AclOperation as Op
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.sasl import Authentication
from kafscale.security.authorizer import AclPermissionType as Perm
from kafscale.security.authorizer import PatternType as Pat
from kafscale.security.authorizer import ResourceType as Res
from tests.unit.frontend.test_requests import NoShards, decode_response
from tests.unit.protocol.test_codec import request_frame

NS = "ns"
DESCRIBE, CREATE, DELETE = 29, 30, 31
VERSIONS = [1, 2, 3]
ADMIN, OPS, ALICE, BOB = "User:admin", "User:CN=ops", "User:alice", "User:bob"
PEER = "10.0.0.9:5555"
CLUSTER = "kafka-cluster"

Binding = tuple[Res, str, Pat, str, str, Op, Perm]
Filter = tuple[Res, str | None, Pat, str | None, str | None, Op, Perm]
EVERYTHING: Filter = (Res.ANY, None, Pat.ANY, None, None, Op.ANY, Perm.ANY)


@dataclass
class AclCoordinator:
    """The coordinator's ACL side: the real ``AclAdmin`` handlers on the store. ``calls``
    records every request, ``caught_up_to`` every revision the handler waited for; an exception
    of the admin is an ErrorReply (``CoordinatorFailed``), as ``process.contained`` makes it."""

    admin: AclAdmin
    view: MetadataView
    calls: list[messages.Message] = field(default_factory=list)
    caught_up_to: list[int] = field(default_factory=list)
    unreachable: bool = False

    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        self.calls.append(request)
        if self.unreachable:
            raise RpcError("no answer")
        handler = self.admin.handlers()[type(request)]
        try:
            reply = handler(Incoming(b"frontend", b"1", request))
        except Exception as exc:
            raise CoordinatorFailed(f"{type(exc).__name__}: {exc}") from exc
        assert reply is not None
        return reply

    async def caught_up(self, revision: int) -> None:
        self.caught_up_to.append(revision)
        assert await asyncio.to_thread(self.view.wait_for_revision, revision, 10)

    async def create_topics(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("no topic is created by an ACL API")

    async def delete_topics(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("no topic is deleted by an ACL API")

    async def allocate_producer_id(self) -> int:
        raise AssertionError("no producer id is allocated by an ACL API")


@dataclass
class Cluster:
    broker: Broker
    coordinator: AclCoordinator
    store: SqliteMetadataStore
    view: MetadataView

    def stored(self) -> set[Binding]:
        """Every binding in the store, read straight from it."""
        return {
            as_binding(records.decode_acl(kv.value)) for kv in self.store.get_prefix(Keys(NS).acls)
        }

    def seed(self, *bindings: Binding) -> None:
        """Bindings written by the coordinator directly (as another broker's CreateAcls)."""
        reply = self.coordinator.admin.create(messages.CreateAcls([as_value(b) for b in bindings]))
        assert self.view.wait_for_revision(reply.revision, 10)


def as_value(binding: Binding) -> messages.AclValue:
    kind, name, pattern, principal, host, operation, permission = binding
    return messages.AclValue(
        int(kind), name, int(pattern), principal, host, int(operation), int(permission)
    )


def as_binding(record: AclRecord) -> Binding:
    return (
        Res(record.resource_type),
        record.resource_name,
        Pat(record.pattern_type),
        record.principal,
        record.host,
        Op(record.operation),
        Perm(record.permission_type),
    )


def open_cluster(tmp_path: Path, **env: str) -> Iterator[Cluster]:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    view = MetadataView(reader, NS)
    view.start()
    coordinator = AclCoordinator(AclAdmin(writer, NS), view)
    config = configuration.load({"KAFSCALE_BROKER_ID": "3", "KAFSCALE_BROKER_PORT": "19092", **env})
    broker = Broker(config, view, APIS, coordinator, NoShards())  # type: ignore[arg-type]
    try:
        yield Cluster(broker, coordinator, writer, view)
    finally:
        view.stop()
        writer.close()
        reader.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """ACLs on; User:admin and User:CN=ops are super users."""
    yield from open_cluster(
        tmp_path, KAFSCALE_AUTHORIZER="acl", KAFSCALE_SUPER_USERS=f"{ADMIN};{OPS}"
    )


@pytest.fixture
def no_authorizer(tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(tmp_path, KAFSCALE_SUPER_USERS=ADMIN)


def session(principal: str) -> Session:
    return Session("PLAINTEXT", Authentication(False, {}, 0, anonymous=principal))


def run(cluster: Cluster, request: Any, api_key: int, principal: str) -> Any:
    answer = asyncio.run(
        requests.process(cluster.broker, request_frame(request), PEER, session(principal))
    )
    assert isinstance(answer, bytes)
    return decode_response(answer, api_key, int(request.__version__))[1]


# -- requests ----------------------------------------------------------------------------------


def create_request(version: int, *bindings: Binding) -> Any:
    schema = load_request_schema(CREATE, version)
    creation = codec.nested(schema, "AclCreation")
    return codec.build(
        schema,
        creations=tuple(
            codec.build(
                creation,
                resource_type=int(kind),
                resource_name=name,
                resource_pattern_type=int(pattern),
                principal=principal,
                host=host,
                operation=int(operation),
                permission_type=int(permission),
            )
            for kind, name, pattern, principal, host, operation, permission in bindings
        ),
    )


def describe_request(version: int, given: Filter = EVERYTHING) -> Any:
    kind, name, pattern, principal, host, operation, permission = given
    return codec.build(
        load_request_schema(DESCRIBE, version),
        resource_type_filter=int(kind),
        resource_name_filter=name,
        pattern_type_filter=int(pattern),
        principal_filter=principal,
        host_filter=host,
        operation=int(operation),
        permission_type=int(permission),
    )


def delete_request(version: int, *filters: Filter) -> Any:
    schema = load_request_schema(DELETE, version)
    entry = codec.nested(schema, "DeleteAclsFilter")
    return codec.build(
        schema,
        filters=tuple(
            codec.build(
                entry,
                resource_type_filter=int(kind),
                resource_name_filter=name,
                pattern_type_filter=int(pattern),
                principal_filter=principal,
                host_filter=host,
                operation=int(operation),
                permission_type=int(permission),
            )
            for kind, name, pattern, principal, host, operation, permission in filters
        ),
    )


def create(
    cluster: Cluster, principal: str, *bindings: Binding, version: int = 3
) -> list[tuple[ErrorCode, str | None]]:
    response = run(cluster, create_request(version, *bindings), CREATE, principal)
    return [(ErrorCode(r.error_code), r.error_message) for r in response.results]


def describe(
    cluster: Cluster, principal: str, given: Filter = EVERYTHING, version: int = 3
) -> tuple[ErrorCode, str | None, list[tuple[tuple[Res, str, Pat], list[tuple[Any, ...]]]]]:
    """(error, message, [((type, name, pattern), [(principal, host, operation, permission)])])."""
    response = run(cluster, describe_request(version, given), DESCRIBE, principal)
    resources = [
        (
            (Res(r.resource_type), r.resource_name, Pat(r.pattern_type)),
            [(a.principal, a.host, Op(a.operation), Perm(a.permission_type)) for a in r.acls],
        )
        for r in response.resources
    ]
    return ErrorCode(response.error_code), response.error_message, resources


def described_bindings(cluster: Cluster, given: Filter = EVERYTHING) -> set[Binding]:
    code, _, resources = describe(cluster, ADMIN, given)
    assert code == ErrorCode.none
    return {(*pattern, *entry) for pattern, entries in resources for entry in entries}


def delete(
    cluster: Cluster, principal: str, *filters: Filter, version: int = 3
) -> list[tuple[ErrorCode, str | None, list[Binding]]]:
    response = run(cluster, delete_request(version, *filters), DELETE, principal)
    results = []
    for result in response.filter_results:
        removed = []
        for m in result.matching_acls:
            assert (m.error_code, m.error_message) == (ErrorCode.none, None)
            removed.append(
                (
                    Res(m.resource_type),
                    m.resource_name,
                    Pat(m.pattern_type),
                    m.principal,
                    m.host,
                    Op(m.operation),
                    Perm(m.permission_type),
                )
            )
        results.append((ErrorCode(result.error_code), result.error_message, removed))
    return results


# Bindings used throughout.
ALICE_READS_ORDERS: Binding = (Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
BOB_WRITES_ORDERS: Binding = (
    Res.TOPIC,
    "orders",
    Pat.LITERAL,
    BOB,
    "10.0.0.7",
    Op.WRITE,
    Perm.ALLOW,
)
BOB_DENIED_ORDERS: Binding = (Res.TOPIC, "orders", Pat.LITERAL, BOB, "*", Op.READ, Perm.DENY)
ALICE_ORDERS_PREFIX: Binding = (
    Res.TOPIC,
    "orders-",
    Pat.PREFIXED,
    ALICE,
    "*",
    Op.WRITE,
    Perm.ALLOW,
)
EVERYONE_DESCRIBES: Binding = (Res.TOPIC, "*", Pat.LITERAL, "User:*", "*", Op.DESCRIBE, Perm.ALLOW)
PAY_PREFIX: Binding = (Res.TOPIC, "pay", Pat.PREFIXED, BOB, "*", Op.READ, Perm.ALLOW)
EU_ORDERS: Binding = (Res.TOPIC, "orders-eu", Pat.LITERAL, ALICE, "*", Op.ALL, Perm.ALLOW)
GROUP_READ: Binding = (Res.GROUP, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
CLUSTER_ALTER: Binding = (Res.CLUSTER, CLUSTER, Pat.LITERAL, ALICE, "*", Op.ALTER, Perm.ALLOW)
CLUSTER_DESCRIBE: Binding = (
    Res.CLUSTER,
    CLUSTER,
    Pat.LITERAL,
    BOB,
    "*",
    Op.DESCRIBE,
    Perm.ALLOW,
)

SEEDED = [
    ALICE_READS_ORDERS,
    BOB_WRITES_ORDERS,
    BOB_DENIED_ORDERS,
    ALICE_ORDERS_PREFIX,
    EVERYONE_DESCRIBES,
    PAY_PREFIX,
    EU_ORDERS,
    GROUP_READ,
]


REFUSED = ErrorCode.cluster_authorization_failed


def codes(results: list[tuple[ErrorCode, str | None]]) -> list[ErrorCode]:
    return [code for code, _ in results]


# -- no authorizer -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_without_an_authorizer_every_acl_api_is_security_disabled(
    no_authorizer: Cluster, version: int
) -> None:
    cluster = no_authorizer
    results = create(cluster, ADMIN, ALICE_READS_ORDERS, GROUP_READ, version=version)
    assert [code for code, _ in results] == [ErrorCode.security_disabled] * 2
    assert all(message for _, message in results)

    code, message, resources = describe(cluster, ADMIN, version=version)
    assert (code, resources) == (ErrorCode.security_disabled, [])
    assert message

    deleted = delete(cluster, ADMIN, EVERYTHING, EVERYTHING, version=version)
    assert [(code, removed) for code, _, removed in deleted] == [
        (ErrorCode.security_disabled, []),
        (ErrorCode.security_disabled, []),
    ]
    assert all(message for _, message, _ in deleted)
    assert cluster.coordinator.calls == [] and cluster.stored() == set()


# -- who may ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_a_principal_without_cluster_acls_is_refused(cluster: Cluster, version: int) -> None:
    cluster.seed(ALICE_READS_ORDERS, GROUP_READ)  # ACLs of alice's, none on the cluster
    assert codes(create(cluster, ALICE, PAY_PREFIX, version=version)) == [REFUSED]
    code, _, resources = describe(cluster, ALICE, version=version)
    assert (code, resources) == (ErrorCode.cluster_authorization_failed, [])
    deleted = delete(cluster, ALICE, EVERYTHING, version=version)
    assert [(code, removed) for code, _, removed in deleted] == [
        (ErrorCode.cluster_authorization_failed, [])
    ]
    assert cluster.coordinator.calls == []
    assert cluster.stored() == {ALICE_READS_ORDERS, GROUP_READ}


def test_cluster_describe_lists_but_does_not_change(cluster: Cluster) -> None:
    cluster.seed(CLUSTER_DESCRIBE, ALICE_READS_ORDERS)
    code, _, resources = describe(cluster, BOB)
    assert code == ErrorCode.none
    assert {(*p, *e) for p, entries in resources for e in entries} == {
        CLUSTER_DESCRIBE,
        ALICE_READS_ORDERS,
    }
    assert codes(create(cluster, BOB, PAY_PREFIX)) == [REFUSED]
    assert [r[0] for r in delete(cluster, BOB, EVERYTHING)] == [
        ErrorCode.cluster_authorization_failed
    ]
    assert cluster.coordinator.calls == []


def test_cluster_alter_granted_with_create_acls_lets_its_principal_manage_acls(
    cluster: Cluster,
) -> None:
    assert codes(create(cluster, ALICE, PAY_PREFIX)) == [REFUSED]
    assert create(cluster, ADMIN, CLUSTER_ALTER) == [(ErrorCode.none, None)]
    # The view holds the new binding as soon as the answer is sent: the authorizer uses it.
    assert create(cluster, ALICE, PAY_PREFIX) == [(ErrorCode.none, None)]
    code, _, _ = describe(cluster, ALICE)  # ALTER implies DESCRIBE
    assert code == ErrorCode.none
    [(code, _, removed)] = delete(cluster, ALICE, (Res.TOPIC, "pay", *EVERYTHING[2:]))
    assert (code, removed) == (ErrorCode.none, [PAY_PREFIX])
    assert cluster.stored() == {CLUSTER_ALTER}


def test_a_denied_cluster_alter_beats_an_allowed_one(cluster: Cluster) -> None:
    deny = (Res.CLUSTER, CLUSTER, Pat.LITERAL, ALICE, "*", Op.ALTER, Perm.DENY)
    cluster.seed(CLUSTER_ALTER, deny)
    assert codes(create(cluster, ALICE, PAY_PREFIX)) == [REFUSED]


# -- a super user: create, list, delete ----------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("principal", [ADMIN, OPS])
def test_super_user_creates_lists_and_deletes(
    cluster: Cluster, version: int, principal: str
) -> None:
    results = create(cluster, principal, *SEEDED, ALICE_READS_ORDERS, version=version)
    assert results == [(ErrorCode.none, None)] * (len(SEEDED) + 1)
    assert cluster.stored() == set(SEEDED)
    [call] = cluster.coordinator.calls
    assert isinstance(call, messages.CreateAcls) and len(call.bindings) == len(SEEDED) + 1
    # The answer came once the broker's view held the bindings.
    assert cluster.coordinator.caught_up_to == [cluster.store.revision()]
    assert {as_binding(r) for r in cluster.view.snapshot.acls.values()} == set(SEEDED)

    code, message, resources = describe(cluster, principal, version=version)
    assert (code, message) == (ErrorCode.none, None)
    # One entry per resource pattern, each binding under its own pattern, none twice.
    patterns = [pattern for pattern, _ in resources]
    assert len(patterns) == len(set(patterns))
    assert dict(resources) == {
        (Res.TOPIC, "orders", Pat.LITERAL): sorted_entries(
            ALICE_READS_ORDERS, BOB_WRITES_ORDERS, BOB_DENIED_ORDERS
        ),
        (Res.TOPIC, "orders-", Pat.PREFIXED): sorted_entries(ALICE_ORDERS_PREFIX),
        (Res.TOPIC, "*", Pat.LITERAL): sorted_entries(EVERYONE_DESCRIBES),
        (Res.TOPIC, "pay", Pat.PREFIXED): sorted_entries(PAY_PREFIX),
        (Res.TOPIC, "orders-eu", Pat.LITERAL): sorted_entries(EU_ORDERS),
        (Res.GROUP, "orders", Pat.LITERAL): sorted_entries(GROUP_READ),
    }

    deleted = delete(
        cluster,
        principal,
        (Res.TOPIC, "orders", Pat.LITERAL, None, None, Op.ANY, Perm.ANY),
        (Res.ANY, None, Pat.ANY, BOB, None, Op.ANY, Perm.ANY),
        (Res.CLUSTER, None, Pat.ANY, None, None, Op.ANY, Perm.ANY),
        version=version,
    )
    literal_orders, bobs, on_cluster = deleted
    assert [result[:2] for result in deleted] == [(ErrorCode.none, None)] * 3
    assert set(literal_orders[2]) == {ALICE_READS_ORDERS, BOB_WRITES_ORDERS, BOB_DENIED_ORDERS}
    assert len(literal_orders[2]) == 3
    # bob's bindings on "orders" were removed by the first filter too: listed under both.
    assert set(bobs[2]) == {BOB_WRITES_ORDERS, BOB_DENIED_ORDERS, PAY_PREFIX}
    assert len(bobs[2]) == 3
    assert on_cluster == (ErrorCode.none, None, [])
    remaining = {ALICE_ORDERS_PREFIX, EVERYONE_DESCRIBES, EU_ORDERS, GROUP_READ}
    assert cluster.stored() == remaining
    assert {as_binding(r) for r in cluster.view.snapshot.acls.values()} == remaining
    assert described_bindings(cluster) == remaining


def sorted_entries(*bindings: Binding) -> list[tuple[str, str, Op, Perm]]:
    """The entries DescribeAcls lists for one pattern, in its order (by principal, host,
    operation, permission)."""
    entries = [(p, h, op, perm) for _, _, _, p, h, op, perm in bindings]
    return sorted(entries, key=lambda e: (e[0], e[1], int(e[2]), int(e[3])))


# -- invalid bindings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        pytest.param(
            (Res.CLUSTER, "my-cluster", Pat.LITERAL, ALICE, "*", Op.ALTER, Perm.ALLOW),
            "The only valid name for the CLUSTER resource is kafka-cluster",
            id="cluster not named kafka-cluster",
        ),
        pytest.param(
            (Res.TOPIC, "", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW),
            "Invalid empty resource name",
            id="empty name",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.ANY, ALICE, "*", Op.READ, Perm.ALLOW),
            "Invalid patternType ANY",
            id="pattern ANY",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.MATCH, ALICE, "*", Op.READ, Perm.ALLOW),
            "Invalid patternType MATCH",
            id="pattern MATCH",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.ANY, Perm.ALLOW),
            "Invalid operation ANY",
            id="operation ANY",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ANY),
            "Invalid permissionType ANY",
            id="permission ANY",
        ),
        pytest.param(
            (Res.ANY, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW),
            "Invalid resourceType ANY",
            id="resource type ANY",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.LITERAL, "alice", "*", Op.READ, Perm.ALLOW),
            "Could not parse principal from `alice`",
            id="principal without a colon",
        ),
    ],
)
@pytest.mark.parametrize("version", [1, 3])
def test_an_invalid_binding_is_refused_and_the_valid_ones_created(
    cluster: Cluster, binding: Binding, message: str, version: int
) -> None:
    results = create(cluster, ADMIN, ALICE_READS_ORDERS, binding, GROUP_READ, version=version)
    assert results[0] == (ErrorCode.none, None) and results[2] == (ErrorCode.none, None)
    code, text = results[1]
    assert code == ErrorCode.invalid_request
    assert text is not None and text.startswith(message)
    assert cluster.stored() == {ALICE_READS_ORDERS, GROUP_READ}
    [call] = cluster.coordinator.calls
    assert isinstance(call, messages.CreateAcls) and len(call.bindings) == 2


def test_only_invalid_bindings_ask_the_coordinator_nothing(cluster: Cluster) -> None:
    empty = (Res.TOPIC, "", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
    assert [code for code, _ in create(cluster, ADMIN, empty, empty)] == [
        ErrorCode.invalid_request
    ] * 2
    assert cluster.coordinator.calls == [] and cluster.stored() == set()


# -- DescribeAcls filters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            (Res.TOPIC, "orders-eu", Pat.MATCH, None, None, Op.ANY, Perm.ANY),
            {EU_ORDERS, EVERYONE_DESCRIBES, ALICE_ORDERS_PREFIX},
            id="MATCH: literal, wildcard, prefix",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.MATCH, None, None, Op.ANY, Perm.ANY),
            {ALICE_READS_ORDERS, BOB_WRITES_ORDERS, BOB_DENIED_ORDERS, EVERYONE_DESCRIBES},
            id="MATCH: 'orders-' is not a prefix of 'orders'",
        ),
        pytest.param(
            (Res.ANY, "orders", Pat.MATCH, None, None, Op.ANY, Perm.ANY),
            {
                ALICE_READS_ORDERS,
                BOB_WRITES_ORDERS,
                BOB_DENIED_ORDERS,
                EVERYONE_DESCRIBES,
                GROUP_READ,
            },
            id="MATCH on any resource type",
        ),
        pytest.param(
            (Res.TOPIC, "payments", Pat.MATCH, BOB, None, Op.ANY, Perm.ANY),
            {PAY_PREFIX},
            id="MATCH and principal",
        ),
        pytest.param(
            (Res.TOPIC, "orders", Pat.LITERAL, None, None, Op.ANY, Perm.ANY),
            {ALICE_READS_ORDERS, BOB_WRITES_ORDERS, BOB_DENIED_ORDERS},
            id="literal name",
        ),
        pytest.param(
            (Res.ANY, None, Pat.PREFIXED, None, None, Op.ANY, Perm.ANY),
            {ALICE_ORDERS_PREFIX, PAY_PREFIX},
            id="prefixed",
        ),
        pytest.param(
            (Res.ANY, None, Pat.ANY, None, "10.0.0.7", Op.ANY, Perm.ANY),
            {BOB_WRITES_ORDERS},
            id="host",
        ),
        pytest.param(
            (Res.ANY, None, Pat.ANY, None, None, Op.ANY, Perm.DENY),
            {BOB_DENIED_ORDERS},
            id="permission",
        ),
        pytest.param(
            (Res.ANY, None, Pat.ANY, None, None, Op.ALL, Perm.ANY), {EU_ORDERS}, id="operation ALL"
        ),
        pytest.param(
            (Res.TRANSACTIONAL_ID, None, Pat.ANY, None, None, Op.ANY, Perm.ANY),
            set(),
            id="nothing",
        ),
    ],
)
def test_describe_filters(cluster: Cluster, given: Filter, expected: set[Binding]) -> None:
    cluster.seed(*SEEDED)
    assert described_bindings(cluster, given) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ((Res.UNKNOWN, None, Pat.ANY, None, None, Op.ANY, Perm.ANY), "Unknown patternFilter."),
        ((Res.ANY, None, Pat.UNKNOWN, None, None, Op.ANY, Perm.ANY), "Unknown patternFilter."),
        ((Res.ANY, None, Pat.ANY, None, None, Op.UNKNOWN, Perm.ANY), "Unknown entryFilter."),
        ((Res.ANY, None, Pat.ANY, None, None, Op.ANY, Perm.UNKNOWN), "Unknown entryFilter."),
    ],
)
def test_a_filter_with_an_unknown_code_is_invalid(
    cluster: Cluster, given: Filter, message: str
) -> None:
    cluster.seed(ALICE_READS_ORDERS, PAY_PREFIX)
    assert describe(cluster, ADMIN, given) == (ErrorCode.invalid_request, message, [])
    first, second = delete(cluster, ADMIN, given, (Res.TOPIC, "pay", *EVERYTHING[2:]))
    assert first == (ErrorCode.invalid_request, message, [])
    assert second == (ErrorCode.none, None, [PAY_PREFIX])
    assert cluster.stored() == {ALICE_READS_ORDERS}


# -- DeleteAcls ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_delete_results_list_every_field_of_what_was_removed(
    cluster: Cluster, version: int
) -> None:
    cluster.seed(*SEEDED)
    results = delete(
        cluster,
        ADMIN,
        (Res.TOPIC, "orders-eu", Pat.MATCH, ALICE, None, Op.ANY, Perm.ANY),
        (Res.GROUP, "nothing", Pat.ANY, None, None, Op.ANY, Perm.ANY),
        (Res.TOPIC, "orders", Pat.LITERAL, BOB, "10.0.0.7", Op.WRITE, Perm.ALLOW),
        version=version,
    )
    assert [(code, message) for code, message, _ in results] == [(ErrorCode.none, None)] * 3
    assert sorted(results[0][2]) == sorted([EU_ORDERS, ALICE_ORDERS_PREFIX])
    assert results[1][2] == []
    assert results[2][2] == [BOB_WRITES_ORDERS]
    remaining = set(SEEDED) - {EU_ORDERS, ALICE_ORDERS_PREFIX, BOB_WRITES_ORDERS}
    assert cluster.stored() == remaining
    # The answer came once the broker's view no longer held them.
    assert {as_binding(r) for r in cluster.view.snapshot.acls.values()} == remaining
    assert cluster.coordinator.caught_up_to == [cluster.store.revision()]


def test_delete_matching_nothing_waits_for_nothing(cluster: Cluster) -> None:
    cluster.seed(ALICE_READS_ORDERS)
    assert delete(cluster, ADMIN, (Res.GROUP, *EVERYTHING[1:])) == [(ErrorCode.none, None, [])]
    assert cluster.coordinator.caught_up_to == []
    assert cluster.stored() == {ALICE_READS_ORDERS}


# -- the coordinator unreachable -----------------------------------------------------------------


def test_coordinator_unreachable_is_request_timed_out(cluster: Cluster) -> None:
    cluster.seed(ALICE_READS_ORDERS)
    cluster.coordinator.unreachable = True
    empty = (Res.TOPIC, "", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
    results = create(cluster, ADMIN, PAY_PREFIX, empty)
    assert [code for code, _ in results] == [ErrorCode.request_timed_out, ErrorCode.invalid_request]
    deleted = delete(cluster, ADMIN, EVERYTHING, (Res.UNKNOWN, *EVERYTHING[1:]))
    assert [(code, removed) for code, _, removed in deleted] == [
        (ErrorCode.request_timed_out, []),
        (ErrorCode.invalid_request, []),
    ]
    assert cluster.stored() == {ALICE_READS_ORDERS}
    # DescribeAcls is answered from the view: no coordinator involved.
    code, _, resources = describe(cluster, ADMIN)
    assert code == ErrorCode.none and len(resources) == 1
