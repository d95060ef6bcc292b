"""ACL operation codes (``AclOperation``) and KIP-430's authorized-operations bit fields: every
operation a resource type supports (what Kafka reports without an authorizer), and
``NOT_REQUESTED`` for requests that do not ask (``kafscale.frontend.authz`` decides the rest)."""

from __future__ import annotations

from enum import IntEnum


class AclOperation(IntEnum):
    UNKNOWN = 0  # a code this broker does not know
    ANY = 1  # filters only (DescribeAcls, DeleteAcls)
    ALL = 2  # in an ACL: every operation
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


def _bits(*operations: AclOperation) -> int:
    return sum(1 << operation for operation in operations)


NOT_REQUESTED = -(2**31)  # Kafka's Integer.MIN_VALUE: "not included"
# AclEntry.supportedOperations(CLUSTER) and (TOPIC) in Kafka.
CLUSTER_OPERATIONS = _bits(
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
)
TOPIC_OPERATIONS = _bits(
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
)
