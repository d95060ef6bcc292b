"""A KafscaleUser: its spec, what to do about its SCRAM credentials and ACLs as the brokers
describe them, and its status (docs/design/operator.md, section 5). Pure.

An ACL is a tuple ``(resource_type, name, pattern, operation, host, permission)`` with Kafka's
names (``TOPIC``, ``PREFIXED``, ``WRITE``, ``ALLOW``...), so spec and description compare as
sets. The password never leaves this module except to the admin call: the status holds a digest
of user, mechanism, iterations and password, which tells a changed password without keeping it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from kafscale.operator.model import SpecError

USER_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")
MECHANISMS = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}
RESOURCE_TYPES = {
    "topic": "TOPIC",
    "group": "GROUP",
    "cluster": "BROKER",  # librdkafka names Kafka's CLUSTER resource type (4) BROKER
    "transactionalId": "TRANSACTIONAL_ID",
}
OPERATIONS = {
    "All": "ALL",
    "Read": "READ",
    "Write": "WRITE",
    "Create": "CREATE",
    "Delete": "DELETE",
    "Alter": "ALTER",
    "Describe": "DESCRIBE",
    "ClusterAction": "CLUSTER_ACTION",
    "DescribeConfigs": "DESCRIBE_CONFIGS",
    "AlterConfigs": "ALTER_CONFIGS",
    "IdempotentWrite": "IDEMPOTENT_WRITE",
}
CLUSTER_RESOURCE = "kafka-cluster"

Acl = tuple[
    str, str, str, str, str, str
]  # resource type, name, pattern, operation, host, permission


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


@dataclass(frozen=True)
class UserSpec:
    cluster: str
    name: str
    mechanism: str  # SCRAM-SHA-512 | SCRAM-SHA-256
    iterations: int
    password_secret: SecretRef | None
    acls: frozenset[Acl]

    @property
    def principal(self) -> str:
        return f"User:{self.name}"


def parse_user(resource: dict[str, Any]) -> UserSpec:
    meta = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    cluster = spec.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise SpecError("spec.cluster: the KafscaleCluster's name is required")
    name = spec.get("userName") or meta.get("name", "")
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise SpecError(f"spec.userName: {name!r} is not a valid user name")
    authentication = spec.get("authentication") or {}
    kind = authentication.get("type", "scram-sha-512")
    if kind not in MECHANISMS:
        raise SpecError(f"spec.authentication.type: {kind!r} is not scram-sha-512 or scram-sha-256")
    iterations = authentication.get("iterations", 4096)
    if not isinstance(iterations, int) or not 4096 <= iterations <= 16384:
        raise SpecError("spec.authentication.iterations: between 4096 and 16384, as Kafka's")
    secret = authentication.get("passwordSecret")
    ref = None
    if secret is not None:
        if not isinstance(secret, dict) or not secret.get("name"):
            raise SpecError("spec.authentication.passwordSecret.name: required")
        ref = SecretRef(str(secret["name"]), str(secret.get("key") or "password"))
    acls: set[Acl] = set()
    rules = (spec.get("authorization") or {}).get("acls") or []
    for index, rule in enumerate(rules):
        acls.update(_acls(rule, f"spec.authorization.acls[{index}]"))
    return UserSpec(cluster, name, MECHANISMS[kind], iterations, ref, frozenset(acls))


def _acls(rule: dict[str, Any], where: str) -> list[Acl]:
    resource = rule.get("resource") or {}
    kind = resource.get("type")
    if kind not in RESOURCE_TYPES:
        raise SpecError(f"{where}.resource.type: {kind!r} is not one of {sorted(RESOURCE_TYPES)}")
    if kind == "cluster":
        name = CLUSTER_RESOURCE
    else:
        given = resource.get("name")
        if not isinstance(given, str) or not given:
            raise SpecError(f"{where}.resource.name: required for a {kind} ACL")
        name = given
    pattern = {"literal": "LITERAL", "prefix": "PREFIXED"}.get(
        resource.get("patternType", "literal")
    )
    if pattern is None:
        raise SpecError(f"{where}.resource.patternType: literal or prefix")
    permission = {"allow": "ALLOW", "deny": "DENY"}.get(rule.get("type", "allow"))
    if permission is None:
        raise SpecError(f"{where}.type: allow or deny")
    host = rule.get("host") or "*"
    operations = rule.get("operations") or []
    if not operations:
        raise SpecError(f"{where}.operations: at least one")
    out: list[Acl] = []
    for operation in operations:
        if operation not in OPERATIONS:
            raise SpecError(f"{where}.operations: {operation!r} is not one of {sorted(OPERATIONS)}")
        out.append(
            (RESOURCE_TYPES[kind], name, pattern, OPERATIONS[operation], str(host), permission)
        )
    return out


def credential_digest(name: str, mechanism: str, iterations: int, password: str) -> str:
    """What the status keeps of a credential: enough to tell that it changed, not to guess it
    (a SHA-256 over the user name too, so equal passwords of two users differ)."""
    text = "\0".join((name, mechanism, str(iterations), password))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Plan:
    upsert: bool  # store the credential of spec.mechanism (with the password)
    delete_mechanisms: tuple[str, ...]  # the user's credentials of other mechanisms
    create_acls: tuple[Acl, ...]
    delete_acls: tuple[Acl, ...]
    digest: str


def plan(
    spec: UserSpec,
    password: str,
    previous_digest: str,
    observed_mechanisms: set[str],
    observed_acls: set[Acl],
) -> Plan:
    digest = credential_digest(spec.name, spec.mechanism, spec.iterations, password)
    upsert = digest != previous_digest or spec.mechanism not in observed_mechanisms
    others = tuple(sorted(m for m in observed_mechanisms if m != spec.mechanism))
    return Plan(
        upsert=upsert,
        delete_mechanisms=others,
        create_acls=tuple(sorted(spec.acls - observed_acls)),
        delete_acls=tuple(sorted(observed_acls - spec.acls)),
        digest=digest,
    )


@dataclass(frozen=True)
class UserStatus:
    user_name: str
    mechanism: str
    credential_digest: str
    acls: int
    ready: bool
    reason: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "userName": self.user_name,
            "mechanism": self.mechanism,
            "credentialDigest": self.credential_digest,
            "acls": self.acls,
        }
