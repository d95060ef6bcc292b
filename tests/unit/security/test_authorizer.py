"""kafscale.security.authorizer: Kafka's ACL rules as tables, then checked against a naive
linear-scan reference (written here from the rules, not from the index) with hypothesis."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol import acls
from kafscale.protocol.acls import AclOperation as Op
from kafscale.security.authorizer import (
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclBindingFilter,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourceType,
    binding_error,
    filter_error,
    from_code,
    matching,
)

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED, MATCH = PatternType.LITERAL, PatternType.PREFIXED, PatternType.MATCH
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TXN = ResourceType.TRANSACTIONAL_ID
ADMIN = "User:admin"
HOST = "10.0.0.1"


def acl(
    name: str,
    operation: Op,
    permission: AclPermissionType = ALLOW,
    *,
    kind: ResourceType = TOPIC,
    pattern: PatternType = LITERAL,
    principal: str = "User:alice",
    host: str = "*",
) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


def bits(*operations: Op) -> int:
    return sum(1 << operation for operation in operations)


def authorizer(bindings: Iterable[AclBinding], allow_if_no_acl_found: bool = False) -> Authorizer:
    return Authorizer(bindings, frozenset({ADMIN}), allow_if_no_acl_found)


class Ask(NamedTuple):
    """A question to the authorizer, and whether it allows what no ACL covers."""

    operation: Op
    name: str = "orders"
    principal: str = "User:alice"
    host: str = HOST
    kind: ResourceType = TOPIC
    allow_if_none: bool = False


CLUSTER_ALTER = acl("kafka-cluster", Op.ALTER, kind=CLUSTER)
# name: (bindings, question, expected)
DECISIONS = {
    "literal": ([acl("orders", Op.READ)], Ask(Op.READ), True),
    "literal is no prefix": (
        [acl("orders", Op.READ, DENY)],
        Ask(Op.READ, "orders-eu", allow_if_none=True),
        True,
    ),
    "wildcard name": ([acl("*", Op.READ)], Ask(Op.READ, "payments"), True),
    "prefixed": ([acl("ord", Op.READ, pattern=PREFIXED)], Ask(Op.READ), True),
    "prefixed, the whole name": ([acl("orders", Op.READ, pattern=PREFIXED)], Ask(Op.READ), True),
    "prefixed, another name": (
        [acl("ord", Op.READ, pattern=PREFIXED)],
        Ask(Op.READ, "payments"),
        False,
    ),
    "prefixed '*' is no wildcard": (
        [acl("*", Op.READ, DENY, pattern=PREFIXED)],
        Ask(Op.READ, allow_if_none=True),
        True,
    ),
    "deny overrides allow": (
        [acl("orders", Op.READ), acl("orders", Op.READ, DENY)],
        Ask(Op.READ),
        False,
    ),
    "wildcard deny overrides literal allow": (
        [acl("orders", Op.READ), acl("*", Op.READ, DENY, principal="User:*")],
        Ask(Op.READ),
        False,
    ),
    "prefixed deny overrides literal allow": (
        [acl("orders", Op.ALL), acl("or", Op.READ, DENY, pattern=PREFIXED)],
        Ask(Op.READ),
        False,
    ),
    "deny ALL overrides allow": (
        [acl("orders", Op.READ), acl("orders", Op.ALL, DENY)],
        Ask(Op.READ),
        False,
    ),
    "deny of another operation": (
        [acl("orders", Op.READ), acl("orders", Op.WRITE, DENY)],
        Ask(Op.READ),
        True,
    ),
    "deny READ does not deny DESCRIBE": (
        [acl("orders", Op.DESCRIBE), acl("orders", Op.READ, DENY)],
        Ask(Op.DESCRIBE),
        True,
    ),
    "host matches": ([acl("orders", Op.READ, host=HOST)], Ask(Op.READ), True),
    "host differs": ([acl("orders", Op.READ, host=HOST)], Ask(Op.READ, host="10.0.0.2"), False),
    "deny from another host does not apply": (
        [acl("orders", Op.READ), acl("orders", Op.READ, DENY, host="10.0.0.9")],
        Ask(Op.READ),
        True,
    ),
    "User:* is anyone": (
        [acl("orders", Op.READ, principal="User:*")],
        Ask(Op.READ, principal="User:bob"),
        True,
    ),
    "User:* is anyone of any type": (
        [acl("orders", Op.READ, principal="User:*")],
        Ask(Op.READ, principal="Group:ops"),
        True,
    ),
    "Group:* is no wildcard": (
        [acl("orders", Op.READ, principal="Group:*")],
        Ask(Op.READ, principal="Group:ops"),
        False,
    ),
    "ACLs for others only: denied": (
        [acl("orders", Op.READ)],
        Ask(Op.READ, principal="User:bob", allow_if_none=True),
        False,
    ),
    "another resource type": (
        [acl("orders", Op.READ, DENY, kind=GROUP)],
        Ask(Op.READ, allow_if_none=True),
        True,
    ),
    "READ implies DESCRIBE": ([acl("orders", Op.READ)], Ask(Op.DESCRIBE), True),
    "WRITE implies DESCRIBE": ([acl("orders", Op.WRITE)], Ask(Op.DESCRIBE), True),
    "DELETE implies DESCRIBE": ([acl("orders", Op.DELETE)], Ask(Op.DESCRIBE), True),
    "ALTER implies DESCRIBE": ([acl("orders", Op.ALTER)], Ask(Op.DESCRIBE), True),
    "CREATE does not imply DESCRIBE": ([acl("orders", Op.CREATE)], Ask(Op.DESCRIBE), False),
    "ALTER_CONFIGS implies DESCRIBE_CONFIGS": (
        [acl("orders", Op.ALTER_CONFIGS)],
        Ask(Op.DESCRIBE_CONFIGS),
        True,
    ),
    "ALTER does not imply ALTER_CONFIGS": ([acl("orders", Op.ALTER)], Ask(Op.ALTER_CONFIGS), False),
    "WRITE does not imply READ": ([acl("orders", Op.WRITE)], Ask(Op.READ), False),
    "DESCRIBE does not imply READ": ([acl("orders", Op.DESCRIBE)], Ask(Op.READ), False),
    "ALL allows anything": ([acl("orders", Op.ALL)], Ask(Op.DELETE), True),
    "super user without ACLs": ([], Ask(Op.DELETE, principal=ADMIN), True),
    "super user despite a deny": (
        [acl("orders", Op.ALL, DENY, principal=ADMIN)],
        Ask(Op.DELETE, principal=ADMIN),
        True,
    ),
    "no ACL, allow if none found": ([], Ask(Op.READ, allow_if_none=True), True),
    "no ACL, deny if none found": ([], Ask(Op.READ), False),
    "cluster: ALTER implies DESCRIBE": (
        [CLUSTER_ALTER],
        Ask(Op.DESCRIBE, "kafka-cluster", kind=CLUSTER),
        True,
    ),
    "cluster: ALTER is not CLUSTER_ACTION": (
        [CLUSTER_ALTER],
        Ask(Op.CLUSTER_ACTION, "kafka-cluster", kind=CLUSTER),
        False,
    ),
}


@pytest.mark.parametrize(("bindings", "ask", "expected"), DECISIONS.values(), ids=DECISIONS.keys())
def test_authorize(bindings: list[AclBinding], ask: Ask, expected: bool) -> None:
    decider = authorizer(bindings, ask.allow_if_none)
    allowed = decider.authorize(ask.principal, ask.host, ask.operation, ask.kind, ask.name)
    assert allowed is expected


# (bindings, allow_if_no_acl_found, principal, resource type, name, expected bit field)
OPERATIONS = {
    "super user, topic": ([], False, ADMIN, TOPIC, "orders", acls.TOPIC_OPERATIONS),
    "super user, cluster": ([], False, ADMIN, CLUSTER, "kafka-cluster", acls.CLUSTER_OPERATIONS),
    "no ACL, allowed": ([], True, "User:alice", TOPIC, "orders", acls.TOPIC_OPERATIONS),
    "no ACL, denied": ([], False, "User:alice", TOPIC, "orders", 0),
    "READ": (
        [acl("orders", Op.READ)],
        False,
        "User:alice",
        TOPIC,
        "orders",
        bits(Op.READ, Op.DESCRIBE),
    ),
    "ALL but WRITE": (
        [acl("orders", Op.ALL), acl("orders", Op.WRITE, DENY)],
        False,
        "User:alice",
        TOPIC,
        "orders",
        acls.TOPIC_OPERATIONS & ~bits(Op.WRITE),
    ),
    "ALTER_CONFIGS": (
        [acl("orders", Op.ALTER_CONFIGS)],
        False,
        "User:alice",
        TOPIC,
        "orders",
        bits(Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS),
    ),
    "group ALL: only what a group supports": (
        [acl("g", Op.ALL, kind=GROUP)],
        False,
        "User:alice",
        GROUP,
        "g",
        bits(Op.READ, Op.DESCRIBE, Op.DELETE),
    ),
    "transactional id WRITE": (
        [acl("tx", Op.WRITE, kind=TXN)],
        False,
        "User:alice",
        TXN,
        "tx",
        bits(Op.WRITE, Op.DESCRIBE),
    ),
    "ACLs for others only": ([acl("orders", Op.ALL)], True, "User:bob", TOPIC, "orders", 0),
}


@pytest.mark.parametrize(
    ("bindings", "allow_if_none", "principal", "kind", "name", "expected"),
    OPERATIONS.values(),
    ids=OPERATIONS.keys(),
)
def test_authorized_operations(
    bindings: list[AclBinding],
    allow_if_none: bool,
    principal: str,
    kind: ResourceType,
    name: str,
    expected: int,
) -> None:
    decider = authorizer(bindings, allow_if_none)
    assert decider.authorized_operations(principal, HOST, kind, name) == expected


def test_supported_operations_are_kafkas() -> None:
    assert bits(*SUPPORTED_OPERATIONS[TOPIC]) == acls.TOPIC_OPERATIONS
    assert bits(*SUPPORTED_OPERATIONS[CLUSTER]) == acls.CLUSTER_OPERATIONS


@pytest.mark.parametrize("kind", [ResourceType.ANY, ResourceType.UNKNOWN])
def test_a_resource_is_concrete(kind: ResourceType) -> None:
    decider = authorizer([], allow_if_no_acl_found=True)
    with pytest.raises(ValueError, match="concrete"):
        decider.authorize("User:alice", HOST, Op.READ, kind, "orders")
    with pytest.raises(ValueError, match="concrete"):
        decider.authorized_operations("User:alice", HOST, kind, "orders")


VALID = acl("orders", Op.READ)
REFUSED = {
    "resource type UNKNOWN": (
        {"resource_type": ResourceType.UNKNOWN},
        "Invalid resourceType UNKNOWN",
    ),
    "resource type ANY": ({"resource_type": ResourceType.ANY}, "Invalid resourceType ANY"),
    "pattern MATCH": ({"pattern_type": MATCH}, "Invalid patternType MATCH"),
    "pattern ANY": ({"pattern_type": PatternType.ANY}, "Invalid patternType ANY"),
    "pattern UNKNOWN": ({"pattern_type": PatternType.UNKNOWN}, "Invalid patternType UNKNOWN"),
    "empty name": ({"resource_name": ""}, "Invalid empty resource name"),
    "principal without type": (
        {"principal": "alice"},
        "Could not parse principal from `alice` (no colon is present separating the "
        "principal type from the principal name)",
    ),
    "operation ANY": ({"operation": Op.ANY}, "Invalid operation ANY"),
    "operation UNKNOWN": ({"operation": Op.UNKNOWN}, "Invalid operation UNKNOWN"),
    "permission ANY": ({"permission_type": AclPermissionType.ANY}, "Invalid permissionType ANY"),
    "permission UNKNOWN": (
        {"permission_type": AclPermissionType.UNKNOWN},
        "Invalid permissionType UNKNOWN",
    ),
    "cluster by another name": (
        {"resource_type": CLUSTER, "resource_name": "my-cluster"},
        "The only valid name for the CLUSTER resource is kafka-cluster",
    ),
    "prefixed cluster by another name": (
        {"resource_type": CLUSTER, "resource_name": "kafka", "pattern_type": PREFIXED},
        "The only valid name for the CLUSTER resource is kafka-cluster",
    ),
    "valid: cluster": ({"resource_type": CLUSTER, "resource_name": "kafka-cluster"}, None),
    "valid: prefixed": ({"pattern_type": PREFIXED}, None),
    "valid: wildcard name and principal": ({"resource_name": "*", "principal": "User:*"}, None),
    "valid: deny ALL from a host": (
        {"operation": Op.ALL, "permission_type": DENY, "host": HOST},
        None,
    ),
    "valid: any principal type": ({"principal": "Group:ops"}, None),
}


@pytest.mark.parametrize(("changes", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_binding_error(changes: dict[str, object], message: str | None) -> None:
    fields = {
        "resource_type": VALID.resource_type,
        "resource_name": VALID.resource_name,
        "pattern_type": VALID.pattern_type,
        "principal": VALID.principal,
        "host": VALID.host,
        "operation": VALID.operation,
        "permission_type": VALID.permission_type,
        **changes,
    }
    binding = AclBinding(**fields)  # type: ignore[arg-type]
    assert binding_error(binding) == message
    if message is not None:
        with pytest.raises(ValueError, match=re.escape(message)):
            authorizer([binding])


STORED = [
    acl("orders", Op.READ),  # 0
    acl("*", Op.DESCRIBE, principal="User:*"),  # 1
    acl("ord", Op.WRITE, DENY, pattern=PREFIXED, principal="User:bob", host=HOST),  # 2
    acl("payments", Op.ALL),  # 3
    acl("orders", Op.READ, kind=GROUP),  # 4
    acl("orders", Op.READ, pattern=PREFIXED),  # 5
]
FILTERS = {
    "everything": (AclBindingFilter(), [0, 1, 2, 3, 4, 5]),
    "resource type": (AclBindingFilter(resource_type=TOPIC), [0, 1, 2, 3, 5]),
    "literal name": (AclBindingFilter(TOPIC, "orders", LITERAL), [0]),
    "prefixed name": (AclBindingFilter(TOPIC, "orders", PREFIXED), [5]),
    "ANY pattern: the exact name": (AclBindingFilter(resource_name="orders"), [0, 4, 5]),
    "MATCH: what applies to the name": (AclBindingFilter(TOPIC, "orders", MATCH), [0, 1, 2, 5]),
    "MATCH '*': the wildcard only": (AclBindingFilter(TOPIC, "*", MATCH), [1]),
    "MATCH without a name": (AclBindingFilter(pattern_type=MATCH), [0, 1, 2, 3, 4, 5]),
    "MATCH, no ACL applies": (AclBindingFilter(GROUP, "payments", MATCH), []),
    "principal User:* exactly": (AclBindingFilter(principal="User:*"), [1]),
    "principal": (AclBindingFilter(principal="User:alice"), [0, 3, 4, 5]),
    "host exactly": (AclBindingFilter(host=HOST), [2]),
    "host '*' exactly": (AclBindingFilter(host="*"), [0, 1, 3, 4, 5]),
    "operation READ: not ALL": (AclBindingFilter(operation=Op.READ), [0, 4, 5]),
    "operation ALL": (AclBindingFilter(operation=Op.ALL), [3]),
    "permission DENY": (AclBindingFilter(permission_type=DENY), [2]),
    "kafka-acls --list --topic orders --principal User:alice": (
        AclBindingFilter(TOPIC, "orders", MATCH, "User:alice", permission_type=ALLOW),
        [0, 5],
    ),
}


@pytest.mark.parametrize(("acl_filter", "expected"), FILTERS.values(), ids=FILTERS.keys())
def test_matching(acl_filter: AclBindingFilter, expected: list[int]) -> None:
    """DescribeAcls lists and DeleteAcls removes what ``matching`` returns."""
    assert filter_error(acl_filter) is None
    assert matching(acl_filter, STORED) == [STORED[i] for i in expected]


@pytest.mark.parametrize(
    ("acl_filter", "message"),
    [
        (AclBindingFilter(resource_type=ResourceType.UNKNOWN), "Unknown patternFilter."),
        (AclBindingFilter(pattern_type=PatternType.UNKNOWN), "Unknown patternFilter."),
        (AclBindingFilter(operation=Op.UNKNOWN), "Unknown entryFilter."),
        (AclBindingFilter(permission_type=AclPermissionType.UNKNOWN), "Unknown entryFilter."),
    ],
)
def test_filter_error(acl_filter: AclBindingFilter, message: str) -> None:
    assert filter_error(acl_filter) == message


def test_from_code() -> None:
    assert from_code(ResourceType, 2) is TOPIC
    assert from_code(ResourceType, 99) is ResourceType.UNKNOWN
    assert from_code(PatternType, -1) is PatternType.UNKNOWN
    assert from_code(Op, 13) is Op.CREATE_TOKENS
    assert from_code(Op, 42) is Op.UNKNOWN
    assert from_code(AclPermissionType, 3) is ALLOW


# --- properties: the index against a linear scan of the rules -------------------------------

IMPLIED_BY = {
    Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
    Op.DESCRIBE_CONFIGS: {Op.ALTER_CONFIGS},
}


def reference(
    bindings: list[AclBinding],
    allow_if_none: bool,
    principal: str,
    host: str,
    operation: Op,
    kind: ResourceType,
    name: str,
) -> bool:
    if principal == ADMIN:
        return True
    on_resource = [
        b
        for b in bindings
        if b.resource_type == kind
        and (
            (b.pattern_type == LITERAL and b.resource_name in (name, "*"))
            or (b.pattern_type == PREFIXED and name.startswith(b.resource_name))
        )
    ]
    if not on_resource:
        return allow_if_none
    applicable = [
        b for b in on_resource if b.principal in (principal, "User:*") and b.host in (host, "*")
    ]
    if any(b.permission_type == DENY and b.operation in (operation, Op.ALL) for b in applicable):
        return False
    granting = {operation, Op.ALL} | IMPLIED_BY.get(operation, set())
    return any(b.permission_type == ALLOW and b.operation in granting for b in applicable)


NAMES = st.text(alphabet="ab*", min_size=1, max_size=4)  # few letters: prefixes collide
CONCRETE_OPS = [op for op in Op if op not in (Op.UNKNOWN, Op.ANY)]
BINDINGS = st.builds(
    AclBinding,
    resource_type=st.sampled_from([TOPIC, GROUP]),
    resource_name=NAMES,
    pattern_type=st.sampled_from([LITERAL, PREFIXED]),
    principal=st.sampled_from(["User:alice", "User:bob", "User:*", "Group:ops", ADMIN]),
    host=st.sampled_from(["*", HOST, "10.0.0.2"]),
    operation=st.sampled_from(CONCRETE_OPS),
    permission_type=st.sampled_from([ALLOW, DENY]),
)
QUERIES = st.tuples(
    st.sampled_from(["User:alice", "User:bob", "Group:ops", ADMIN]),
    st.sampled_from([HOST, "10.0.0.2"]),
    st.sampled_from(CONCRETE_OPS),
    st.sampled_from([TOPIC, GROUP]),
    NAMES,
)
Query = tuple[str, str, Op, ResourceType, str]


@given(st.lists(BINDINGS, max_size=12), st.booleans(), st.lists(QUERIES, min_size=1, max_size=8))
def test_agrees_with_linear_scan(
    bindings: list[AclBinding], allow_if_none: bool, queries: list[Query]
) -> None:
    decider = authorizer(bindings, allow_if_none)
    for principal, host, operation, kind, name in queries:
        expected = reference(bindings, allow_if_none, principal, host, operation, kind, name)
        assert decider.authorize(principal, host, operation, kind, name) is expected
        granted = [
            op
            for op in SUPPORTED_OPERATIONS[kind]
            if reference(bindings, allow_if_none, principal, host, op, kind, name)
        ]
        assert decider.authorized_operations(principal, host, kind, name) == bits(*granted)
        on_resource = matching(AclBindingFilter(kind, name, MATCH), bindings)
        assert sorted(map(repr, decider.acls_on(kind, name))) == sorted(map(repr, on_resource))


@given(st.lists(BINDINGS, max_size=12), BINDINGS, st.booleans(), QUERIES)
def test_a_deny_never_grants(
    bindings: list[AclBinding], extra: AclBinding, allow_if_none: bool, query: Query
) -> None:
    deny = AclBinding(
        extra.resource_type,
        extra.resource_name,
        extra.pattern_type,
        extra.principal,
        extra.host,
        extra.operation,
        DENY,
    )
    before = authorizer(bindings, allow_if_none).authorize(*query)
    after = authorizer([*bindings, deny], allow_if_none).authorize(*query)
    assert after <= before
