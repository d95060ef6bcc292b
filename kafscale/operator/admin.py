"""The operator's Kafka admin I/O (docs/design/operator.md, section 5): confluent-kafka's
AdminClient, connected to a cluster as its admin, describing what `topics.plan` and `users.plan`
decide from and carrying out what they return.

One client per reconcile (`_Session`, a `kafscale.kafka_admin.Session`: bounded waits, failures
as `AdminError`), run in a thread (the client's futures block).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
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
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kafscale.kafka_admin import (
    MECHANISM_NAMES,
    MECHANISMS,
    POLL_INTERVAL,
    AdminError,
    Connection,
    Session,
    broker_answered,
)
from kafscale.operator import topics, users

log = logging.getLogger("kafscale.operator.admin")


class _Session(Session):
    """One AdminClient, used for one reconcile and dropped with the session."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn, client_id="kafscale-operator")

    # --- topics ----------------------------------------------------------------------------

    def describe_topic(self, name: str) -> tuple[str, list[tuple[int, int]]] | None:
        """(topic id, [(partition, leader)]) or None when the topic does not exist."""
        futures = self.client.describe_topics(TopicCollection([name]), request_timeout=self.timeout)
        try:
            description = self.wait(futures[name], f"describing topic {name}")
        except AdminError as exc:
            if exc.code == "UNKNOWN_TOPIC_OR_PART":
                return None
            raise
        partitions = [
            (p.id, p.leader.id if p.leader is not None else -1) for p in description.partitions
        ]
        return str(description.topic_id), sorted(partitions)

    def topic_configs(self, name: str) -> dict[str, str]:
        """The configs set on the topic itself, not those it inherits."""
        resource = ConfigResource(ResourceType.TOPIC, name)
        (future,) = self.client.describe_configs([resource], request_timeout=self.timeout).values()
        entries: dict[str, ConfigEntry] = self.wait(future, f"describing topic {name}'s configs")
        own = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        return {
            key: str(entry.value)
            for key, entry in entries.items()
            if getattr(entry.source, "value", entry.source) == own and entry.value is not None
        }

    def observe_topic(self, name: str) -> topics.ObservedTopic | None:
        found = self.describe_topic(name)
        if found is None:
            return None
        return topics.ObservedTopic(len(found[1]), self.topic_configs(name))

    def apply_topic(self, spec: topics.TopicSpec, todo: topics.Plan) -> topics.Plan:
        """Carry out ``todo``; what was done (a topic created meanwhile by another: planned
        again and altered instead)."""
        if todo.create:
            new = NewTopic(spec.name, spec.partitions, config=dict(spec.configs))
            (future,) = self.client.create_topics([new], request_timeout=self.timeout).values()
            try:
                self.wait(future, f"creating topic {spec.name}")
                return todo
            except AdminError as exc:
                if exc.code != "TOPIC_ALREADY_EXISTS":
                    raise
            todo = topics.plan(spec, self.observe_topic(spec.name))
            if todo.create:
                raise AdminError(f"creating topic {spec.name}: it exists, yet is not described")
        if todo.add_partitions_to is not None:
            grow = NewPartitions(spec.name, todo.add_partitions_to)
            (future,) = self.client.create_partitions([grow], request_timeout=self.timeout).values()
            self.wait(future, f"adding partitions to topic {spec.name}")
        if todo.set_configs or todo.delete_configs:
            entries = [
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in todo.set_configs.items()
            ] + [
                ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
                for k in todo.delete_configs
            ]
            resource = ConfigResource(ResourceType.TOPIC, spec.name, incremental_configs=entries)
            futures = self.client.incremental_alter_configs(
                [resource], request_timeout=self.timeout
            )
            self.wait_all(futures.values(), f"altering topic {spec.name}'s configs")
        return todo

    def described_after_change(self, name: str) -> tuple[str, list[tuple[int, int]]]:
        """The topic's description; right after its creation another broker may not know it
        yet, so it is asked again within the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            found = self.describe_topic(name)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                raise AdminError(f"topic {name} is not described after its creation")
            time.sleep(POLL_INTERVAL)

    def offsets(self, name: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """partition -> (log start offset, high watermark); -1 where the partition's leader
        answered with an error (no leader yet, say)."""
        if not partitions:
            return {}
        found = {p: [-1, -1] for p in partitions}
        for index, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
            futures = self.client.list_offsets(
                {TopicPartition(name, p): spec for p in partitions}, request_timeout=self.timeout
            )
            for tp, future in futures.items():
                try:
                    found[tp.partition][index] = int(self.wait(future, f"offsets of {name}").offset)
                except AdminError as exc:
                    if not broker_answered(exc):
                        raise
                    log.info("offsets not known", extra={"topic": name, "error": str(exc)})
        return {p: (start, end) for p, (start, end) in found.items()}

    # --- users -----------------------------------------------------------------------------

    def features(self) -> users.Features:
        cluster = self.wait(
            self.client.describe_cluster(request_timeout=self.timeout), "describing the cluster"
        )
        configs: dict[str, str] | None = None
        if cluster.nodes:
            resource = ConfigResource(ResourceType.BROKER, str(cluster.nodes[0].id))
            futures = self.client.describe_configs([resource], request_timeout=self.timeout)
            try:
                (entries,) = self.wait_all(futures.values(), "describing a broker's configs")
                configs = {
                    key: "" if entry.value is None else str(entry.value)
                    for key, entry in entries.items()
                }
            except AdminError as exc:
                if not broker_answered(exc):
                    raise
                # An admin without DescribeConfigs on the cluster: its own login tells SASL.
                log.warning("broker configs not readable", extra={"error": str(exc)})
        connected_with_sasl = self.conn.security_protocol.upper().startswith("SASL_")
        return users.features(configs, connected_with_sasl)

    def mechanisms(self, name: str) -> set[str]:
        """The SCRAM mechanisms ``name`` has a credential for."""
        futures = self.client.describe_user_scram_credentials([name], request_timeout=self.timeout)
        try:
            description = self.wait(futures[name], f"describing user {name}'s credentials")
        except AdminError as exc:
            if exc.code == "RESOURCE_NOT_FOUND":  # no credential at all
                return set()
            raise
        return {
            MECHANISM_NAMES[info.mechanism]
            for info in description.scram_credential_infos
            if info.mechanism in MECHANISM_NAMES
        }

    def alter_credentials(
        self, name: str, upsert: tuple[str, int, str] | None, delete: Iterable[str]
    ) -> None:
        """Store (mechanism, iterations, password) and delete the credentials of ``delete``,
        in one request (Kafka applies a user's changes all or none)."""
        alterations: list[Any] = [UserScramCredentialDeletion(name, MECHANISMS[m]) for m in delete]
        if upsert is not None:
            mechanism, iterations, password = upsert
            info = ScramCredentialInfo(MECHANISMS[mechanism], iterations)
            alterations.append(UserScramCredentialUpsertion(name, info, password.encode()))
        if alterations:
            futures = self.client.alter_user_scram_credentials(
                alterations, request_timeout=self.timeout
            )
            self.wait_all(futures.values(), f"storing user {name}'s credentials")

    def acls_of(self, principal: str) -> set[users.Acl]:
        # Without an authorizer librdkafka drops DescribeAcls' SECURITY_DISABLED: the listing
        # is then empty, and the first CreateAcls says it.
        found = self.wait(
            self.client.describe_acls(_principal_filter(principal), request_timeout=self.timeout),
            f"listing the ACLs of {principal}",
        )
        return {_as_acl(binding) for binding in found}

    def create_acls(self, principal: str, acls: Iterable[users.Acl]) -> None:
        bindings = [_binding(AclBinding, principal, acl) for acl in acls]
        if bindings:
            futures = self.client.create_acls(bindings, request_timeout=self.timeout)
            self.wait_all(futures.values(), f"creating ACLs of {principal}")

    def delete_acls(self, principal: str, acls: Iterable[users.Acl]) -> None:
        filters = [_binding(AclBindingFilter, principal, acl) for acl in acls]
        if filters:
            futures = self.client.delete_acls(filters, request_timeout=self.timeout)
            self.wait_all(futures.values(), f"deleting ACLs of {principal}")


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


def _binding(kind: type[Any], principal: str, acl: users.Acl) -> Any:
    """An AclBinding (to create) or an AclBindingFilter matching exactly that ACL."""
    resource_type, name, pattern, operation, host, permission = acl
    return kind(
        ResourceType[resource_type],
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


# --- the interface -------------------------------------------------------------------------


def _reconcile_topic(conn: Connection, spec: topics.TopicSpec) -> topics.TopicStatus:
    with _Session(conn) as session:
        done = session.apply_topic(spec, topics.plan(spec, session.observe_topic(spec.name)))
        topic_id, leaders = session.described_after_change(spec.name)
        offsets = session.offsets(spec.name, [p for p, _ in leaders])
        states = tuple(
            topics.PartitionState(p, leader, offsets[p][1], offsets[p][0]) for p, leader in leaders
        )
        return topics.status(spec, topic_id, states, done)


async def reconcile_topic(conn: Connection, spec: topics.TopicSpec) -> topics.TopicStatus:
    """Create or alter the topic as the spec says; its status as described afterwards."""
    return await asyncio.to_thread(_reconcile_topic, conn, spec)


def _delete_topic(conn: Connection, name: str) -> None:
    with _Session(conn) as session:
        (future,) = session.client.delete_topics([name], request_timeout=conn.timeout).values()
        try:
            session.wait(future, f"deleting topic {name}")
        except AdminError as exc:
            if exc.code != "UNKNOWN_TOPIC_OR_PART":
                raise


async def delete_topic(conn: Connection, name: str) -> None:
    """Delete the topic; one that does not exist is no error."""
    await asyncio.to_thread(_delete_topic, conn, name)


def _reconcile_user(
    conn: Connection, spec: users.UserSpec, password: str, previous_digest: str
) -> users.UserStatus:
    with _Session(conn) as session:
        found = session.features()
        if not found.sasl:
            return users.authentication_not_enabled(spec, found)
        authorizer = found.authorizer is not False  # unknown: try, SECURITY_DISABLED tells
        mechanisms = session.mechanisms(spec.name)
        observed = session.acls_of(spec.principal) if authorizer else set()
        todo = users.plan(spec, password, previous_digest, mechanisms, observed)
        upsert = (spec.mechanism, spec.iterations, password) if todo.upsert else None
        session.alter_credentials(spec.name, upsert, todo.delete_mechanisms)
        if authorizer:
            try:
                session.create_acls(spec.principal, todo.create_acls)
                session.delete_acls(spec.principal, todo.delete_acls)
            except AdminError as exc:
                if exc.code != "SECURITY_DISABLED":
                    raise
                authorizer = False
        return users.status(spec, todo, authorizer)


async def reconcile_user(
    conn: Connection, spec: users.UserSpec, password: str, previous_digest: str
) -> users.UserStatus:
    """Store the user's SCRAM credential when the password or mechanism changed (or it is
    missing), delete its other mechanisms' credentials, make its ACLs the spec's."""
    return await asyncio.to_thread(_reconcile_user, conn, spec, password, previous_digest)


def _delete_user(conn: Connection, name: str) -> None:
    with _Session(conn) as session:
        try:
            session.alter_credentials(name, None, sorted(session.mechanisms(name)))
        except AdminError as exc:
            if exc.code != "RESOURCE_NOT_FOUND":  # deleted meanwhile
                raise
        try:
            futures = session.client.delete_acls(
                [_principal_filter(f"User:{name}")], request_timeout=conn.timeout
            )
            session.wait_all(futures.values(), f"deleting the ACLs of User:{name}")
        except AdminError as exc:
            if exc.code != "SECURITY_DISABLED":
                raise


async def delete_user(conn: Connection, name: str) -> None:
    """Delete the user's SCRAM credentials and every ACL of principal User:<name>; a user
    that does not exist is no error."""
    await asyncio.to_thread(_delete_user, conn, name)


async def features(conn: Connection) -> users.Features:
    """Whether the cluster has a SASL listener and enforces ACLs."""

    def run() -> users.Features:
        with _Session(conn) as session:
            return session.features()

    return await asyncio.to_thread(run)
