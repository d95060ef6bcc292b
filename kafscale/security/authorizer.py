"""ACL decisions with Apache Kafka's semantics (StandardAuthorizer; KIP-11, KIP-290, KIP-430).

Pure: bindings in, decisions out. No I/O, no clock, no store: whoever holds the ACLs builds a
new ``Authorizer`` when they change, and a request asks the one it started with.

``Authorizer.authorize`` decides as Kafka's ``StandardAuthorizerData.authorize``:

- a principal named in ``super_users`` ("User:admin") may do anything;
- an ACL is on a resource when the resource type is the same and its pattern is the name itself
  (LITERAL), the wildcard (LITERAL "*") or a prefix of the name (PREFIXED, KIP-290);
- it applies to a request when its principal is the caller's or "User:*" and its host is the
  caller's address or "*" (compared as strings: the caller passes the peer address as text);
- an applicable DENY of the operation or of ALL wins over every ALLOW. A DENY implies nothing
  else: DENY READ does not deny DESCRIBE;
- an applicable ALLOW of the operation or of ALL grants it; ALLOW of READ, WRITE, DELETE or
  ALTER also grants DESCRIBE, and ALLOW of ALTER_CONFIGS grants DESCRIBE_CONFIGS;
- no ACL on the resource at all, for anyone: ``allow_if_no_acl_found`` (Kafka's
  allow.everyone.if.no.acl.found). ACLs for others only: denied.

``binding_error`` says why a CreateAcls binding is refused (INVALID_REQUEST); ``AclBindingFilter``
and ``matching`` select bindings for DescribeAcls and DeleteAcls as Kafka's filters do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from kafscale.protocol.acls import AclOperation

WILDCARD = "*"  # a resource name or host that matches any
WILDCARD_PRINCIPAL = "User:*"  # matches every principal, of any type ("Group:*" is a plain name)
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: any pattern type, the name compared exactly
    MATCH = 2  # filters only: every pattern that would apply to the name
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


_Code = TypeVar("_Code", ResourceType, PatternType, AclOperation, AclPermissionType)


def from_code(kind: type[_Code], code: int) -> _Code:
    """The member for a wire code; a code this broker does not know reads as UNKNOWN, as
    Kafka's ``fromCode`` (so it is refused by validation rather than by a decode error)."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


#: Kafka's ``AclEntry.supportedOperations``: what KIP-430's authorized operations range over.
SUPPORTED_OPERATIONS: Mapping[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({AclOperation.DESCRIBE, AclOperation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({AclOperation.DESCRIBE}),
    ResourceType.USER: frozenset({AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS}),
}


def _granted_by(operation: AclOperation) -> frozenset[AclOperation]:
    """The operations whose ALLOW grants ``operation`` (StandardAuthorizerData.findResult)."""
    if operation is AclOperation.DESCRIBE:
        implied = {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    elif operation is AclOperation.DESCRIBE_CONFIGS:
        implied = {AclOperation.ALTER_CONFIGS}
    else:
        implied = set()
    return frozenset({operation, AclOperation.ALL, *implied})


_GRANTED_BY = {operation: _granted_by(operation) for operation in AclOperation}


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry, as CreateAcls carries it."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str  # "Type:name", e.g. "User:alice"; "User:*" for anyone
    host: str  # an address as text, or "*"
    operation: AclOperation
    permission_type: AclPermissionType


def binding_from_codes(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission_type: int,
) -> AclBinding:
    """A binding from the wire's (and the store's) codes; unknown codes read as UNKNOWN."""
    return AclBinding(
        from_code(ResourceType, resource_type),
        resource_name,
        from_code(PatternType, pattern_type),
        principal,
        host,
        from_code(AclOperation, operation),
        from_code(AclPermissionType, permission_type),
    )


def binding_error(binding: AclBinding) -> str | None:
    """Why CreateAcls refuses ``binding`` (INVALID_REQUEST), in Kafka's words and order
    (AclApis.handleCreateAcls, then AclControlManager.validateNewAcl); None if it is valid."""
    if binding.resource_type == ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not binding.resource_name:
        return "Invalid empty resource name"
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {binding.operation.name}"
    if binding.permission_type not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return f"Invalid permissionType {binding.permission_type.name}"
    if ":" not in binding.principal:
        return (
            f"Could not parse principal from `{binding.principal}` (no colon is present "
            "separating the principal type from the principal name)"
        )
    return None


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings DescribeAcls lists and DeleteAcls removes. ANY, or None for the strings,
    matches every value of that field; other values match exactly, except ``PatternType.MATCH``
    (see ``matches``). Principal and host are compared exactly: "User:*" matches only "User:*"."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        """Kafka's ``AclBindingFilter.matches``: the pattern and the entry both match."""
        return self._matches_pattern(binding) and self._matches_entry(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        # ResourcePatternFilter.matches
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        pattern_type = self.pattern_type
        if pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
            return False
        name = self.resource_name
        if name is None:
            return True
        if pattern_type != PatternType.MATCH:
            return name == binding.resource_name
        # MATCH: the bindings that would apply to a resource called ``name``.
        if binding.pattern_type == PatternType.PREFIXED:
            return name.startswith(binding.resource_name)
        return binding.resource_name in (name, WILDCARD)

    def _matches_entry(self, binding: AclBinding) -> bool:
        # AccessControlEntryFilter.matches
        return (
            self.principal in (None, binding.principal)
            and self.host in (None, binding.host)
            and self.operation in (AclOperation.ANY, binding.operation)
            and self.permission_type in (AclPermissionType.ANY, binding.permission_type)
        )


def filter_error(acl_filter: AclBindingFilter) -> str | None:
    """Why DescribeAcls or DeleteAcls refuses a filter (INVALID_REQUEST), as Kafka's
    AclControlManager.validateFilter; None if it is usable."""
    # Kafka's filter has two halves: a ResourcePatternFilter and an AccessControlEntryFilter.
    if acl_filter.resource_type == ResourceType.UNKNOWN or (
        acl_filter.pattern_type == PatternType.UNKNOWN
    ):
        return "Unknown patternFilter."
    if acl_filter.operation == AclOperation.UNKNOWN or (
        acl_filter.permission_type == AclPermissionType.UNKNOWN
    ):
        return "Unknown entryFilter."
    return None


def matching(acl_filter: AclBindingFilter, bindings: Iterable[AclBinding]) -> list[AclBinding]:
    """The bindings ``acl_filter`` selects, in the order given."""
    return [binding for binding in bindings if acl_filter.matches(binding)]


def _bits(operations: Iterable[AclOperation]) -> int:
    return sum(1 << operation for operation in operations)


def _allowed(
    acls: Iterable[AclBinding], principal: str, host: str, operation: AclOperation
) -> bool:
    """The decision once the resource has ACLs: ``acls`` are all on the resource."""
    granted_by = _GRANTED_BY[operation]
    allowed = False
    for acl in acls:
        if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
            continue
        if acl.host != host and acl.host != WILDCARD:
            continue
        if acl.permission_type == AclPermissionType.DENY:
            if acl.operation in (operation, AclOperation.ALL):
                return False  # deny wins: no need to look further
        elif acl.operation in granted_by:
            allowed = True
    return allowed


class Authorizer:
    """The ACLs of a cluster, indexed for per-request decisions. Immutable once built.

    Index: literal bindings by (resource type, name), "*" included; prefixed bindings by
    (resource type, prefix), with the distinct prefix lengths in use per resource type. The ACLs
    on a resource are then found in O(P + A) dict lookups and steps, where P is the number of
    distinct prefix lengths of that resource type (at most the longest name, 249 for a topic)
    and A the number of ACLs found -- never a scan of every binding.
    """

    def __init__(
        self,
        bindings: Iterable[AclBinding],
        super_users: frozenset[str],
        allow_if_no_acl_found: bool = False,
    ) -> None:
        """Raises ValueError for a binding ``binding_error`` refuses: the store keeps only
        bindings CreateAcls accepted, so one that is not is a bug to hear about."""
        self.super_users = super_users
        self.allow_if_no_acl_found = allow_if_no_acl_found
        literal: defaultdict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        prefixed: defaultdict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        lengths: defaultdict[ResourceType, set[int]] = defaultdict(set)
        for binding in bindings:
            error = binding_error(binding)
            if error is not None:
                raise ValueError(f"{binding}: {error}")
            key = (binding.resource_type, binding.resource_name)
            if binding.pattern_type == PatternType.LITERAL:
                literal[key].append(binding)
            else:
                prefixed[key].append(binding)
                lengths[binding.resource_type].add(len(binding.resource_name))
        self._literal = {key: tuple(acls) for key, acls in literal.items()}
        self._prefixed = {key: tuple(acls) for key, acls in prefixed.items()}
        self._prefix_lengths = {kind: sorted(sizes) for kind, sizes in lengths.items()}

    def acls_on(self, resource_type: ResourceType, resource_name: str) -> list[AclBinding]:
        """Every binding on the resource, for any principal, host and operation."""
        if resource_type not in SUPPORTED_OPERATIONS:
            raise ValueError(f"not a concrete resource type: {resource_type!r}")
        acls = list(self._literal.get((resource_type, resource_name), ()))
        if resource_name != WILDCARD:
            acls += self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(resource_name):
                break  # sorted: the rest are longer than the name
            acls += self._prefixed.get((resource_type, resource_name[:length]), ())
        return acls

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        """May ``principal``, connected from ``host``, do ``operation`` on the resource?"""
        if principal in self.super_users:
            return True
        acls = self.acls_on(resource_type, resource_name)
        if not acls:
            return self.allow_if_no_acl_found
        return _allowed(acls, principal, host, operation)

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, resource_name: str
    ) -> int:
        """KIP-430's bit field (bit ``1 << code``) of the operations ``resource_type`` supports
        that ``authorize`` would grant, as Kafka's AuthHelper.authorizedOperations."""
        supported = SUPPORTED_OPERATIONS.get(resource_type)
        if supported is None:
            raise ValueError(f"not a concrete resource type: {resource_type!r}")
        if principal in self.super_users:
            return _bits(supported)
        acls = self.acls_on(resource_type, resource_name)
        if not acls:
            return _bits(supported) if self.allow_if_no_acl_found else 0
        return _bits(op for op in supported if _allowed(acls, principal, host, op))
