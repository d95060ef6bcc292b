"""A KafscaleUser: its spec, what to do about its SCRAM credentials and ACLs as the brokers
describe them, and its status (docs/design/operator.md, section 5). Pure.

An ACL is a tuple ``(resource_type, name, pattern, operation, host, permission)`` with Kafka's
names (``TOPIC``, ``PREFIXED``, ``WRITE``, ``ALLOW``...), so spec and description compare as
sets. The password never leaves this module except to the admin call: the status holds a digest
of user, mechanism, iterations and password, which tells a changed password without keeping it.

A cluster without a SASL listener gets nothing stored (``AuthenticationNotEnabled``); one
without an authorizer gets the credentials but not the ACLs (``AuthorizationNotEnabled``):
`features` reads both from a broker's configs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
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
PATTERN_TYPES = {"literal": "LITERAL", "prefix": "PREFIXED"}
PERMISSIONS = {"allow": "ALLOW", "deny": "DENY"}
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
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        raise SpecError(f"spec.userName: {name!r} is not a valid user name")
    authentication = spec.get("authentication") or {}
    kind = authentication.get("type", "scram-sha-512")
    if not isinstance(kind, str) or kind not in MECHANISMS:
        raise SpecError(f"spec.authentication.type: {kind!r} is not scram-sha-512 or scram-sha-256")
    iterations = authentication.get("iterations", 4096)
    if (
        not isinstance(iterations, int)
        or isinstance(iterations, bool)
        or not 4096 <= iterations <= 16384
    ):
        raise SpecError("spec.authentication.iterations: between 4096 and 16384, as Kafka's")
    secret = authentication.get("passwordSecret")
    ref = None
    if secret is not None:
        if not isinstance(secret, dict) or not secret.get("name"):
            raise SpecError("spec.authentication.passwordSecret.name: required")
        ref = SecretRef(str(secret["name"]), str(secret.get("key") or "password"))
    acls: set[Acl] = set()
    rules = (spec.get("authorization") or {}).get("acls") or []
    if not isinstance(rules, list):
        raise SpecError("spec.authorization.acls: a list of ACL rules")
    for index, rule in enumerate(rules):
        acls.update(_acls(rule, f"spec.authorization.acls[{index}]"))
    return UserSpec(cluster, name, MECHANISMS[kind], iterations, ref, frozenset(acls))


def _choice(value: object, choices: dict[str, str]) -> str | None:
    return choices.get(value) if isinstance(value, str) else None


def _acls(rule: object, where: str) -> list[Acl]:
    """One rule of the spec: an ACL per operation."""
    if not isinstance(rule, dict):
        raise SpecError(f"{where}: an object with resource and operations")
    resource = rule.get("resource") or {}
    kind = resource.get("type")
    resource_type = _choice(kind, RESOURCE_TYPES)
    if resource_type is None:
        raise SpecError(f"{where}.resource.type: {kind!r} is not one of {sorted(RESOURCE_TYPES)}")
    pattern = _choice(resource.get("patternType", "literal"), PATTERN_TYPES)
    if pattern is None:
        raise SpecError(f"{where}.resource.patternType: literal or prefix")
    if kind == "cluster":
        # Kafka has one cluster resource, named kafka-cluster, matched literally.
        if pattern != "LITERAL":
            raise SpecError(f"{where}.resource.patternType: a cluster ACL is literal")
        name = CLUSTER_RESOURCE
    else:
        given = resource.get("name")
        if not isinstance(given, str) or not given:
            raise SpecError(f"{where}.resource.name: required for a {kind} ACL")
        name = given
    permission = _choice(rule.get("type", "allow"), PERMISSIONS)
    if permission is None:
        raise SpecError(f"{where}.type: allow or deny")
    host = rule.get("host") or "*"
    if not isinstance(host, str):
        raise SpecError(f"{where}.host: an address or *")
    operations = rule.get("operations") or []
    if not isinstance(operations, list) or not operations:
        raise SpecError(f"{where}.operations: a list of at least one operation")
    out: list[Acl] = []
    for operation in operations:
        kafka_operation = _choice(operation, OPERATIONS)
        if kafka_operation is None:
            raise SpecError(f"{where}.operations: {operation!r} is not one of {sorted(OPERATIONS)}")
        out.append((resource_type, name, pattern, kafka_operation, host, permission))
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


@dataclass(frozen=True)
class Features:
    """What the cluster's brokers say of their security (their broker configs)."""

    sasl: bool  # some listener authenticates with SASL: SCRAM users can log in
    authorizer: bool | None  # ACLs are enforced; None: the brokers did not say
    listeners: str  # listener.security.protocol.map as described ("" if not), for messages


def features(broker_configs: Mapping[str, str] | None, connected_with_sasl: bool) -> Features:
    """From a broker's described configs (None: they could not be read) and whether the
    operator itself authenticated with SASL.

    KafScale answers the SCRAM APIs with or without a SASL listener (the credentials are only
    stored), so SASL is told by ``listener.security.protocol.map``. The authorizer by
    ``kafscale.authorizer`` (KAFSCALE_AUTHORIZER, ``acl`` or ``none``), or Kafka's
    ``authorizer.class.name`` (empty: none).
    """
    configs = broker_configs or {}
    listeners = configs.get("listener.security.protocol.map") or ""
    protocols = [entry.partition(":")[2].strip().upper() for entry in listeners.split(",")]
    sasl = connected_with_sasl or any(p.startswith("SASL_") for p in protocols)
    authorizer: bool | None = None
    if "kafscale.authorizer" in configs:
        authorizer = configs["kafscale.authorizer"] == "acl"
    elif "authorizer.class.name" in configs:
        authorizer = bool(configs["authorizer.class.name"].strip())
    return Features(sasl, authorizer, listeners)


def authentication_not_enabled(spec: UserSpec, found: Features) -> UserStatus:
    """The status of a user of a cluster without SASL: nothing is stored (a credential no
    listener asks for would only look like a working user)."""
    where = f" (listener.security.protocol.map: {found.listeners})" if found.listeners else ""
    return UserStatus(
        spec.name,
        spec.mechanism,
        "",
        0,
        False,
        "AuthenticationNotEnabled",
        f"the cluster has no SASL listener{where}: SCRAM users cannot authenticate",
    )


def status(spec: UserSpec, done: Plan, authorizer: bool) -> UserStatus:
    """The status after ``done`` was carried out; ``authorizer``: whether the cluster enforces
    ACLs (without one, ACLs were neither described nor written)."""
    stored = "credentials stored" if done.upsert else "credentials up to date"
    stored += f" ({spec.mechanism})"
    if authorizer:
        count = len(spec.acls)
        return UserStatus(
            spec.name,
            spec.mechanism,
            done.digest,
            count,
            True,
            "Reconciled",
            f"{stored}, {count} ACLs",
        )
    if not spec.acls:
        return UserStatus(spec.name, spec.mechanism, done.digest, 0, True, "Reconciled", stored)
    return UserStatus(
        spec.name,
        spec.mechanism,
        done.digest,
        0,
        False,
        "AuthorizationNotEnabled",
        f"{stored}; the cluster enforces no ACLs (its spec.brokers.authorization.type is not "
        f"acl): the {len(spec.acls)} ACLs are not applied",
    )
