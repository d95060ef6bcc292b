"""The operator's Kafka side (kafscale/operator/admin.py) against a real KafScale broker: topics
and users reconciled through confluent-kafka's admin client, checked with independent clients.

The broker is test_security.py's: a SASL_SSL listener (SCRAM, TLS from a test CA) with the
first admin user; with ``KAFSCALE_AUTHORIZER=acl`` and that admin a super user where ACLs are
needed. A broker with only a PLAINTEXT listener stands for a cluster without SASL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kafscale.kafka_admin import AdminError, Connection
from kafscale.operator import admin, topics, users

from .test_security import ADMIN, ADMIN_PASSWORD, Secure, start_secure

pytestmark = pytest.mark.integration

REFUSED = "_AUTHENTICATION"  # a login the broker refused


def connection(secure: Secure, password: str = ADMIN_PASSWORD, **kw: Any) -> Connection:
    return Connection(
        **{
            "bootstrap": secure.address(secure.sasl_ssl),
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "username": ADMIN,
            "password": password,
            "ca_pem": secure.pki.ca_file.read_bytes(),
            "timeout": 20.0,
            **kw,
        }
    )


def client_config(
    secure: Secure, user: str, password: str, mechanism: str = "SCRAM-SHA-512"
) -> dict[str, Any]:
    return {
        "bootstrap.servers": secure.address(secure.sasl_ssl),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.pki.ca_file),
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def checker(secure: Secure) -> Any:
    """An admin client of the test's own, to see what the operator's calls did."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(secure, ADMIN, ADMIN_PASSWORD))


def topic_spec(name: str, partitions: int, configs: dict[str, str]) -> topics.TopicSpec:
    return topics.parse_topic(
        {
            "metadata": {"name": name},
            "spec": {"cluster": "kc", "partitions": partitions, "configs": configs},
        }
    )


def user_spec(name: str, acls: list[dict[str, Any]], kind: str = "scram-sha-512") -> users.UserSpec:
    return users.parse_user(
        {
            "metadata": {"name": name},
            "spec": {
                "cluster": "kc",
                "authentication": {"type": kind},
                "authorization": {"acls": acls},
            },
        }
    )


def described(secure: Secure, topic: str) -> tuple[int, dict[str, str]] | None:
    """(partitions, the configs set on the topic) as the broker describes them, or None."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    client = checker(secure)  # DescribeTopics: a Metadata request that creates nothing
    try:
        found = client.describe_topics(TopicCollection([topic]))[topic].result(timeout=20)
    except KafkaException as exc:
        assert exc.args[0].name() == "UNKNOWN_TOPIC_OR_PART", exc
        return None
    (future,) = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    own = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    configs = {
        name: entry.value
        for name, entry in future.result(timeout=20).items()
        if getattr(entry.source, "value", entry.source) == own
    }
    return len(found.partitions), configs


def produce(
    secure: Secure,
    user: str,
    password: str,
    topic: str,
    partitions: dict[int, int],
    mechanism: str = "SCRAM-SHA-512",
) -> str | None:
    """Produce ``count`` records to each ``partition: count``; None when every record was
    acknowledged, else the first delivery error's name, or ``_AUTHENTICATION`` as soon as the
    login is refused (librdkafka would try again until the records time out)."""
    from confluent_kafka import KafkaError, Producer

    errors: list[str] = []

    def on_error(error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            errors.append(error.name())

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(error.name())

    producer = Producer(
        {
            **client_config(secure, user, password, mechanism),
            "message.timeout.ms": 15000,
            "retries": 0,
            "error_cb": on_error,
        }
    )
    for partition, count in partitions.items():
        for i in range(count):
            producer.produce(
                topic,
                f"record-{i}".encode(),
                partition=partition,
                on_delivery=on_delivery,
            )
    deadline = time.monotonic() + 30
    while len(producer) and not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors or not len(producer), f"{len(producer)} records neither delivered nor failed"
    return errors[0] if errors else None


def acls_of(secure: Secure, principal: str) -> set[users.Acl]:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    client = checker(secure)  # held: its futures need it alive
    listed = client.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            principal,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(timeout=20)
    return {
        (
            b.restype.name,
            b.name,
            b.resource_pattern_type.name,
            b.operation.name,
            b.host,
            b.permission_type.name,
        )
        for b in listed
    }


def credentials_of(secure: Secure, user: str) -> set[str]:
    """The SCRAM mechanisms ``user`` has a credential for, as the broker describes them."""
    from confluent_kafka import KafkaException

    client = checker(secure)  # held: its futures need it alive
    futures = client.describe_user_scram_credentials([user])
    try:
        description = futures[user].result(timeout=20)
    except KafkaException as exc:
        assert exc.args[0].name() == "RESOURCE_NOT_FOUND", exc
        return set()
    return {info.mechanism.name.replace("_", "-") for info in description.scram_credential_infos}


@pytest.fixture
def acl_broker(start_broker: Callable[..., Any], tmp_path: Path) -> Secure:
    return start_secure(
        start_broker, tmp_path, KAFSCALE_AUTHORIZER="acl", KAFSCALE_SUPER_USERS=f"User:{ADMIN}"
    )


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the operator's CA files go, to see that none is left behind."""
    directory = tmp_path / "operator-tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def test_a_topic_is_created_grown_reconfigured_and_deleted(
    acl_broker: Secure, private_tmp: Path
) -> None:
    secure = acl_broker
    conn = connection(secure)
    spec = topic_spec("orders", 3, {"retention.ms": "3600000", "max.message.bytes": "200000"})
    status = asyncio.run(admin.reconcile_topic(conn, spec))
    assert (status.ready, status.reason, status.topic_name) == (True, "Reconciled", "orders")
    assert [p.partition for p in status.partitions] == [0, 1, 2]
    assert all(p.leader >= 0 for p in status.partitions)
    assert [(p.high_watermark, p.log_start_offset) for p in status.partitions] == [(0, 0)] * 3
    topic_id = status.topic_id
    assert topic_id and status.to_dict()["topicId"] == topic_id
    assert described(secure, "orders") == (
        3,
        {"retention.ms": "3600000", "max.message.bytes": "200000"},
    )

    # Records produced show in the next status.
    assert produce(secure, ADMIN, ADMIN_PASSWORD, "orders", {0: 5, 2: 2}) is None
    status = asyncio.run(admin.reconcile_topic(conn, spec))
    assert [(p.high_watermark, p.log_start_offset) for p in status.partitions] == [
        (5, 0),
        (0, 0),
        (2, 0),
    ]
    assert status.to_dict()["partitions"][0] == {
        "partition": 0,
        "leader": status.partitions[0].leader,
        "highWatermark": 5,
        "logStartOffset": 0,
    }

    # Grown, one config changed, one added, one removed (back to the broker's default).
    spec = topic_spec("orders", 5, {"retention.ms": "7200000", "cleanup.policy": "delete"})
    status = asyncio.run(admin.reconcile_topic(conn, spec))
    assert status.ready and len(status.partitions) == 5 and status.topic_id == topic_id
    assert described(secure, "orders") == (
        5,
        {"retention.ms": "7200000", "cleanup.policy": "delete"},
    )
    assert status.partitions[0].high_watermark == 5  # the records are still there

    # Fewer partitions: refused in the status; the config change is still made.
    spec = topic_spec("orders", 2, {"retention.ms": "9000000", "cleanup.policy": "delete"})
    status = asyncio.run(admin.reconcile_topic(conn, spec))
    assert (status.ready, status.reason) == (False, "PartitionsDecreaseNotSupported")
    assert len(status.partitions) == 5
    assert described(secure, "orders") == (
        5,
        {"retention.ms": "9000000", "cleanup.policy": "delete"},
    )

    # A config the broker refuses: an AdminError naming the topic, not worth retrying as is.
    bad = topic_spec("orders", 5, {"retention.ms": "soon"})
    with pytest.raises(AdminError, match="altering topic orders's configs") as refused:
        asyncio.run(admin.reconcile_topic(conn, bad))
    assert refused.value.code == "INVALID_CONFIG" and not refused.value.retriable

    asyncio.run(admin.delete_topic(conn, "orders"))
    assert described(secure, "orders") is None
    asyncio.run(admin.delete_topic(conn, "orders"))  # absent: no error
    assert list(private_tmp.iterdir()) == []  # the CA files were removed


def test_a_user_authenticates_with_its_acls_changes_password_and_mechanism_and_is_deleted(
    acl_broker: Secure,
) -> None:
    secure = acl_broker
    conn = connection(secure)
    for name in ("payments", "secret"):
        assert asyncio.run(admin.reconcile_topic(conn, topic_spec(name, 1, {}))).ready
    spec = user_spec(
        "app",
        [
            {"resource": {"type": "topic", "name": "payments"}, "operations": ["Write"]},
            {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
            {
                "resource": {"type": "group", "name": "app-", "patternType": "prefix"},
                "operations": ["Read"],
                "host": "127.0.0.1",
            },
            {
                "resource": {"type": "transactionalId", "name": "app-tx"},
                "operations": ["Write"],
                "type": "deny",
            },
        ],
    )

    status = asyncio.run(admin.reconcile_user(conn, spec, "first-password", ""))
    assert (status.ready, status.reason, status.acls) == (True, "Reconciled", 4)
    assert status.credential_digest == users.credential_digest(
        "app", "SCRAM-SHA-512", 4096, "first-password"
    )
    assert "first-password" not in str(status.to_dict()) + status.message
    assert credentials_of(secure, "app") == {"SCRAM-SHA-512"}
    assert acls_of(secure, "User:app") == {
        ("TOPIC", "payments", "LITERAL", "WRITE", "*", "ALLOW"),
        ("BROKER", "kafka-cluster", "LITERAL", "IDEMPOTENT_WRITE", "*", "ALLOW"),
        ("GROUP", "app-", "PREFIXED", "READ", "127.0.0.1", "ALLOW"),
        ("TRANSACTIONAL_ID", "app-tx", "LITERAL", "WRITE", "*", "DENY"),
    }
    # What the broker describes is what the spec says: the next plan has nothing to do.
    todo = users.plan(
        spec,
        "first-password",
        status.credential_digest,
        credentials_of(secure, "app"),
        acls_of(secure, "User:app"),
    )
    assert (todo.upsert, todo.delete_mechanisms, todo.create_acls, todo.delete_acls) == (
        False,
        (),
        (),
        (),
    )
    assert produce(secure, "app", "first-password", "payments", {0: 3}) is None
    assert produce(secure, "app", "first-password", "secret", {0: 1}) == (
        "TOPIC_AUTHORIZATION_FAILED"
    )

    # The same password again: nothing to store, the status the same.
    again = asyncio.run(
        admin.reconcile_user(conn, spec, "first-password", status.credential_digest)
    )
    assert again == dataclasses.replace(status, message=again.message)
    assert "up to date" in again.message

    # A new password is stored; the old one is refused.
    status = asyncio.run(
        admin.reconcile_user(conn, spec, "second-password", status.credential_digest)
    )
    assert status.ready and status.credential_digest != again.credential_digest
    assert produce(secure, "app", "second-password", "payments", {0: 1}) is None
    assert produce(secure, "app", "first-password", "payments", {0: 1}) == REFUSED

    # SCRAM-SHA-256 instead, and the ACLs changed: read on every topic starting "pay".
    read_pay = {
        "resource": {"type": "topic", "name": "pay", "patternType": "prefix"},
        "operations": ["Read", "Write"],
    }
    spec = user_spec("app", [read_pay], kind="scram-sha-256")
    status = asyncio.run(
        admin.reconcile_user(conn, spec, "second-password", status.credential_digest)
    )
    assert (status.ready, status.mechanism, status.acls) == (True, "SCRAM-SHA-256", 2)
    assert credentials_of(secure, "app") == {"SCRAM-SHA-256"}
    assert acls_of(secure, "User:app") == {
        ("TOPIC", "pay", "PREFIXED", "READ", "*", "ALLOW"),
        ("TOPIC", "pay", "PREFIXED", "WRITE", "*", "ALLOW"),
    }
    assert produce(secure, "app", "second-password", "payments", {0: 1}, "SCRAM-SHA-256") is None
    assert produce(secure, "app", "second-password", "payments", {0: 1}) == REFUSED  # SHA-512

    # Deleted: no credential, no ACL, no login; deleting again is no error.
    asyncio.run(admin.delete_user(conn, "app"))
    assert credentials_of(secure, "app") == set()
    assert acls_of(secure, "User:app") == set()
    assert produce(secure, "app", "second-password", "payments", {0: 1}, "SCRAM-SHA-256") == REFUSED
    asyncio.run(admin.delete_user(conn, "app"))


def test_a_refused_login_or_an_untrusted_certificate_fails_at_once(
    acl_broker: Secure, private_tmp: Path
) -> None:
    secure = acl_broker
    spec = topic_spec("never", 1, {})
    with pytest.raises(AdminError) as refused:
        asyncio.run(admin.reconcile_topic(connection(secure, "not-the-password"), spec))
    assert refused.value.code == "_AUTHENTICATION" and refused.value.retriable
    assert "SASL authentication error" in str(refused.value)
    assert "not-the-password" not in str(refused.value)

    other_ca = connection(secure, ca_pem=secure.pki.other_ca_file.read_bytes())
    with pytest.raises(AdminError) as untrusted:
        asyncio.run(admin.reconcile_topic(other_ca, spec))
    assert untrusted.value.code == "_SSL"
    assert "certificate verify failed" in str(untrusted.value)
    assert described(secure, "never") is None
    assert list(private_tmp.iterdir()) == []  # the CA files were removed after the failures


def test_a_cluster_without_an_authorizer_gets_credentials_but_not_acls(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    secure = start_secure(start_broker, tmp_path)  # KAFSCALE_AUTHORIZER=none
    conn = connection(secure)
    found = asyncio.run(admin.features(conn))
    assert (found.sasl, found.authorizer) == (True, False)

    plain = user_spec("app", [])
    status = asyncio.run(admin.reconcile_user(conn, plain, "app-password", ""))
    assert (status.ready, status.reason) == (True, "Reconciled")

    spec = user_spec("app", [{"resource": {"type": "cluster"}, "operations": ["Describe"]}])
    status = asyncio.run(admin.reconcile_user(conn, spec, "app-password", status.credential_digest))
    assert (status.ready, status.reason, status.acls) == (False, "AuthorizationNotEnabled", 0)
    assert credentials_of(secure, "app") == {"SCRAM-SHA-512"}
    asyncio.run(admin.reconcile_topic(conn, topic_spec("open", 1, {})))
    assert produce(secure, "app", "app-password", "open", {0: 1}) is None

    asyncio.run(admin.delete_user(conn, "app"))  # no authorizer: only the credentials to go
    assert credentials_of(secure, "app") == set()


def test_a_cluster_without_sasl_says_authentication_is_not_enabled(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(ready=True)  # one PLAINTEXT listener
    conn = Connection(broker.bootstrap, "PLAINTEXT", None, None, None, None, 20.0)
    found = asyncio.run(admin.features(conn))
    assert (found.sasl, found.authorizer) == (False, False)
    assert found.listeners == "PLAINTEXT:PLAINTEXT"

    spec = user_spec("app", [{"resource": {"type": "topic", "name": "t"}, "operations": ["Read"]}])
    status = asyncio.run(admin.reconcile_user(conn, spec, "app-password", ""))
    assert (status.ready, status.reason) == (False, "AuthenticationNotEnabled")
    assert "no SASL listener" in status.message and status.credential_digest == ""

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # Nothing was stored for a login no listener asks for.
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = client.describe_user_scram_credentials(["app"])
    with pytest.raises(KafkaException) as missing:
        futures["app"].result(timeout=20)
    assert missing.value.args[0].name() == "RESOURCE_NOT_FOUND"

    # Topics work without SASL.
    status_topic = asyncio.run(admin.reconcile_topic(conn, topic_spec("plain", 2, {})))
    assert status_topic.ready and len(status_topic.partitions) == 2
