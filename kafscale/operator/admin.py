"""The operator's Kafka admin I/O (docs/design/operator.md, section 5): confluent-kafka's
AdminClient, connected to a cluster as its admin, carrying out what `topics.plan` and
`users.plan` decide. Each call runs in a thread (the client's futures block) with the
connection's timeout; every failure is an `AdminError` whose message names what failed (never a
password).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kafscale.operator import topics, users


@dataclass(frozen=True)
class Connection:
    bootstrap: str  # host:port, address-mapped
    security_protocol: str  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None
    username: str | None
    password: str | None
    ca_pem: bytes | None  # the CA to trust for TLS
    timeout: float = 30.0


class AdminError(Exception):
    """An admin call failed; ``retriable``: trying again later may succeed."""

    def __init__(self, message: str, retriable: bool = True, code: str = "") -> None:
        super().__init__(message)
        self.retriable = retriable
        self.code = code


@contextlib.contextmanager
def _client(conn: Connection) -> Iterator[AdminClient]:
    config: dict[str, Any] = {
        "bootstrap.servers": conn.bootstrap,
        "security.protocol": conn.security_protocol.lower(),
        "socket.timeout.ms": int(conn.timeout * 1000),
        "client.id": "kafscale-operator",
    }
    if conn.sasl_mechanism:
        config["sasl.mechanisms"] = conn.sasl_mechanism
        config["sasl.username"] = conn.username or ""
        config["sasl.password"] = conn.password or ""
    ca_path = None
    if conn.ca_pem:
        # librdkafka reads a CA from a file: a private one, removed after.
        handle, ca_path = tempfile.mkstemp(prefix="kafscale-operator-ca-", suffix=".pem")
        with os.fdopen(handle, "wb") as out:
            out.write(conn.ca_pem)
        config["ssl.ca.location"] = ca_path
    try:
        yield AdminClient(config)
    finally:
        if ca_path is not None:
            os.unlink(ca_path)


def _error(what: str, exc: BaseException) -> AdminError:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        error: KafkaError = exc.args[0]
        return AdminError(
            f"{what}: {error.name()}: {error.str()}", bool(error.retriable()), error.name()
        )
    return AdminError(f"{what}: {exc}")


def _wait(future: Future[Any], what: str, timeout: float) -> Any:
    try:
        return future.result(timeout=timeout)
    except TimeoutError:
        raise AdminError(f"{what}: no answer in {timeout:g} s") from None
    except KafkaException as exc:
        raise _error(what, exc) from None


# --- topics --------------------------------------------------------------------------------


def _describe_topic(
    client: AdminClient, name: str, timeout: float
) -> tuple[str, list[tuple[int, int]]] | None:
    """(topic id, [(partition, leader)]) or None when the topic does not exist."""
    futures = client.describe_topics(TopicCollection([name]), request_timeout=timeout)
    try:
        description = futures[name].result(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise _error(f"describing topic {name}", exc) from None
    except TimeoutError:
        raise AdminError(f"describing topic {name}: no answer in {timeout:g} s") from None
    partitions = [
        (p.id, p.leader.id if p.leader is not None else -1) for p in description.partitions
    ]
    return str(description.topic_id), sorted(partitions)


def _topic_configs(client: AdminClient, name: str, timeout: float) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    (future,) = client.describe_configs([resource], request_timeout=timeout).values()
    entries: dict[str, ConfigEntry] = _wait(future, f"describing topic {name}'s configs", timeout)
    return {
        key: str(entry.value)
        for key, entry in entries.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
    }


def _offsets(
    client: AdminClient, name: str, partitions: list[int], timeout: float
) -> dict[int, tuple[int, int]]:
    """partition -> (log start offset, high watermark)."""
    out: dict[int, list[int]] = {p: [-1, -1] for p in partitions}
    for index, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        futures = client.list_offsets(
            {TopicPartition(name, p): spec for p in partitions}, request_timeout=timeout
        )
        for tp, future in futures.items():
            out[tp.partition][index] = int(_wait(future, f"offsets of {name}", timeout).offset)
    return {p: (start, end) for p, (start, end) in out.items()}


def _reconcile_topic(conn: Connection, spec: topics.TopicSpec) -> topics.TopicStatus:
    timeout = conn.timeout
    with _client(conn) as client:
        found = _describe_topic(client, spec.name, timeout)
        observed = None
        if found is not None:
            observed = topics.ObservedTopic(
                len(found[1]), _topic_configs(client, spec.name, timeout)
            )
        todo = topics.plan(spec, observed)
        if todo.create:
            new = NewTopic(spec.name, spec.partitions, config=dict(spec.configs))
            (future,) = client.create_topics([new], request_timeout=timeout).values()
            try:
                _wait(future, f"creating topic {spec.name}", timeout)
            except AdminError as exc:
                if exc.code != "TOPIC_ALREADY_EXISTS":
                    raise
        if todo.add_partitions_to is not None:
            grow = NewPartitions(spec.name, todo.add_partitions_to)
            (future,) = client.create_partitions([grow], request_timeout=timeout).values()
            _wait(future, f"adding partitions to {spec.name}", timeout)
        if todo.set_configs or todo.delete_configs:
            entries = [
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in todo.set_configs.items()
            ] + [
                ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
                for k in todo.delete_configs
            ]
            resource = ConfigResource(ResourceType.TOPIC, spec.name, incremental_configs=entries)
            (future,) = client.incremental_alter_configs(
                [resource], request_timeout=timeout
            ).values()
            _wait(future, f"altering topic {spec.name}'s configs", timeout)
        found = _describe_topic(client, spec.name, timeout)
        if found is None:
            raise AdminError(f"topic {spec.name} is not described after its creation")
        topic_id, leaders = found
        offsets = _offsets(client, spec.name, [p for p, _ in leaders], timeout)
        states = tuple(
            topics.PartitionState(p, leader, offsets[p][1], offsets[p][0]) for p, leader in leaders
        )
        return topics.status(spec, topic_id, states, todo)


async def reconcile_topic(conn: Connection, spec: topics.TopicSpec) -> topics.TopicStatus:
    return await asyncio.to_thread(_reconcile_topic, conn, spec)


def _delete_topic(conn: Connection, name: str) -> None:
    with _client(conn) as client:
        (future,) = client.delete_topics([name], request_timeout=conn.timeout).values()
        try:
            _wait(future, f"deleting topic {name}", conn.timeout)
        except AdminError as exc:
            if exc.code != "UNKNOWN_TOPIC_OR_PART":
                raise


async def delete_topic(conn: Connection, name: str) -> None:
    await asyncio.to_thread(_delete_topic, conn, name)


# --- users ---------------------------------------------------------------------------------

_MECHANISMS = {
    "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
    "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
}
_MECHANISM_NAMES = {value: key for key, value in _MECHANISMS.items()}


def _principal_filter(principal: str) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def _binding(principal: str, acl: users.Acl) -> AclBinding:
    kind, name, pattern, operation, host, permission = acl
    return AclBinding(
        ResourceType[kind],
        name,
        ResourcePatternType[pattern],
        principal,
        host,
        AclOperation[operation],
        AclPermissionType[permission],
    )


def _as_acl(binding: AclBinding) -> users.Acl:
    return (
        binding.restype.name,
        binding.name,
        binding.resource_pattern_type.name,
        binding.operation.name,
        binding.host,
        binding.permission_type.name,
    )


def _mechanisms(client: AdminClient, name: str, timeout: float) -> set[str]:
    future = client.describe_user_scram_credentials([name], request_timeout=timeout)
    futures = future if isinstance(future, dict) else {name: future}
    try:
        description = futures[name].result(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.RESOURCE_NOT_FOUND:
            return set()
        raise _error(f"describing user {name}'s credentials", exc) from None
    except TimeoutError:
        raise AdminError(f"describing user {name}: no answer in {timeout:g} s") from None
    return {
        _MECHANISM_NAMES[info.mechanism]
        for info in description.scram_credential_infos
        if info.mechanism in _MECHANISM_NAMES
    }


def _acls_of(client: AdminClient, principal: str, timeout: float) -> set[users.Acl] | None:
    """The principal's ACLs; None when the cluster has no authorizer."""
    future = client.describe_acls(_principal_filter(principal), request_timeout=timeout)
    try:
        found = _wait(future, f"listing the ACLs of {principal}", timeout)
    except AdminError as exc:
        if exc.code == "SECURITY_DISABLED":
            return None
        raise
    return {_as_acl(binding) for binding in found}


def _reconcile_user(
    conn: Connection, spec: users.UserSpec, password: str, previous_digest: str
) -> users.UserStatus:
    timeout = conn.timeout
    with _client(conn) as client:
        mechanisms = _mechanisms(client, spec.name, timeout)
        acls = _acls_of(client, spec.principal, timeout)
        todo = users.plan(spec, password, previous_digest, mechanisms, acls or set())
        alterations: list[Any] = []
        if todo.upsert:
            info = ScramCredentialInfo(_MECHANISMS[spec.mechanism], spec.iterations)
            alterations.append(UserScramCredentialUpsertion(spec.name, info, password.encode()))
        alterations += [
            UserScramCredentialDeletion(spec.name, _MECHANISMS[m]) for m in todo.delete_mechanisms
        ]
        if alterations:
            for future in client.alter_user_scram_credentials(
                alterations, request_timeout=timeout
            ).values():
                _wait(future, f"storing user {spec.name}'s credentials", timeout)
        if acls is None:
            ready = not spec.acls
            return users.UserStatus(
                spec.name,
                spec.mechanism,
                todo.digest,
                0,
                ready,
                "Reconciled" if ready else "AuthorizationNotEnabled",
                "credentials stored"
                if ready
                else "credentials stored; the cluster has no authorizer for the ACLs "
                "(spec.brokers.authorization.type: acl)",
            )
        if todo.create_acls:
            bindings = [_binding(spec.principal, acl) for acl in todo.create_acls]
            for future in client.create_acls(bindings, request_timeout=timeout).values():
                _wait(future, f"creating ACLs of {spec.principal}", timeout)
        for acl in todo.delete_acls:
            kind, name, pattern, operation, host, permission = acl
            exact = AclBindingFilter(
                ResourceType[kind],
                name,
                ResourcePatternType[pattern],
                spec.principal,
                host,
                AclOperation[operation],
                AclPermissionType[permission],
            )
            for future in client.delete_acls([exact], request_timeout=timeout).values():
                _wait(future, f"deleting an ACL of {spec.principal}", timeout)
        return users.UserStatus(
            spec.name,
            spec.mechanism,
            todo.digest,
            len(spec.acls),
            True,
            "Reconciled",
            f"credentials stored, {len(spec.acls)} ACLs",
        )


async def reconcile_user(
    conn: Connection, spec: users.UserSpec, password: str, previous_digest: str
) -> users.UserStatus:
    return await asyncio.to_thread(_reconcile_user, conn, spec, password, previous_digest)


def _delete_user(conn: Connection, name: str) -> None:
    timeout = conn.timeout
    with _client(conn) as client:
        mechanisms = _mechanisms(client, name, timeout)
        if mechanisms:
            deletions = [UserScramCredentialDeletion(name, _MECHANISMS[m]) for m in mechanisms]
            for future in client.alter_user_scram_credentials(
                deletions, request_timeout=timeout
            ).values():
                _wait(future, f"deleting user {name}'s credentials", timeout)
        future = client.delete_acls([_principal_filter(f"User:{name}")], request_timeout=timeout)
        for each in future.values():
            try:
                _wait(each, f"deleting the ACLs of User:{name}", timeout)
            except AdminError as exc:
                if exc.code != "SECURITY_DISABLED":
                    raise


async def delete_user(conn: Connection, name: str) -> None:
    await asyncio.to_thread(_delete_user, conn, name)
